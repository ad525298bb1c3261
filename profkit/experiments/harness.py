"""The one experiment engine: arms, clusters, the timed execution, interleaving, crashes.

Every timing experiment (bench, timing accuracy, observers, correction) is built from
these pieces, so a fix to how a repetition is timed is made once:

- :class:`Arm`: what is compared — a label, the build preset it runs and settings;
- :class:`Clusters`: throwaway clusters of one run, started on demand inside an
  ExitStack; each one's server log is copied into ``<run>/logs/`` before its directory
  goes, also after a crash;
- :func:`connect`: a connection without auto-prepare, with pg_stat_statements, and the
  backend's pid;
- :func:`timed_execute`: THE function that times a repetition — the client's wall time
  around one simple-protocol round trip (rows fetched), the backend's on-CPU and
  run-queue time from ``/proc/PID/schedstat``, and the server's time (the statement's
  pg_stat_statements ``total_exec_time`` delta, or ``clock_timestamp()`` read in the
  backend right before and after the statement). An observer (ltrace, bcc, perf) wraps
  the execution through ``observe``;
- :func:`interleave`: the seeded shuffled order of repetitions;
- :func:`failure_detail`: after a failed execution, whether the server crashed and what
  its log says.

Rows go to the run directory through :class:`profkit.rundir.RowWriter`.
"""
from __future__ import annotations

import contextlib
import math
import random
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profkit.errors import ProfkitError
from profkit.collect.procfs import schedstat
from profkit.collect.vcpu import VcpuProbe, counter_deltas, proc_counters

if TYPE_CHECKING:
    import psycopg

    from profkit.pg.build import Build
    from profkit.pg.cluster import Cluster


class HarnessError(ProfkitError):
    """The engine could not identify or time a statement."""


# --------------------------------------------------------------------------- arms

@dataclass(frozen=True)
class Arm:
    """One side of a comparison: rows carry *label*; it runs build *preset* with *settings*.

    ``Arm("a", "vanilla")`` and ``Arm("b", "vanilla")`` make an A/A run (a check of the
    noise); ``Arm("n1", "sampled_timing", (("explain_timing_sample_rate", "1"),))`` runs
    a patch's setting.
    """

    label: str
    preset: str
    settings: tuple[tuple[str, str], ...] = ()

    @property
    def settings_dict(self) -> dict[str, str]:
        return dict(self.settings)

    def describe(self) -> str:
        s = ", ".join(f"{k}={v}" for k, v in self.settings)
        return f"{self.label} (preset {self.preset}{'; ' + s if s else ''})"


_ARM_LABEL = re.compile(r"^[A-Za-z0-9_.+-]+$")


def split_arm(text: str) -> tuple[str, str, list[str]]:
    """``[LABEL=]PRESET[:GUC=V,...]`` -> (label, preset, ["GUC=V", ...]): the arm syntax
    of ``profkit bench --builds`` and ``profkit timing-accuracy --arm``.

    Without a label the preset names the arm, "/" read as "-" (a label names files):
    ``pg19/vanilla:timing_clock_source=tsc`` is labelled ``pg19-vanilla``. The settings
    are returned unchecked (the caller checks them, e.g. bench.parse_settings).

    >>> split_arm("pg19tsc=pg19/vanilla:timing_clock_source=tsc")
    ('pg19tsc', 'pg19/vanilla', ['timing_clock_source=tsc'])
    """
    head, colon, rest = str(text).strip().partition(":")
    label, sep, preset = head.partition("=")
    label, preset = label.strip(), (preset.strip() if sep else label.strip())
    if not sep:
        label = label.replace("/", "-")
    if not label or not _ARM_LABEL.match(label) or not preset:
        raise HarnessError(
            f"{text!r}: write PRESET, LABEL=PRESET or LABEL=PRESET:guc=value[,guc=value] "
            "(labels: letters, digits and _.+-)")
    items = [x.strip() for x in rest.split(",") if x.strip()]
    if colon and not items:
        raise HarnessError(f"{text!r}: nothing after ':' (give guc=value[,guc=value])")
    return label, preset, items


class Clusters:
    """The throwaway clusters of one run, entered into *stack* (stopped when it closes)."""

    def __init__(self, stack: contextlib.ExitStack, log_dir: Path) -> None:
        self.stack = stack
        self.log_dir = log_dir
        self.started: dict[str, Cluster] = {}

    def start(self, build: Build, name: str, settings: Mapping[str, str] | None = None, *,
              log_name: str | None = None) -> Cluster:
        """Start cluster *name* of *build*; its log goes to ``logs/postgres-<log_name>.log``."""
        from profkit.pg.cluster import Cluster

        cl = Cluster(build, name=name, settings=dict(settings or {}))
        self.stack.enter_context(cl)
        # LIFO: runs before the cluster stops and removes its directory
        self.stack.callback(self.keep_log, cl, log_name or name)
        self.started[name] = cl
        return cl

    def log_file(self, log_name: str) -> Path:
        return self.log_dir / f"postgres-{log_name}.log"

    def keep_log(self, cl: Cluster, log_name: str) -> None:
        """Copy the server log into the run directory (it goes with the cluster's dir)."""
        with contextlib.suppress(OSError, AssertionError):
            self.log_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cl.log_path, self.log_file(log_name))


