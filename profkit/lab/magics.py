"""IPython integration: ``%load_ext profkit``.

Registers

- the cell magic ``%%profkit [options]`` — runs the SQL in the cell on a build's
  cluster under a collector and shows the result (see :data:`USAGE`);
- the line magic ``%profkit_stop [BUILD ...]`` — stops the clusters the magic
  started (all of them without arguments);
- the line magic ``%profkit_clusters`` — lists them;
- the line magic ``%profkit_export RUN --format pprof|speedscope|collapsed [-o FILE]`` —
  a run's stacks in a format other tools read (:func:`profkit.export.export_run`).

One cluster per build is started on first use and kept for the kernel's
session in :data:`REGISTRY`, so successive cells reuse loaded tables; all of
them are stopped by pid at kernel exit (atexit) or with ``%profkit_stop``.

The magic only parses its options and shows what it gets back: the work (clusters,
collectors, run directories) is :mod:`profkit.experiments.cell`'s.

Bad options, ``--help`` and library errors never kill the cell or the kernel:
argparse runs over ``shlex.split(line)`` with its exits turned into
exceptions, and a :class:`~profkit.errors.ProfkitError` is shown as a short
message (no traceback).
"""
from __future__ import annotations

import argparse
import atexit
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from profkit.errors import ProfkitError
from profkit.export import FORMATS, SUFFIXES, export_run
from profkit.export.source import load_source
from profkit.experiments.cell import (
    COLLECTORS,
    MODES,
    CellRequest,
    CellUsageError,
    ClusterRegistry,
    ClusterSession,
    statement,
)
from profkit.experiments.cell import run_cell as run_request

__all__ = ["REGISTRY", "USAGE", "CellRequest", "ClusterRegistry", "ClusterSession",
           "MagicUsageError", "load_ipython_extension", "make_parser", "parse_options",
           "run_cell", "statement", "unload_ipython_extension"]

#: Bad %%profkit options or a cell that cannot run as written; the message says what to do.
MagicUsageError = CellUsageError


class _HelpShown(Exception):
    """--help was given: the help text has been printed, nothing to run."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of calling sys.exit (a cell must survive)."""

    def error(self, message: str) -> NoReturn:
        raise MagicUsageError(f"{self.format_usage().strip()}\n%%profkit: error: {message} "
                              "(see %%profkit --help)")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if status:
            raise MagicUsageError((message or "").strip() or f"%%profkit: exit status {status}")
        raise _HelpShown()


_EPILOG = """\
The cell holds one SQL statement; a cell of SQL comments only (-- ...) runs the
--workload's query. --mode wraps the statement in EXPLAIN (ANALYZE, TIMING off/on).
One cluster per build is kept for the kernel session: %profkit_clusters lists
them, %profkit_stop [BUILD] stops them (they also stop when the kernel exits).

examples:
  %%profkit --workload nested_loop --scale 0.05
  -- the workload's query: returns its count

  %%profkit --build step3 --collector perf --mode analyze_timing --workload nested_loop
  -- a flamegraph of EXPLAIN ANALYZE (TIMING on) on the step3 build

  %%profkit --collector bpf --mode analyze_timing
  SELECT sum(i) FROM generate_series(1, 100000) i
"""


