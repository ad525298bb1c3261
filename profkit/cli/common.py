"""What every profkit command shares: turning library errors into messages."""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from profkit.errors import ProfkitError
from profkit.progress import err_console, say

F = TypeVar("F", bound=Callable[..., Any])
__all__ = ["Failed", "err_console", "friendly", "say"]


class Failed(click.ClickException):
    """A ProfkitError as click sees it: one line on stderr, exit status 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"profkit: {self.message}", err=True)


def friendly(f: F) -> F:
    """ProfkitError → one readable line and exit 2; Ctrl-C → stop what we started, exit 130."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except ProfkitError as e:
            raise Failed(str(e)) from None
        except KeyboardInterrupt:
            from profkit.run import stop_all

            stop_all()
            click.echo("profkit: interrupted; everything profkit started was stopped", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