def connect(cluster: Cluster, *, dbname: str = "postgres", pgss: bool = True
            ) -> tuple[psycopg.Connection, int]:
    """A connection that parses and plans every execution like the first (no auto-prepare),
    with pg_stat_statements created when *pgss*; and its backend's pid."""
    conn = cluster.connect(prepare_threshold=None, dbname=dbname)
    if pgss:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return conn, cluster.backend_pid(conn)


def close(conn: psycopg.Connection | None) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()


def prioritise(pid: int, nice: int) -> None:
    """Give a process (our backend, by pid) the scheduling priority *nice*.

    With autogroup scheduling (kernel.sched_autogroup_enabled = 1, as here) a nice
    value only ranks a process within its session's group, and every session's group
    gets an equal share: the postmaster runs in a session of its own, so the
    backend's group competes 1:1 with each other session's.  Its group's nice
    (/proc/PID/autogroup) is what lifts it above the other work; that group holds
    only the cluster profkit started.
    """
    import os

    os.setpriority(os.PRIO_PROCESS, pid, nice)
    ag = Path(f"/proc/{pid}/autogroup")
    if ag.exists() and Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() \
            == "1":
        ag.write_text(f"{nice}\n")


# --------------------------------------------------------------------------- pg_stat_statements

class Pgss:
    """pg_stat_statements of one connection: statements found by key, read as deltas."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.qids: dict[str, int] = {}

    def snapshot(self) -> dict[int, int]:
        """queryid -> calls for every statement except the ones reading pg_stat_statements."""
        rows = self.conn.execute("SELECT queryid, calls, query FROM pg_stat_statements(true)",
                                 prepare=False).fetchall()
        out: dict[int, int] = {}
        for qid, calls, text in rows:
            if qid is None or (text and "pg_stat_statements" in text):
                continue
            out[int(qid)] = out.get(int(qid), 0) + int(calls)
        return out

    def identify_since(self, key: str, before: Mapping[int, int], what: str = "") -> int:
        """The one statement that ran once since *before* becomes *key*."""
        grown = [q for q, c in self.snapshot().items() if c - before.get(q, 0) == 1]
        if len(grown) != 1:
            raise HarnessError(
                f"could not find the {what or key} statement in pg_stat_statements "
                f"({len(grown)} statements ran once): is pg_stat_statements loaded "
                "(shared_preload_libraries), its track 'top' and the cluster private?")
        self.qids[key] = grown[0]
        return grown[0]

    def read(self, key: str) -> tuple[int, float]:
        """(calls, total_exec_time ms) of statement *key*."""
        row = self.conn.execute(
            "SELECT coalesce(sum(calls), 0)::int8, coalesce(sum(total_exec_time), 0)::float8 "
            f"FROM pg_stat_statements(false) WHERE queryid = {int(self.qids[key])}",
            prepare=False).fetchone()
        assert row is not None
        return int(row[0]), float(row[1])


# --------------------------------------------------------------------------- the timed execution

# gettimeofday() in the backend: not instr_time, so no patch changes it (µs resolution)
STAMP_SQL = "SELECT extract(epoch FROM clock_timestamp())::float8"


@dataclass
class Timed:
    """What one execution took, seen from the client, the scheduler and the server."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    client_ms: float = math.nan
    cpu_ms: float = math.nan       # the backend on a CPU (schedstat)
    runq_ms: float = math.nan      # the backend waiting for a CPU (schedstat)
    server_ms: float = math.nan    # pg_stat_statements delta, or the backend's stamps
    pgss_calls: int | None = None  # calls delta of the statement (1 when private)
    t_start: float = math.nan      # Unix time the execution started
    observed: Any = None           # what ``observe`` returned
    calib_before_ms: float = math.nan  # the vCPU calibration's CPU time just before
    calib_after_ms: float = math.nan   # ... and just after (VcpuProbe)
    counters: dict[str, float] = field(default_factory=dict)  # vcpu.counter_deltas


