"""Count library calls (clock_gettime) a backend makes while it runs one query, with ltrace.

observer-effect.txt's method, made routine::

    ltrace -p PID -c -e clock_gettime -o summary.txt   # attach
    ... run the query on the backend's connection ...
    kill -INT <ltrace>                                # detach; ltrace writes the summary

ltrace prints nothing until it detaches, so attachment is detected from
``/proc/PID/status`` (``TracerPid`` becomes ltrace's pid), followed by a short
settle time while ltrace plants its breakpoints.  ltrace is always stopped with
SIGINT, which makes it remove its breakpoints and detach; it is never
SIGKILLed while attached unless it ignores SIGINT for ``stop_timeout`` seconds
(a killed ltrace leaves int3 breakpoints in the backend, which then dies of
SIGTRAP at the next call).

What ltrace sees (checked on this machine, PostgreSQL 18 built by profkit):

- calls through the main binary's PLT: ``clock_gettime`` from
  ``INSTR_TIME_SET_CURRENT`` in postgres itself.  This works on BIND_NOW
  binaries too (Debian's, and profkit's builds);
- not calls made from ``dlopen()``-ed extension modules (pg_stat_statements.so
  reads the clock twice around each utility statement: ltrace counts 2 fewer
  per EXPLAIN than a libc uprobe; ``-e clock_gettime@*`` does not help);
- not the vDSO's internal work: clock_gettime's own cost is invisible;
- functions of the main binary itself (``-x InstrStartNode``: ``-e`` only
  selects PLT calls), via breakpoints on their entry — at ~100 µs per call.

Raw artifact: the summary text (``ltrace.txt`` in *out_dir*); parse it with
:func:`profkit.parse.ltrace.parse_ltrace_summary`.
"""
from __future__ import annotations

import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profkit.collect.bpf import PartialProbe, backend_info, is_connection_lost, sigterm_raises
from profkit.errors import ProbeError
from profkit.processes import Background, format_argv, which
from profkit.parse._io import read_text

QueryRunner = Callable[[], Any]


@dataclass(frozen=True)
class LtraceRun:
    """One ltrace attachment around one query (the summary is the raw artifact)."""

    pid: int
    argv: tuple[str, ...]
    summary_path: Path
    summary_text: str
    query_ms: float
    attach_s: float
    returncode: int | None
    stderr: str


def tracer_pid(pid: int) -> int:
    """TracerPid from /proc/PID/status (0 when nothing is ptrace-attached)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return -1
    for line in status.splitlines():
        if line.startswith("TracerPid:"):
            return int(line.split()[1])
    return 0


def filter_expr(functions: Sequence[str]) -> str:
    """ltrace's -e expression for *functions* ("a+b+c": calls from the main binary)."""
    if not functions:
        raise ProbeError("give at least one function to count")
    bad = [f for f in functions if not f.replace("_", "").isalnum()]
    if bad:
        raise ProbeError(f"not plain function names: {bad}")
    return "+".join(functions)


@dataclass
class _Outcome:
    returncode: int | None = None
    query_error: BaseException | None = None
    attach_s: float = float("nan")
    t0: float = 0.0
    t1: float = 0.0


def _traced(bg: Background, pid: int, runner: QueryRunner, t_attach: float,
            attach_timeout: float, settle_s: float, err: Path) -> _Outcome:
    """Start ltrace, wait for the attach, run the query, stop ltrace (always, by SIGINT)."""
    out = _Outcome()
    bg.start()
    try:
        deadline = t_attach + attach_timeout
        while tracer_pid(pid) != bg.pid:
            if not bg.alive():
                raise ProbeError(f"ltrace exited before attaching to {pid}: "
                                 f"{err.read_text(errors='replace')[-1500:]}")
            if tracer_pid(pid) < 0:
                raise ProbeError(f"backend {pid} exited before ltrace attached")
            if time.monotonic() > deadline:
                raise ProbeError(f"ltrace did not attach to {pid} within {attach_timeout:.0f} s "
                                 "(check /proc/sys/kernel/yama/ptrace_scope)")
            time.sleep(0.01)
        out.attach_s = time.monotonic() - t_attach
        # TracerPid is set at PTRACE_ATTACH; breakpoints go in right after.
        time.sleep(settle_s)
        out.t0 = time.perf_counter()
        try:
            runner()
        except Exception as e:  # noqa: BLE001 - keep the summary, report below
            out.query_error = e
        out.t1 = time.perf_counter()
    finally:
        out.returncode = bg.stop()
    return out


