"""``python -m profkit``: the command line."""
from profkit.cli import main

main()
