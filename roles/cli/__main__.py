"""``python -m roles.cli``: the ``nodetaskd`` binary without its installed script."""

from roles.cli.main import main

raise SystemExit(main())
