"""Exceptions.  Library code raises these; only the CLI turns them into exit codes.

Also the words for an OS error and a failed write to standard output, shared by the
click commands (:mod:`profkit.cli.common`) and the click-free fast path of
``profkit parse perf-script`` (:mod:`profkit.stackcollapse`).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping


class ProfkitError(Exception):
    """Base class: the message says what went wrong and what to do."""


class ToolNotFound(ProfkitError):
    pass


class CommandFailed(ProfkitError):
    def __init__(self, message: str, argv: list[str] | None = None, returncode: int | None = None,
                 output_tail: str = ""):
        super().__init__(message)
        self.argv = argv or []
        self.returncode = returncode
        self.output_tail = output_tail


class BuildError(ProfkitError):
    def __init__(self, message: str, step: str = "", log_path: str | None = None):
        super().__init__(message)
        self.step = step
        self.log_path = log_path


class PatchError(BuildError):
    pass


class ClusterError(ProfkitError):
    pass


class ParseError(ProfkitError):
    pass


class NoStackCounts(ParseError):
    """Input that holds no stack with a count above 0: an empty or foreign file, a
    truncated recording.  flamegraph.pl refuses it too ("No stack counts found")."""

    def __init__(self, where: str, nothing_to: str) -> None:
        super().__init__(f"{where}: no stack counts found (no line 'frame;frame COUNT' with a "
                         "count above 0, no perf script sample with a stack): nothing to "
                         f"{nothing_to}; is it the right file?")

    @classmethod
    def unless_any(cls, counts: Mapping[str, float], where: str, nothing_to: str) -> None:
        """Raise unless some stack of *counts* has a count above 0."""
        if not any(v > 0 for v in counts.values()):
            raise cls(where, nothing_to)


class ProbeError(ProfkitError):
    pass


class ComparisonError(ProfkitError):
    pass


class StdoutFailed(OSError):
    """A write to standard output failed (``> /dev/full``, a closed pipe)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))


def os_error_message(e: OSError) -> str:
    """One line for an OS error: the file and what happened, or that stdout failed."""
    what = e.strerror or str(e)
    if isinstance(e, StdoutFailed | BrokenPipeError):
        return f"cannot write to standard output: {what}"
    if e.filename is not None:
        return f"{e.filename}: {what}"
    return what


def silence_stdout() -> None:
    """After a failed write to stdout (a full disk, a closed pipe) the interpreter's own
    flush at exit would fail again with a second message: point stdout at /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
