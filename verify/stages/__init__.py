"""The stages run against a built image or host environment (imports, startup, autotune, load), the runner that
orders them, the server they start and the receipt they write."""
