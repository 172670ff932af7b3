"""The checks: the stages run against a built image (imports, startup, autotune, load), the server
they start, the load test, the log rules and signatures, and the judges. Below the commands
(stackproof/), above the floor (pipeline/); it builds no docker command line itself."""
