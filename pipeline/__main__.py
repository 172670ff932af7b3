"""`python -m pipeline` is the same as the `stackproof` console script."""

from pipeline.cli import main

raise SystemExit(main())
