"""``python -m memengine.cli``: the same as the ``memengine`` console script."""

from . import main

raise SystemExit(main())
