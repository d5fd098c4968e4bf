"""``python -m app`` opens the OpScope window."""
from opscope.app.main import main

main()
