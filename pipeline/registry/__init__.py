"""Registry work: the OCI client and layout, publish and pull, attestations and the fleet view."""
