"""Host cells: the GPU host's geometry and fingerprint, the host environment built from wheels (env, layer,
proc), preflight rules and the model store."""
