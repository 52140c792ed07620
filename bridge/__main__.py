"""``python -m bridge`` is the ``fencebridge`` command."""

from bridge.cli import main

raise SystemExit(main())
