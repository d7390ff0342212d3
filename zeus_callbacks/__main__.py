"""``python -m zeus_callbacks``: the ``zeus-callbacks`` command (as ``python -m zeus_callbacks.cli``)."""

from zeus_callbacks.cli._main import main

raise SystemExit(main())