def timed_execute(conn: psycopg.Connection, sql: str, *, pid: int, pgss: Pgss | None = None,
                  key: str | None = None, stamps: bool = False,
                  observe: Callable[[Callable[[], list[tuple[Any, ...]]]], Any] | None = None,
                  vcpu: VcpuProbe | None = None) -> Timed:
    """Execute *sql* once on *conn* (backend *pid*) and time it; THE timing of a repetition.

    - client_ms: ``perf_counter_ns`` around the simple-protocol round trip, rows fetched;
    - cpu_ms / runq_ms: ``/proc/PID/schedstat`` read while the backend is idle before and
      after: its on-CPU time leaves out the time it waited for a core on a loaded machine;
    - server_ms: with *pgss* and *key*, the statement's pg_stat_statements
      ``total_exec_time`` delta (the first execution of a key finds its entry: the whole
      entry's calls are checked, its time is NaN); with *stamps*, ``clock_timestamp()``
      read by the backend right before and after the statement in the same message.

    *observe*, when given, is called with the execution (a callable returning the rows)
    and must run it once — an observer attaching around it (ltrace, a uprobe, perf).

    *vcpu*, when given: the calibration work runs just before and just after the
    execution (outside the timed span; ``calib_before_ms``/``calib_after_ms``: the vCPU's
    speed then), and the backend's context switches, migrations, page faults and the
    steal time over the execution go to ``counters`` (:mod:`profkit.collect.vcpu`).
    Database errors propagate; the caller says where they happened.
    """
    out = Timed()
    before: tuple[int, float] | None = None
    snap: dict[int, int] | None = None
    if pgss is not None and key is not None:
        if key in pgss.qids:
            before = pgss.read(key)
        else:
            snap = pgss.snapshot()
    marks: list[float] = []

    def go() -> list[tuple[Any, ...]]:
        cur = conn.cursor()
        if vcpu is not None:
            out.calib_before_ms = vcpu.calibrate().cpu_ms
            c0 = proc_counters(pid)
        s0 = schedstat(pid)
        out.t_start = time.time()
        t0 = time.perf_counter_ns()
        if stamps:
            # one message: no client round trip between the stamps and the statement
            cur.execute(f"{STAMP_SQL}; {sql}; {STAMP_SQL}", prepare=False)
            b = cur.fetchall()
            cur.nextset()
            rows = cur.fetchall()
            cur.nextset()
            a = cur.fetchall()
            marks[:] = [float(b[0][0]), float(a[0][0])]
        else:
            cur.execute(sql, prepare=False)
            rows = cur.fetchall() if cur.description is not None else []
        t1 = time.perf_counter_ns()
        s1 = schedstat(pid)
        if vcpu is not None:
            out.counters = counter_deltas(c0, proc_counters(pid), vcpu.cpu)
            out.calib_after_ms = vcpu.calibrate().cpu_ms
        cur.close()
        out.client_ms = (t1 - t0) / 1e6
        if s0 is not None and s1 is not None:
            out.cpu_ms = (s1[0] - s0[0]) / 1e6
            out.runq_ms = (s1[1] - s0[1]) / 1e6
        out.rows = rows
        return rows

    out.observed = go() if observe is None else observe(go)
    if pgss is not None and key is not None:
        if snap is not None:
            qid = pgss.identify_since(key, snap)
            # the statement's stats are the whole entry when it was new, else a delta
            before = (snap.get(qid, 0), math.nan)
        assert before is not None
        after = pgss.read(key)
        out.pgss_calls = after[0] - before[0]
        out.server_ms = after[1] - before[1] if not math.isnan(before[1]) else math.nan
    elif marks:
        out.server_ms = (marks[1] - marks[0]) * 1e3
    return out


def first_value(rows: Sequence[tuple[Any, ...]]) -> Any:
    return rows[0][0] if rows and rows[0] else None


# --------------------------------------------------------------------------- order

def interleave(items: Sequence[Any], reps: int, seed: int | str,
               include: Callable[[int, Any], bool] | None = None,
               ) -> Iterator[tuple[int, int, Any]]:
    """(rep, slot, item) for *reps* repetitions of every item, each repetition's order
    shuffled by a generator seeded with *seed*: slow drift of a shared machine falls on
    every item alike instead of on whichever ran last. *include(rep, item)*: whether the
    item runs in that repetition (expensive observers run fewer times)."""
    rng = random.Random(seed)
    for rep in range(1, reps + 1):
        seq = [it for it in items if include is None or include(rep, it)]
        rng.shuffle(seq)
        for slot, item in enumerate(seq):
            yield rep, slot, item


def new_seed() -> int:
    """A random order seed (recorded in the run's provenance)."""
    return random.SystemRandom().randrange(2**31)


# --------------------------------------------------------------------------- failures

def failure_detail(cluster: Cluster, conn: psycopg.Connection | None,
                   wait_s: float = 3.0) -> tuple[bool, str]:
    """After an execution failed: (did the server crash or exit, what its log says).

    The postmaster logs a backend's death just after the client sees the socket close,
    so a broken connection waits up to *wait_s* for the report. (Cluster.stop waits for
    crash recovery before it asks for a fast shutdown.)
    """
    crash = cluster.crash_report()
    broken = conn is None or conn.closed or conn.broken
    deadline = time.monotonic() + wait_s
    while broken and not crash and time.monotonic() < deadline:
        time.sleep(0.1)
        crash = cluster.crash_report()
    alive = cluster.proc is not None and cluster.proc.alive()
    if crash or not alive:
        what = "crashed" if alive else "exited"
        pid = cluster.proc.pid if cluster.proc else "?"
        return True, f"{what}: {crash or f'postmaster (pid {pid}) is gone'}"
    return False, ""
