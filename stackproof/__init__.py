"""The commands: the CLI, the main job (build, verify, receipt) and the commands that are neither a
check nor a build step (doctor, soak, the kernel probe, the report). The top layer: it imports the
checks (verify/) and the floor (pipeline/); nothing imports it."""
