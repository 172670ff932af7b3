"""The load test: the workload, the client run against a server, progress, the watchdog, statistics and the
correctness judges (determinism, degeneration, canaries, compare). Never reaches docker or the runtime."""
