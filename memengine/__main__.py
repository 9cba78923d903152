"""``python -m memengine``: the same as the ``memengine`` command."""

from .cli import main

raise SystemExit(main())
