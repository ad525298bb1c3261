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


def parallel_workers(leader_pid: int) -> set[int]:
    """Pids of the parallel workers serving backend *leader_pid* now: processes whose
    command line is ``postgres: parallel worker for PID <leader_pid>``."""
    want = f"parallel worker for PID {int(leader_pid)}"
    out: set[int] = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if want.encode() in cmd:
            out.add(int(d.name))
    return out


class WorkerWatch:
    """Polls /proc every *interval* seconds (a thread) for the parallel workers of a
    backend while a query runs; ``pids`` holds every one seen. A worker that starts and
    exits between two polls is missed: the attribution says how many were seen."""

    def __init__(self, leader_pid: int, interval: float = 0.01) -> None:
        import threading

        self.leader_pid = int(leader_pid)
        self.interval = interval
        self.pids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="worker-watch", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.pids |= parallel_workers(self.leader_pid)
            self._stop.wait(self.interval)

    def __enter__(self) -> WorkerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
