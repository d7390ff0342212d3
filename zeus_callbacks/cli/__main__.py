"""``python -m zeus_callbacks.cli``: the ``zeus-callbacks`` command."""

from zeus_callbacks.cli._main import main

raise SystemExit(main())
