"""``python -m zeus_callbacks.cli``: the ``zeus-callbacks`` command."""

from zeus_callbacks.cli.main import main

raise SystemExit(main())