def make_parser() -> _Parser:
    p = _Parser(
        prog="%%profkit", add_help=True,
        description="Run the SQL in the cell on a PostgreSQL build's cluster under a collector.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="vanilla",
                   help="build preset (vanilla, gprof, step1..step3, coarse_clock, ...); "
                        "built on first use if not cached (default: vanilla)")
    p.add_argument("--collector", choices=COLLECTORS, default="none",
                   help="none: the query's rows; perf: a flamegraph; gprof: call counts "
                        "(needs a profiling build, e.g. --build gprof); ltrace: clock_gettime "
                        "calls; bpf: instrumentation calls per function and plan node; "
                        "callgrind: instructions, exact calls and the call arcs into "
                        "the Instr* functions (default: none)")
    p.add_argument("--mode", choices=MODES, default="plain",
                   help="plain: the SQL as is; analyze_notiming / analyze_timing: wrapped in "
                        "EXPLAIN (ANALYZE, TIMING off/on) (default: plain)")
    p.add_argument("--workload", default=None,
                   help="load a workload first (nested_loop, join_sum, count_star, or a "
                        "workload FILE.toml); reloaded only when the scale changes")
    p.add_argument("--query", default=None,
                   help="one of the workload file's named queries (default: its first)")
    p.add_argument("--scale", type=float, default=0.02,
                   help="workload scale (default: 0.02; the seed is 1.0)")
    p.add_argument("--reps", type=int, default=1, help="repetitions (perf, none)")
    p.add_argument("--top", type=int, default=15, help="rows shown for function tables")
    p.add_argument("--freq", type=int, default=999, help="perf sampling frequency (Hz)")
    return p


USAGE = make_parser().format_help()


# ---------------------------------------------------------------------------
# Clusters kept for the kernel session (profkit.experiments.cell.ClusterRegistry)

REGISTRY = ClusterRegistry()
atexit.register(lambda: REGISTRY.stop())


# ---------------------------------------------------------------------------
# Running a cell


def _split(line: str) -> list[str]:
    """A magic's line as words (shell quoting), or one usage error."""
    try:
        return shlex.split(line)
    except ValueError as e:
        raise MagicUsageError(f"cannot split the options ({e}): check the quotes") from None


def parse_options(line: str) -> CellRequest:
    """``%%profkit`` options → a CellRequest; raises MagicUsageError / _HelpShown."""
    ns = make_parser().parse_args(_split(line))
    if ns.reps < 1:
        raise MagicUsageError("--reps must be >= 1")
    if ns.top < 1:
        raise MagicUsageError("--top must be >= 1")
    if ns.query is not None:
        if ns.workload is None:
            raise MagicUsageError("--query picks a query of --workload FILE.toml: give both")
        ns.workload = f"{ns.workload}#{ns.query}"
    del ns.query
    return CellRequest(**vars(ns))


def run_cell(line: str, cell: str, registry: ClusterRegistry | None = None,
             say: Callable[[str], None] | None = None) -> Any:
    """Parse *line*, run *cell*, show the tables that come first and return the main one
    (raises on errors): a DataFrame (query rows, or a table of counts), or a
    :class:`~profkit.render.flamegraph.FlameGraph` for ``--collector perf``."""
    res = run_request(parse_options(line), cell, registry if registry is not None else REGISTRY,
                      say=say)
    (say or (lambda _m: None))(res.note)
    for table in res.also:
        _display(table)
    return res.shown


def _display(obj: Any) -> None:
    try:
        from IPython.display import display
    except ImportError:  # pragma: no cover
        return
    display(obj)


def _say(msg: str) -> None:
    # the cell's own output (stdout), not a progress line: it stays with the cell
    print(f"profkit: {msg}", flush=True)


