"""One way to tell the user what is happening: :func:`say` for a line, :class:`Progress`
for a bar (filled in below as the experiments move onto it).

Lines go to stderr through rich, so a command's stdout stays its result.
"""
from __future__ import annotations

from rich.console import Console

err_console = Console(stderr=True)


def say(msg: str) -> None:
    """One status line on stderr (``• msg``)."""
    err_console.print(f"[cyan]•[/] {msg}", highlight=False)
