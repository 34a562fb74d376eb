"""``python -m assetq``: the same command line as the ``assetq`` console script."""

from .cli import main

raise SystemExit(main())
