"""Count the instructions a PostgreSQL backend executes for ONE execution of a query.

This VM has no hardware performance counters, so the stable measure reviewers prefer
(seeds/specialize-indexonlyscan-thread.txt: "I'd rather go by the instruction counts,
those are stable") comes from valgrind's callgrind. Where ``perf stat -e instructions``
works (bare metal), :mod:`profkit.collect.perf_stat` counts the real CPU's instructions
instead and says which counter to use; the runner records it.

How (callgrind)
---------------
The queries run in PostgreSQL's single-user mode (``postgres --single -j -D DATADIR
DBNAME``, statements on stdin) under ::

    valgrind --tool=callgrind --toggle-collect=exec_simple_query
             --dump-after=exec_simple_query --collect-atstart=no ...

- **Scope** ``exec_simple_query``: collection is on only inside it, i.e. parse,
  analysis, planning, executor start/run/end, result output and commit of each
  statement; backend start-up, recovery and shutdown checkpoint are not counted.
  ``PortalRun`` would be wrong: a plain SELECT is planned *before* PortalRun
  (pg_plan_queries in exec_simple_query) but EXPLAIN plans *inside* it, so the modes
  would not cover the same work. Planning is identical in all modes, so it adds the
  same ~0.5 M instructions to every mode (lowering the overhead % a little), while
  EXPLAIN's own work outside the executor (ExplainPrintPlan, ~0.15 M) raises it a
  little. The executor-only count (inclusive cost of ``standard_ExecutorRun``) comes
  from the same profile (parser: ``executor_instructions``). Measured on vanilla 18.6,
  nested_loop, TIMING off: 26.17 % whole vs 26.11 % executor-only at scale 0.01,
  26.31 / 26.30 at 0.02, 26.41 / 26.41 at 0.05 — the scope matters only at tiny scales.
- **One execution each**: ``--dump-after`` writes one profile per statement
  (``callgrind.out.1``, ``.2``, ...). A warm-up statement (by default the workload's
  plain query) runs first and is not counted, so catalog caches, shared buffers
  and hint bits are as warm as in the timed benchmark.
- **The warm-up runs uninstrumented.** valgrind starts with ``--instr-atstart=no``:
  start-up and the warm-up run at valgrind's plain speed, not callgrind's. When the
  backend has finished the warm-up and waits on stdin (``/proc/PID/syscall``: a read
  of fd 0, the pipe empty), ``vgdb ... instrumentation on`` switches callgrind's
  instrumentation on, and only then are the counted statements written. The program
  does the same work either way. Measured on step5 (18.6, GCC), each session on a
  freshly loaded cluster as in the headline tests: the nine counts of the three seed
  workloads lay at most 0.0009 % from the instrumented sessions' (784 of count_star's
  89 M with TIMING off; nested_loop's plain query 1,419 of 355 M), and a session took
  0.84-0.92 of the time (``benchmarks/callgrind_warmup.py``, its output in
  ``benchmarks/results/callgrind_warmup.txt``). Where vgdb cannot reach the process
  (no ptrace), or on a CPU whose read syscall number is not known here, the whole
  session runs instrumented as before (``CallgrindSession.warmup_instrumented``).
- Single-user mode needs the data directory to itself: :func:`collect_callgrind`
  takes the data directory of a *stopped* cluster; :func:`collect_callgrind_cluster`
  stops a running :class:`~profkit.pg.cluster.Cluster`, runs, and starts it again
  (connections to it must be reopened afterwards).
- postgres refuses to run as root: valgrind runs as the cluster's OS user.

Under valgrind ``clock_gettime`` is a real system call whose kernel work is not
counted, so callgrind **understates** what TIMING costs (MACHINE.md): report the
TIMING-on instruction overhead next to the wall-clock one, never alone.

This module only runs the tool and writes raw artifacts plus ``callgrind-session.json``;
:mod:`profkit.parse.callgrind` (``instr_counts_from_session``) turns them into the
``instr_counts`` table.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profkit import paths
from profkit.errors import ClusterError, CommandFailed, ProbeError, ToolNotFound
from profkit.processes import Background, OSUser, format_argv, run, which

if TYPE_CHECKING:  # the cluster module needs psycopg; only its type is used here
    from profkit.pg.cluster import Cluster

log = logging.getLogger(__name__)

DEFAULT_TOGGLE = "exec_simple_query"
SESSION_FILE = "callgrind-session.json"
WARMUP = "_warmup"

# Same planner conditions as the benchmark cluster (profkit.pg.cluster.BENCH_SETTINGS);
# single-user mode reads postgresql.conf too, these only make a bare datadir match.
DEFAULT_SETTINGS: dict[str, str] = {"max_parallel_workers_per_gather": "0", "jit": "off"}


class CallgrindError(ProbeError):
    """callgrind could not count instructions; the message says why and what to do."""


@dataclass(frozen=True)
class CallgrindQuery:
    """One measured statement of a session and its raw profile."""

    mode: str
    sql: str
    out_file: str  # path of its callgrind.out dump
    seconds: float  # wall time of this statement under callgrind (from the dump times)


@dataclass(frozen=True)
class CallgrindSession:
    """What one valgrind run wrote: one profile per measured query, plus metadata."""

    out_dir: str
    toggle: str
    argv: list[str]
    valgrind_version: str
    postgres: str
    datadir: str
    dbname: str
    warmup_sql: str | None
    queries: list[CallgrindQuery]
    elapsed_s: float  # whole valgrind run (start-up, warm-up, queries, shutdown)
    started_at: str
    stdout_path: str
    valgrind_log: str
    settings: dict[str, str] = field(default_factory=dict)
    tool: str = "callgrind"
    # False: valgrind ran start-up and the warm-up uninstrumented and switched
    # callgrind's instrumentation on (vgdb) before the counted statements
    warmup_instrumented: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CallgrindSession:
        """Read a session back from its directory or its ``callgrind-session.json``."""
        p = Path(path)
        if p.is_dir():
            p = p / SESSION_FILE
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise CallgrindError(f"no callgrind session at {p}: run collect_callgrind first") \
                from None
        data["queries"] = [CallgrindQuery(**q) for q in data["queries"]]
        return cls(**data)

    def provenance(self) -> dict[str, Any]:
        return {
            "instruction_counter": "callgrind", "valgrind": self.valgrind_version,
            "scope": self.toggle, "warmup": self.warmup_sql is not None,
            "warmup_instrumented": self.warmup_instrumented,
            "command": format_argv(self.argv), "single_user": True,
        }


def _sql_statement(sql: str) -> str:
    """One statement in ``postgres --single -j`` input: ends with ';' and an empty line.

    With -j a semicolon followed by an empty line ends a statement, so blank lines
    inside the query are squeezed out (they are insignificant in SQL).
    """
    body = "\n".join(ln for ln in sql.strip().splitlines() if ln.strip())
    body = body.rstrip().rstrip(";").rstrip()
    if not body:
        raise CallgrindError("empty SQL statement given to count instructions of")
    return body + ";\n\n"


def _valgrind_version(valgrind: str) -> str:
    return run([valgrind, "--version"], timeout=30, what="valgrind").stdout.strip()


def _postmaster_running(datadir: Path) -> int | None:
    """Pid of a live postmaster using *datadir*, else None (a stale pid file is fine)."""
    pidfile = datadir / "postmaster.pid"
    try:
        first = pidfile.read_text().splitlines()[0]
        pid = int(first.strip())
    except (FileNotFoundError, IndexError, ValueError):
        return None
    except PermissionError:
        return -1
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def collect_callgrind(
    *,
    postgres: str | os.PathLike[str],
    datadir: str | os.PathLike[str],
    os_user: OSUser,
    queries: Mapping[str, str],
    out_dir: str | os.PathLike[str],
    dbname: str = "postgres",
    warmup_sql: str | None = "",
    toggle: str = DEFAULT_TOGGLE,
    settings: Mapping[str, str] | None = None,
    timeout: float = 1800,
    instrument_warmup: bool = False,
) -> CallgrindSession:
    """Run *queries* (mode -> SQL) once each in a single-user backend under callgrind.

    *postgres* is the server binary (``build.postgres``); *datadir* must belong to a
    stopped cluster. *warmup_sql* runs first and is not counted: ``""`` (default) means
    "the first query of *queries*", ``None`` means no warm-up. Raw profiles, the
    backend's output and valgrind's log go to *out_dir*; the returned session (also
    written as ``callgrind-session.json`` there) says which file is which query.
    Start-up and the warm-up run uninstrumented (module docstring);
    *instrument_warmup* instruments the whole session, as valgrind does by default.

    Raises :class:`CallgrindError` when the datadir is in use, a statement fails, or
    callgrind wrote fewer profiles than statements.
    """
    if not queries:
        raise CallgrindError("no queries given: pass a mapping like wl.queries")
    datadir = Path(datadir)
    out = Path(out_dir)
    postgres = Path(postgres)
    if not postgres.exists():
        raise CallgrindError(f"postgres binary {postgres} does not exist; build it first "
                             "(profkit build NAME)")
    if not (datadir / "PG_VERSION").exists():
        raise CallgrindError(f"{datadir} is not a PostgreSQL data directory (no PG_VERSION)")
    pid = _postmaster_running(datadir)
    if pid is not None:
        raise ClusterError(
            f"data directory {datadir} is in use by a running postmaster (pid {pid}); "
            "single-user mode needs it to itself: stop the cluster first, or pass the "
            "Cluster to collect_callgrind_cluster(), which stops and restarts it"
        )
    valgrind = which("valgrind")
    version = _valgrind_version(valgrind)
    out.mkdir(parents=True, exist_ok=True)

    stmts: list[tuple[str, str]] = []  # (mode, sql) in execution order
    if warmup_sql is not None:
        stmts.append((WARMUP, warmup_sql or next(iter(queries.values()))))
    stmts.extend(queries.items())
    stdin = "".join(_sql_statement(sql) for _, sql in stmts)

    sets = {**DEFAULT_SETTINGS, **(settings or {})}
    # valgrind runs as the unprivileged user: it writes into a private scratch
    # directory the user owns; results are moved into *out_dir* afterwards.
    scratch = paths.scratch_for_another_user("profkit-callgrind-")
    try:
        if os.geteuid() == 0:
            os.chown(scratch, os_user.uid, os_user.gid)
        base = scratch / "callgrind.out"
        head = [valgrind, "--tool=callgrind", f"--callgrind-out-file={base}",
                f"--toggle-collect={toggle}", f"--dump-after={toggle}", "--collect-atstart=no",
                f"--log-file={scratch / 'valgrind.log'}"]
        tail = [str(postgres), "--single", "-j", "-D", str(datadir)]
        for k, v in sets.items():
            tail += ["-c", f"{k}={v}"]
        tail.append(dbname)
        started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        t0 = time.time()
        ran = None
        if warmup_sql is not None and not instrument_warmup and _READ_SYSCALL is not None:
            ran = _run_warmup_uninstrumented(head, tail, [sql for _, sql in stmts], os_user,
                                             scratch, t0 + timeout)
        if ran is None:  # the whole session instrumented, as valgrind starts by default
            for stale in scratch.glob("callgrind.out*"):
                stale.unlink()
            argv = head + tail
            try:
                cp = run(argv, user=os_user, input=stdin, timeout=timeout, cwd=scratch,
                         check=False, merge_stderr=True, what="valgrind --tool=callgrind")
            except CommandFailed as e:
                raise CallgrindError(
                    f"callgrind run did not finish within {timeout:.0f} s: lower the scale, or "
                    f"raise timeout=. {e}"
                ) from None
            ran = _Ran(argv, cp.returncode, cp.stdout or "", None)
        argv = ran.argv
        elapsed = time.time() - t0
        backend_out = ran.output
        vlog = _read(scratch / "valgrind.log")
        (out / "single-user.out").write_text(backend_out)
        (out / "valgrind.log").write_text(vlog)
        if ran.returncode != 0:
            raise CallgrindError(
                f"postgres --single under valgrind exited with {ran.returncode}; backend output "
                f"and valgrind log are in {out}. Tail:\n{_tail(backend_out + vlog)}"
            )
        errors = [ln for ln in backend_out.splitlines() if re.search(r"\b(ERROR|FATAL):", ln)]
        if errors:
            raise CallgrindError(
                "a statement failed in the single-user backend (its profile would be cut): "
                + "; ".join(errors[:3]) + f". Full output: {out / 'single-user.out'}"
            )
        # an uninstrumented warm-up leaves no profile: the dumps are the counted statements'
        dumped = stmts if ran.switched_at is None else stmts[1:]
        dumps = sorted(scratch.glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        if len(dumps) != len(dumped):
            raise CallgrindError(
                f"callgrind wrote {len(dumps)} profiles for {len(dumped)} statements: is "
                f"{toggle!r} a function of this postgres binary (built with symbols)? "
                f"valgrind log: {out / 'valgrind.log'}"
            )
        measured: list[CallgrindQuery] = []
        prev_mtime = ran.switched_at
        for (mode, sql), dump in zip(dumped, dumps, strict=True):
            mtime = dump.stat().st_mtime
            secs = mtime - (prev_mtime if prev_mtime is not None else t0)
            prev_mtime = mtime
            dest = out / f"callgrind.{_safe(mode)}.out"
            shutil.move(str(dump), dest)
            # valgrind wrote it as the unprivileged user with mode 0600; the profile
            # belongs to whoever ran profkit, like the rest of profiles/<run>/.
            if os.geteuid() == 0:
                os.chown(dest, os.geteuid(), os.getegid())
            os.chmod(dest, 0o644)
            if mode != WARMUP:
                measured.append(CallgrindQuery(mode, sql, str(dest), round(secs, 3)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    session = CallgrindSession(
        out_dir=str(out), toggle=toggle, argv=[str(a) for a in argv], valgrind_version=version,
        postgres=str(postgres), datadir=str(datadir), dbname=dbname,
        warmup_sql=None if warmup_sql is None else stmts[0][1], queries=measured,
        elapsed_s=round(elapsed, 3), started_at=started_at,
        stdout_path=str(out / "single-user.out"), valgrind_log=str(out / "valgrind.log"),
        settings=dict(sets), warmup_instrumented=ran.switched_at is None,
    )
    (out / SESSION_FILE).write_text(session.to_json())
    return session


# The number of read(2) in /proc/PID/syscall, per CPU (the uninstrumented warm-up needs
# it to see the backend waiting for its next statement; elsewhere the session runs
# instrumented from the start).
_READ_SYSCALL = {"x86_64": 0, "aarch64": 63}.get(platform.machine())


@dataclass(frozen=True)
class _Ran:
    argv: list[str]
    returncode: int
    output: str
    switched_at: float | None  # when instrumentation went on; None: on from the start


def _waiting_on_stdin(pid: int, stdin_fd: int) -> bool:
    """The process is blocked reading fd 0 and has read everything written to it."""
    fields = Path(f"/proc/{pid}/syscall").read_text().split()
    if len(fields) < 2 or fields[0] != str(_READ_SYSCALL) or int(fields[1], 16) != 0:
        return False
    unread = struct.unpack("i", fcntl.ioctl(stdin_fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    return unread == 0


def _run_warmup_uninstrumented(head: list[str], tail: list[str], sqls: list[str],
                               user: OSUser, scratch: Path, deadline: float) -> _Ran | None:
    """Run *sqls* (the warm-up first) in one single-user backend under callgrind, the
    start-up and the warm-up uninstrumented; instrumentation goes on (vgdb) once the
    backend waits for its next statement.  None when it could not be switched on: the
    backend has then ended after the warm-up, and the caller runs the whole session
    instrumented.  The process is stopped by pid on any error or Ctrl-C."""
    prefix = scratch / "vgdb-pipe"  # its FIFOs in the session's own directory
    argv = [*head, "--instr-atstart=no", f"--vgdb-prefix={prefix}", *tail]
    out_path = scratch / "uninstrumented-warmup.out"
    bg = Background(argv, cwd=scratch, user=user, stdout_path=out_path, stderr_path=out_path,
                    stop_signal=signal.SIGTERM, stop_timeout=5.0, stdin_pipe=True,
                    what="valgrind --tool=callgrind")
    with bg:
        assert bg.proc is not None and bg.proc.stdin is not None
        bg.write_stdin(_sql_statement(sqls[0]).encode())
        seen = 0
        while seen < 2:  # twice in a row, 20 ms apart
            if bg.poll() is not None:  # it ended in start-up or the warm-up: say why below
                return _Ran(argv, bg.wait(), _read(out_path), None)
            if time.time() > deadline:
                raise CallgrindError("the callgrind session's warm-up did not finish within "
                                     "the timeout: lower the scale, or raise timeout=")
            try:
                seen = seen + 1 if _waiting_on_stdin(bg.pid, bg.proc.stdin.fileno()) else 0
            except OSError as e:  # /proc/PID/syscall not readable here (no ptrace access)
                log.info("callgrind: cannot see the backend wait (%s): instrumenting all", e)
                bg.close_stdin()
                bg.wait(max(1.0, deadline - time.time()))
                return None
            time.sleep(0.02)
        try:
            vg = run([which("vgdb"), f"--vgdb-prefix={prefix}", f"--pid={bg.pid}",
                      "instrumentation", "on"], user=user, timeout=60, check=False,
                     merge_stderr=True, what="vgdb")
            switched = vg.returncode == 0
            why = vg.stdout
        except (CommandFailed, ToolNotFound, OSError) as e:  # no reach (ptrace) in time
            switched, why = False, str(e)
        if not switched:
            log.info("callgrind: vgdb could not switch instrumentation on (%s): "
                     "instrumenting all", _tail(why, 3))
            bg.close_stdin()  # the backend ends after the warm-up
            bg.wait(max(1.0, deadline - time.time()))
            return None
        switched_at = time.time()
        bg.write_stdin("".join(_sql_statement(sql) for sql in sqls[1:]).encode())
        bg.close_stdin()
        try:
            rc = bg.wait(max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            raise CallgrindError("callgrind run did not finish within the timeout: lower the "
                                 "scale, or raise timeout=") from None
    return _Ran(argv, rc, _read(out_path), switched_at)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _read(p: Path) -> str:
    try:
        return p.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _tail(text: str, n: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


@contextmanager
def postmaster_stopped(cluster: Cluster) -> Iterator[Path]:
    """Stop *cluster*'s postmaster (keeping its data directory), yield it, start again.

    Connections to the cluster die with the stop; open new ones afterwards.
    """
    proc = getattr(cluster, "proc", None)
    if proc is None or not proc.alive():
        raise ClusterError(f"cluster {cluster.name} is not running; start it first")
    cluster.pause()
    try:
        yield cluster.datadir
    finally:
        cluster.resume()


def collect_callgrind_cluster(
    cluster: Cluster,
    queries: Mapping[str, str],
    out_dir: str | os.PathLike[str],
    **kwargs: Any,
) -> CallgrindSession:
    """:func:`collect_callgrind` on a running Cluster: stop it, count, start it again.

    The workload must already be loaded (``wl.load(conn, scale)``); ``kwargs`` go to
    :func:`collect_callgrind` (warmup_sql, toggle, settings, timeout, dbname,
    instrument_warmup).
    """
    with postmaster_stopped(cluster) as datadir:
        return collect_callgrind(
            postgres=cluster.build.postgres, datadir=datadir, os_user=cluster.os_user,
            queries=queries, out_dir=out_dir, **kwargs,
        )


# experiments/bench.py imports these two from here; their home is profkit.collect.perf_stat
from profkit.collect.perf_stat import instruction_counter, perf_stat_instructions  # noqa: E402,F401