def count_calls(conn: Any, sql: str | None = None, *, pid: int | None = None,
                runner: QueryRunner | None = None,
                functions: Sequence[str] = ("clock_gettime",),
                entry_points: Sequence[str] = (),
                out_dir: str | Path | None = None, attach_timeout: float = 15.0,
                settle_s: float = 0.3, stop_timeout: float = 300.0) -> LtraceRun:
    """Attach ltrace -c to the backend of *conn*, run *sql*, detach, return the summary.

    *functions* are library calls made through the main binary's PLT (``-e``,
    e.g. clock_gettime); *entry_points* are functions of the binary itself
    (``-x``, e.g. InstrStartNode), caught by a breakpoint on their entry.

    Raises ProbeError if *pid* is not a postgres backend or ltrace cannot
    attach (another tracer, ptrace_scope); :class:`PartialProbe` (with
    ``partial`` = the LtraceRun) when the query fails or the backend exits
    while traced — ltrace still writes what it counted.
    """
    if runner is None:
        if sql is None:
            raise ProbeError("give the SQL to run (sql=...) or a runner callable")

        def runner() -> Any:
            cur = conn.execute(sql)
            try:
                return cur.fetchall()
            except Exception:  # noqa: BLE001 - statements without rows
                return None
    if pid is None:
        pid = int(conn.info.backend_pid)
    elif conn is not None and int(conn.info.backend_pid) != int(pid):
        raise ProbeError(f"pid {pid} is not the backend of this connection "
                         f"({conn.info.backend_pid})")
    backend_info(pid)
    existing = tracer_pid(pid)
    if existing > 0:
        raise ProbeError(f"backend {pid} is already traced by pid {existing} "
                         "(another ltrace/gdb/strace?): stop that first")
    exe = which("ltrace")
    work = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="profkit-ltrace-"))
    work.mkdir(parents=True, exist_ok=True)
    summary = work / "ltrace.txt"
    err = work / "ltrace.stderr"
    summary.write_text("")
    argv = [exe, "-p", str(pid), "-c"]
    if functions:
        argv += ["-e", filter_expr(functions)]
    else:
        argv += ["-L"]  # no default "@MAIN" library calls
    if entry_points:
        argv += ["-x", filter_expr(entry_points)]
    if not functions and not entry_points:
        raise ProbeError("give library functions (functions=) or entry points (entry_points=)")
    argv += ["-o", str(summary)]
    (work / "ltrace.argv").write_text(format_argv(argv) + "\n")
    bg = Background(argv, stdout_path=err, stderr_path=err, stop_signal=signal.SIGINT,
                    stop_timeout=stop_timeout, what="ltrace")
    t_attach = time.monotonic()
    with sigterm_raises():
        rc = _traced(bg, pid, runner, t_attach, attach_timeout, settle_s, err)
    query_error, attach_s, t0, t1 = rc.query_error, rc.attach_s, rc.t0, rc.t1
    run = LtraceRun(pid=pid, argv=tuple(argv), summary_path=summary,
                    summary_text=read_text(summary),
                    query_ms=(t1 - t0) * 1000, attach_s=attach_s, returncode=rc.returncode,
                    stderr=err.read_text(errors="replace"))
    if query_error is not None:
        # the client can read "terminating connection" before the backend has left
        # /proc: the error itself says the backend is gone
        gone = is_connection_lost(query_error) or tracer_pid(pid) < 0
        what = f"backend {pid} exited" if gone else "the query failed"
        if run.summary_text.strip():
            kept = "the summary so far is in .partial"
        else:
            # ltrace 0.7.3, when its tracee dies, sometimes fails removing its
            # breakpoints ("disable_breakpoint ... No such process") and exits
            # without a summary: the counts are lost inside ltrace.
            kept = (f"ltrace printed no summary (it loses its counts when the traced process "
                    f"dies); its messages are in {err}")
        raise PartialProbe(f"{what} while ltrace was attached ({query_error}); {kept}", run)
    return run
