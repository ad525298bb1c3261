"""``perf stat``: whether this machine's counters count, and counting a backend's
instructions where they do (bare metal; most VMs have no hardware counters, and then
callgrind counts instead: :func:`instruction_counter` says which).

The one home of the question "does perf stat count EVENT here?" (:func:`counts`), asked
by :mod:`profkit.collect.perf` for its ``perf stat`` events and by the benchmark for its
instruction counts.
"""
from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

from profkit.errors import ProbeError, ProfkitError
from profkit.parse.perf_stat import parse_perf_stat
from profkit.processes import Background, run, which


def _read(path: str | os.PathLike[str]) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return ""


@functools.cache
def counts(event: str = "instructions:u", perf: str = "perf") -> bool:
    """True when ``perf stat -e EVENT`` counts on this machine (False in most VMs): the
    one place profkit asks.

    Runs ``perf stat -x, -e EVENT true`` and looks for ``<not supported>``; False too
    when perf is missing or not permitted (perf_event_paranoid).
    """
    try:
        exe = which(perf)
        cp = run([exe, "stat", "-x,", "-e", event, "true"], timeout=30, check=False,
                 what="perf stat")
    except ProfkitError:
        return False
    if cp.returncode != 0:
        return False
    try:
        value, _unit = parse_perf_stat_csv(cp.stderr, event)
    except ProbeError:
        return False
    return value > 0


def parse_perf_stat_csv(text: str, event: str) -> tuple[float, str]:
    """Value and unit of *event* in ``perf stat -x,`` output (via profkit.parse.perf_stat).

    Producer: ``perf stat -x, -e instructions:u -p PID`` (stderr or ``-o FILE``).
    Example::

        4153264,,instructions:u,1095204,100.00,,
        -> (4153264.0, "")

    ``<not supported>`` / ``<not counted>`` raise :class:`ProbeError` saying to use
    callgrind.
    """
    try:
        df = parse_perf_stat(text.splitlines())
    except ProfkitError as e:
        raise ProbeError(f"cannot read perf stat output: {e}") from None
    rows = df[df["event"] == event]
    if rows.empty:
        raise ProbeError(f"perf stat output has no line for event {event!r}:\n{text[:500]}")
    row = rows.iloc[0]
    if not bool(row["supported"]):
        raise ProbeError(
            f"perf stat cannot count {event!r} here (<not supported>): no hardware performance "
            "counters (typical in a VM). Count instructions with callgrind instead "
            "(profkit.collect.callgrind.collect_callgrind)."
        )
    return float(row["value"]), str(row["unit"])


def perf_stat_instructions(
    backend_pid: int,
    execute: Callable[[], object],
    *,
    out_path: str | os.PathLike[str],
    event: str = "instructions:u",
    settle_s: float = 0.3,
) -> float:
    """Count *event* in backend *backend_pid* while *execute()* runs one query.

    ``perf stat -x, -e EVENT -p PID -o OUT_PATH`` is started in the background, given
    *settle_s* to attach, *execute* is called (e.g. ``lambda: conn.execute(sql)``),
    then perf is stopped with SIGINT by pid and its CSV parsed. The count includes the
    backend's protocol handling of the statement, nothing else (the backend is idle
    otherwise). On this VM ``instructions`` is not supported: a software event such as
    ``task-clock`` exercises the same path.
    """
    perf = which("perf")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    bg = Background([perf, "stat", "-x,", "-e", event, "-p", str(backend_pid), "-o", str(out)],
                    what="perf stat")
    bg.start()
    try:
        time.sleep(settle_s)
        if not bg.alive():
            raise ProbeError(f"perf stat exited at once (pid {backend_pid} gone? permissions?); "
                             f"output: {_read(out)[:300]}")
        execute()
    finally:
        bg.stop(timeout=10)
    value, _unit = parse_perf_stat_csv(_read(out), event)
    return value


def instruction_counter() -> str:
    """``"perf_stat"`` where hardware instruction counters work, else ``"callgrind"``."""
    return "perf_stat" if counts() else "callgrind"