def _error(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# The magics


def profkit_cell(line: str, cell: str) -> Any:
    try:
        return run_cell(line, cell, say=_say)
    except _HelpShown:
        return None
    except MagicUsageError as e:
        _error(str(e))
    except ProfkitError as e:
        _error(f"profkit: {type(e).__name__}: {e}")
    except Exception as e:
        import psycopg

        if not isinstance(e, psycopg.Error):
            raise  # a bug in profkit: let IPython show the traceback
        # the server's own message (relation does not exist, syntax error...)
        _error(f"profkit: PostgreSQL error: {str(e).strip()}")
    except KeyboardInterrupt:
        _error("profkit: interrupted; tracers were stopped, the clusters keep running "
               "(%profkit_stop stops them)")
    return None


profkit_cell.__doc__ = ("Run the SQL in the cell on a build's cluster under a collector.\n\n"
                        + USAGE)


def profkit_stop(line: str) -> None:
    """Stop the clusters %%profkit started: ``%profkit_stop`` (all) or ``%profkit_stop BUILD``."""
    try:
        stopped = REGISTRY.stop(shlex.split(line) or None)
    except (ProfkitError, ValueError) as e:
        _error(f"profkit: {e}")
        return
    _say(f"stopped {', '.join(stopped) or 'nothing (no clusters were running)'}")


def profkit_clusters(line: str) -> ClusterRegistry:
    """Show the clusters %%profkit keeps running."""
    return REGISTRY


class _ExportParser(_Parser):
    def error(self, message: str) -> NoReturn:
        raise MagicUsageError(f"{self.format_usage().strip()}\n%profkit_export: error: "
                              f"{message} (see %profkit_export --help)")


def make_export_parser() -> _ExportParser:

    p = _ExportParser(
        prog="%profkit_export", add_help=True,
        description="Export a run's stacks (a run directory, a run id under profiles/, "
                    "'latest', or a folded-stacks file) for pprof readers (Pyroscope, "
                    "Parca, go tool pprof), speedscope, or as collapsed stacks.")
    p.add_argument("run", help="run directory, run id under profiles/, latest, or a "
                               "folded-stacks file")
    p.add_argument("-f", "--format", dest="fmt", choices=FORMATS, required=True,
                   help="pprof (gzipped profile.proto), speedscope (JSON), collapsed")
    p.add_argument("-o", "--output", default=None,
                   help="file to write (default: RUN's name + the format's suffix, in the "
                        "current folder)")
    p.add_argument("--unit", default=None, help="what a folded file's counts are "
                                                "(default: samples)")
    p.add_argument("--freq", type=float, default=None,
                   help="sampling frequency (Hz) of a folded file's samples")
    p.add_argument("--binary", default=None, help="the profiled program's path")
    return p


def export_line(line: str) -> Path:
    """``%profkit_export`` options → the file written (raises on errors)."""
    ns = make_export_parser().parse_args(_split(line))
    if ns.freq is not None and not 0 < ns.freq < float("inf"):
        raise MagicUsageError(f"--freq must be a positive number of samples per second, "
                              f"got {ns.freq:g}")
    src = load_source(ns.run).require_stacks()
    data = export_run(src, ns.fmt, unit=ns.unit, freq_hz=ns.freq, binary=ns.binary)
    stem = Path(src.origin).name
    for suffix in (".gz", ".txt", ".folded"):
        stem = stem.removesuffix(suffix)
    out = Path(ns.output) if ns.output else Path(stem + SUFFIXES[ns.fmt])
    out.write_bytes(data)
    return out


def profkit_export(line: str) -> Path | None:
    """Export a run's stacks: ``%profkit_export RUN --format pprof|speedscope|collapsed
    [-o FILE]`` (RUN: a run directory, run id, ``latest`` or a folded file)."""
    try:
        out = export_line(line)
    except _HelpShown:
        return None
    except MagicUsageError as e:
        _error(str(e))
        return None
    except ProfkitError as e:
        _error(f"profkit: {type(e).__name__}: {e}")
        return None
    except OSError as e:
        _error(f"profkit: {e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}")
        return None
    _say(f"wrote {out} ({out.stat().st_size:,} bytes)")
    return out


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magic_function(profkit_cell, magic_kind="cell", magic_name="profkit")
    ipython.register_magic_function(profkit_stop, magic_kind="line", magic_name="profkit_stop")
    ipython.register_magic_function(profkit_clusters, magic_kind="line",
                                    magic_name="profkit_clusters")
    ipython.register_magic_function(profkit_export, magic_kind="line",
                                    magic_name="profkit_export")


def unload_ipython_extension(ipython: Any) -> None:
    REGISTRY.stop()
