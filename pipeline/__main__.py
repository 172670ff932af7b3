"""`python -m pipeline` stays the same as the `stackproof` console script (the CLI contract).

An entry point, not a layer: the one import from the floor up to the commands, and the import
contract in pyproject.toml names it as the only one allowed."""

from stackproof.cli import main

raise SystemExit(main())
