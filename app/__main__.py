"""``python -m opscope.app`` opens the OpScope window (window options only; `opscope` is the whole
command). The process exits with the window's code."""

import sys

from opscope.app.main import main

sys.exit(main())
