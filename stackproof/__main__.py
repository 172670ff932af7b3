"""`python -m stackproof` is the same as the `stackproof` console script."""

from stackproof.cli import main

raise SystemExit(main())
