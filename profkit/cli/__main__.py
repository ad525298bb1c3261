"""``python -m profkit.cli`` (same as ``python -m profkit``)."""
from profkit.cli import main

main()
