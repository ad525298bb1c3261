"""What every profkit command shares: turning library errors into messages."""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from profkit.errors import ProfkitError, StdoutFailed, os_error_message, silence_stdout
from profkit.progress import err_console, say

F = TypeVar("F", bound=Callable[..., Any])
__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_USAGE", "Failed", "Failure", "StdoutFailed",
           "emit_json", "err_console", "friendly", "json_option", "records", "say"]


#: Exit statuses (README "Exit status"): 0 success; 1 the work failed (a ProfkitError —
#: bad input file, build or cluster failure, SQL error — or an OS error such as a full
#: disk); 2 a usage error (click's own: unknown option, bad value; or a combination of
#: arguments the command refuses); 130 interrupted by Ctrl-C.
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class Failed(click.ClickException):
    """A usage mistake a command finds itself (``give either STACKS or --diff``): one
    line on stderr, exit status 2 like click's own usage errors."""

    exit_code = EXIT_USAGE

    def show(self, file: Any = None) -> None:
        click.echo(f"profkit: {self.message}", err=True)


class Failure(click.ClickException):
    """The work failed (a ProfkitError, an OS or SQL error): one line, exit status 1."""

    exit_code = EXIT_FAILURE

    def show(self, file: Any = None) -> None:
        click.echo(f"profkit: {self.message}", err=True)


def _sql_error(e: Exception) -> str | None:
    """One line for a psycopg error (``relation "missing_table" does not exist``), or
    None when *e* is not one. psycopg is imported only when it is already loaded."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(e, psycopg.Error):
        return None
    diag = getattr(e, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    state = getattr(e, "sqlstate", None)
    text = primary or (str(e).strip().splitlines() or [type(e).__name__])[0]
    return f"SQL error{f' {state}' if state else ''}: {text}"


def records(df: Any) -> list[dict[str, Any]]:
    """A DataFrame as JSON-ready records (NaN and NA become null)."""
    import json

    return json.loads(df.to_json(orient="records", date_format="iso", default_handler=str))


def json_option(f: F) -> F:
    """``--json``: print one JSON document on stdout instead of the tables."""
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON document on stdout instead of tables "
                             "(progress still goes to stderr).")(f)


def emit_json(doc: Any) -> None:
    """Print *doc* as strict JSON on stdout: DataFrames become records, NaN/inf null."""
    import json

    click.echo(json.dumps(_plain(doc), indent=1, default=str, allow_nan=False))


def _plain(o: Any) -> Any:
    import math

    if hasattr(o, "to_json") and hasattr(o, "columns"):
        return records(o)
    if isinstance(o, dict):
        return {str(k): _plain(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_plain(v) for v in o]
    if hasattr(o, "item") and not isinstance(o, str | bytes):  # numpy scalars
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


def friendly(f: F) -> F:
    """ProfkitError, OS and SQL errors → one readable line and exit 1; Ctrl-C → stop what
    we started, exit 130. Usage errors stay click's (exit 2)."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except ProfkitError as e:
            raise Failure(str(e)) from None
        except KeyboardInterrupt:
            from profkit.processes import stop_all

            stop_all()
            click.echo("profkit: interrupted; everything profkit started was stopped", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except OSError as e:
            if isinstance(e, StdoutFailed | BrokenPipeError) or e.filename is None:
                silence_stdout()  # else the flush at exit fails again, with a traceback
            raise Failure(os_error_message(e)) from None
        except Exception as e:
            sql = _sql_error(e)
            if sql is None:
                raise  # a bug in profkit: the traceback is what helps fixing it
            raise Failure(sql) from None

    return wrapper  # type: ignore[return-value]


def _min_kept(_ctx: Any, param: Any, text: str) -> int | str:
    """--min-kept: 'auto' or a whole number (checked against --reps by the experiment)."""
    if str(text).strip() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: give auto or a whole number >= 0",
                                 param=param) from None


def min_kept_option(cell: str) -> Callable[[F], F]:
    """--min-kept of the experiments that calibrate the vCPU (bench, correction, timing
    accuracy); *cell* names what they repeat."""
    return click.option(
        "--min-kept", default="auto", show_default=True, metavar="auto|N", callback=_min_kept,
        help=f"When the vCPU calibration rejects so many executions that a {cell} keeps "
             "fewer than N repetitions, run extra repetitions of every cell (at most --reps "
             "of them); auto: half of --reps, rounded up; 0: never.")
