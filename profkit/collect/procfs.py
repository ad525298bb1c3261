"""Reading a process's scheduler accounting from /proc (Linux)."""
from __future__ import annotations

from pathlib import Path


def schedstat(pid: int) -> tuple[int, int] | None:
    """(ns on a CPU, ns waiting on a run queue) of *pid* from /proc/PID/schedstat.

    Input:  ``369829 10242118 1`` (sum_exec_runtime, run_delay, timeslices)
    Output: ``(369829, 10242118)``; None when the process or the file is gone
    (no CONFIG_SCHED_INFO).  CPU time does not grow while the process waits for
    a core other processes hold, which is what makes wall times on a shared
    2-core machine swing by tens of percent.
    """
    try:
        f = Path(f"/proc/{pid}/schedstat").read_text().split()
        return int(f[0]), int(f[1])
    except (OSError, IndexError, ValueError):
        return None
