"""``python -m opscope``: the `opscope` command (the console script's entry, app.cli:main)."""

import sys

from opscope.app.cli import main

sys.exit(main())
