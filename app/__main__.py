"""``python -m app`` opens the OpScope window."""
from app.main import main

main()
