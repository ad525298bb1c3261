"""The one experiment engine: arms, the session that runs them, the timed execution.

Every timing experiment (bench, timing accuracy, observers, correction) is a hook on
:class:`Session` plus its own analysis, so a fix to how a repetition is timed, how the
arms are interleaved or how many backends an arm runs on is made once:

- :class:`Arm` and :func:`parse_arms`: what is compared — a label, the build preset it
  runs (``preset@variant`` names a variant of the build, e.g. another code layout, where
  the build layer offers one) and its settings. **One rule for settings**: every arm
  runs on a cluster of its own and its settings go into that cluster's postgresql.conf
  (a postmaster-context setting is then no different from a session one, and no arm's
  setting can leak into another's);
- :class:`Session`: the clusters of every arm (started, loaded, warmed up), the
  backends per arm (*backends* K: the repetitions are split into K consecutive blocks,
  each on a fresh cluster and backend per arm, so process-to-process variance shows up
  in the data instead of being a fixed bias), pinning / vCPU calibration / priority of
  the measured backends, the seeded interleaving, the timed execution and the failure
  report. The experiment gives it a hook per cell (:meth:`Session.run`);
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
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profkit.analyze.stats import slow_threshold
from profkit.errors import ProfkitError
from profkit.collect.procfs import schedstat
from profkit.collect.vcpu import VcpuProbe, counter_deltas, pin, proc_counters
from profkit.pg.build import find_build, get_build, get_builds
from profkit.pg.cluster import Cluster, ClusterError

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
    a patch's setting. *preset* may name a variant of the build, ``vanilla@layout2``
    (:attr:`variant`): the same source built another way, resolved by the build layer.
    """

    label: str
    preset: str
    settings: tuple[tuple[str, str], ...] = ()

    @property
    def settings_dict(self) -> dict[str, str]:
        return dict(self.settings)

    @property
    def base_preset(self) -> str:
        """The preset without its ``@variant``."""
        return self.preset.partition("@")[0]

    @property
    def variant(self) -> str | None:
        """``layout2`` of ``vanilla@layout2``; None for the build itself."""
        v = self.preset.partition("@")[2]
        return v or None

    @property
    def settings_text(self) -> str:
        """The arm's own settings as ``guc=v,guc=v`` ('' for none)."""
        return ",".join(f"{k}={v}" for k, v in self.settings)

    def describe(self) -> str:
        s = ", ".join(f"{k}={v}" for k, v in self.settings)
        return f"{self.label} (preset {self.preset}{'; ' + s if s else ''})"


_ARM_LABEL = re.compile(r"^[A-Za-z0-9_.+-]+$")
_GUC = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
# what pandas.read_csv reads as missing by default (lower-cased): a label a run's CSV
# files would read back as a missing value, not as the arm
_MISSING_WORDS = frozenset({"na", "n/a", "nan", "-nan", "null", "none", "<na>", "-1.#ind",
                            "1.#qnan", "#na", "#n/a", "1.#ind", "-1.#qnan", "-na", "#n/a n/a"})


def split_arm(text: str) -> tuple[str, str, list[str]]:
    """``[LABEL=]PRESET[:GUC=V,...]`` -> (label, preset, ["GUC=V", ...]): the arm syntax
    of ``profkit bench --builds`` and ``profkit timing-accuracy --arm``.

    Without a label the preset names the arm, "/" read as "-" and "@" as "-" (a label
    names files): ``pg19/vanilla:timing_clock_source=tsc`` is labelled ``pg19-vanilla``.
    The settings are returned unchecked (:func:`parse_settings` checks them).

    >>> split_arm("pg19tsc=pg19/vanilla:timing_clock_source=tsc")
    ('pg19tsc', 'pg19/vanilla', ['timing_clock_source=tsc'])
    """
    head, colon, rest = str(text).strip().partition(":")
    label, sep, preset = head.partition("=")
    label, preset = label.strip(), (preset.strip() if sep else label.strip())
    if not sep:
        label = label.replace("/", "-").replace("@", "-")
    if not label or not _ARM_LABEL.match(label) or not preset:
        raise HarnessError(
            f"{text!r}: write PRESET, LABEL=PRESET or LABEL=PRESET:guc=value[,guc=value] "
            "(labels: letters, digits and _.+-)")
    items = [x.strip() for x in rest.split(",") if x.strip()]
    if colon and not items:
        raise HarnessError(f"{text!r}: nothing after ':' (give guc=value[,guc=value])")
    return label, preset, items


def parse_settings(items: Sequence[str] | Mapping[str, Any] | None) -> dict[str, str]:
    """Server settings from ``["name=value", ...]`` or a dict, checked for safe names.

    The values go into postgresql.conf as ``name = 'value'``: a quote or line break in a
    value, or a name that is not a GUC name, is refused with :class:`HarnessError`.
    """
    if not items:
        return {}
    pairs: list[tuple[str, Any]]
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        pairs = []
        for it in items:
            name, sep, value = str(it).partition("=")
            if not sep:
                raise HarnessError(f"setting {it!r} is not name=value (e.g. --set work_mem=64MB)")
            pairs.append((name.strip(), value.strip()))
    out: dict[str, str] = {}
    for name, value in pairs:
        v = str(value).lower() if isinstance(value, bool) else str(value)
        if not _GUC.match(name):
            raise HarnessError(f"{name!r} is not a PostgreSQL setting name")
        if "'" in v or "\n" in v or "\\" in v:
            raise HarnessError(f"setting {name}: the value {v!r} may not contain quotes, "
                               "backslashes or line breaks")
        out[name] = v
    spl = out.get("shared_preload_libraries")
    if spl is not None and "pg_stat_statements" not in [x.strip() for x in spl.split(",")]:
        raise HarnessError("shared_preload_libraries must keep pg_stat_statements: the server-"
                           "side times come from it (e.g. --set shared_preload_libraries="
                           "pg_stat_statements,auto_explain)")
    return out


def parse_arm(text: str | Arm) -> Arm:
    """One arm from ``"tsc_clock"``, ``"label=preset"`` or ``"label=preset:guc=v,guc=v"``.

    >>> parse_arm("s1=sampled_timing:explain_timing_sample_rate=1")
    Arm(label='s1', preset='sampled_timing', settings=(('explain_timing_sample_rate', '1'),))
    """
    if isinstance(text, Arm):
        return text
    label, preset, items = split_arm(str(text))
    try:
        settings = parse_settings(items)
    except HarnessError as e:
        raise HarnessError(f"{text!r}: {e}") from None
    if label.lower() in _MISSING_WORDS:
        raise HarnessError(f"{text!r}: the label {label!r} reads back from CSV as a missing "
                           "value; choose another label")
    return Arm(label, preset, tuple(settings.items()))


def split_items(text: str, known: Collection[str]) -> list[str]:
    """Comma-separated arms. ``X=Y`` after an arm with settings continues its settings
    unless Y is a build preset in *known* (then it is the arm labelled X): ``GUC=V`` and
    ``LABEL=PRESET`` look alike."""
    out: list[str] = []
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        name, eq, value = part.partition("=")
        continues = (out and ":" in out[-1] and eq and ":" not in part
                     and _GUC.match(name.strip()) and value.strip().partition("@")[0]
                     not in known)
        if continues:
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def parse_arms(items: str | Sequence[str | Arm], known: Collection[str]) -> list[Arm]:
    """THE arm parser: arms from a comma-separated string (:func:`split_items`) or a list.

    Raises :class:`HarnessError` for an empty list, a malformed arm or setting, a label
    given twice, or a preset not in *known* (the build presets) — before anything is
    built or started.
    """
    raw = split_items(items, known) if isinstance(items, str) else list(items)
    if not raw:
        raise HarnessError("no arms given")
    arms = [parse_arm(x) for x in raw]
    labels = [a.label for a in arms]
    dups = sorted({x for x in labels if labels.count(x) > 1})
    if dups:
        raise HarnessError(f"{', '.join(dups)} given twice; to run one preset twice (an A/A "
                           "check, or with other settings) give the copies labels: "
                           "a=vanilla,b=vanilla")
    unknown = list(dict.fromkeys(a.base_preset for a in arms if a.base_preset not in known))
    if unknown:
        raise HarnessError(f"unknown build {', '.join(map(repr, unknown))}; known presets: "
                           f"{', '.join(sorted(known))} (`profkit build --list`)")
    return arms


def resolve_build(arm: Arm, progress: Callable[[str], None] | None = None,
                  cached_only: bool = False) -> Build | None:
    """The build an arm runs (built when missing unless *cached_only*: then None).

    A variant (``vanilla@layout2``) is asked of the build layer by that full name; a
    build layer without variants refuses it with a message saying so.
    """

    if cached_only:
        return find_build(arm.preset)
    return get_build(arm.preset, progress=progress)


def resolve_builds(presets: Sequence[str],
                   progress: Callable[[str], None] | None = None) -> dict[str, Build]:
    """The builds of *presets* by name (built when missing), made as one list: each one's
    configure runs while the one before compiles (:func:`profkit.pg.build.get_builds`)."""
    names = list(dict.fromkeys(presets))
    return dict(zip(names, get_builds(names, progress=progress), strict=True))


def target_build(target: Cluster | Build | str,
                 progress: Callable[[str], None] | None = None) -> Build:
    """The build a one-arm experiment measures: a running cluster's, a Build, or a preset
    name's (built when missing)."""
    if isinstance(target, Cluster):
        return target.build
    if isinstance(target, str):
        return get_build(target, progress=progress)
    return target


class Clusters:
    """The throwaway clusters of one run, entered into *stack* (stopped when it closes)."""

    def __init__(self, stack: contextlib.ExitStack, log_dir: Path) -> None:
        self.stack = stack
        self.log_dir = log_dir
        self.started: dict[str, Cluster] = {}

    def start(self, build: Build, name: str, settings: Mapping[str, str] | None = None, *,
              log_name: str | None = None) -> Cluster:
        """Start cluster *name* of *build*; its log goes to ``logs/postgres-<log_name>.log``."""

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


# --------------------------------------------------------------------------- the session

@dataclass
class Target:
    """One arm's cluster and measured backend in one block of a :class:`Session`."""

    arm: Arm
    build: Build
    cluster: Cluster
    block: int                      # 1..K: which of the arm's backends this is
    conn: psycopg.Connection | None = None
    backend_pid: int = 0
    pgss: Pgss | None = None
    shown: dict[str, str] = field(default_factory=dict)   # SHOW of the arm's settings

    @property
    def label(self) -> str:
        return self.arm.label

    @property
    def qids(self) -> dict[str, int]:
        return self.pgss.qids if self.pgss is not None else {}


class ExecFailed(ProfkitError):
    """An execution failed on *target* (the database's error in ``err``); the experiment
    turns it into its own error, naming what was kept."""

    def __init__(self, target: Target, what: str, err: BaseException) -> None:
        super().__init__(str(err))
        self.target = target
        self.what = what
        self.err = err


@dataclass(frozen=True)
class SessionOptions:
    """How a session runs its arms (recorded in the run's provenance by the experiment).

    *backends*: K independent backends per arm, each on a fresh cluster: the
    repetitions are split into K consecutive blocks (:func:`split_reps`), every block
    interleaving all arms. *pin_cpu*: the CPU every measured backend is pinned to;
    *calibrate*: the vCPU calibration just before and after every execution
    (:class:`~profkit.collect.vcpu.VcpuProbe`); *nice*: the measured backends'
    scheduling priority; *pgss*: pg_stat_statements created on each connection;
    *settings*: server settings of every arm's cluster (an arm's own win).

    *min_kept* (with *calibrate*): when the vCPU rule (a calibration just before or after
    an execution ran slow, :func:`profkit.analyze.stats.vcpu_adjust`) leaves some cell
    of some arm with fewer than *min_kept* of its repetitions, the session runs more
    repetitions of every cell, interleaved as the others, until none is short or it ran
    *max_extra* of them (None: as many as the run's repetitions). 0: never.
    """

    backends: int = 1
    pin_cpu: int | None = None
    calibrate: bool = False
    min_kept: int = 0
    max_extra: int | None = None
    nice: int | None = None
    pgss: bool = True
    settings: Mapping[str, str] = field(default_factory=dict)
    dbname: str = "postgres"


def split_reps(reps: int, backends: int) -> list[range]:
    """Repetitions 1..*reps* split into *backends* consecutive blocks, as even as can be
    (``split_reps(10, 3)`` -> 1-4, 5-7, 8-10)."""
    k = max(1, min(int(backends), int(reps)))
    base, extra = divmod(reps, k)
    out, start = [], 1
    for i in range(k):
        n = base + (1 if i < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


#: Fewer backends than this make a hierarchical interval too narrow (simulated coverage
#: of the bare 95 % percentile interval: 0.70 with 2 backends, 0.86 with 3, 0.90-0.94
#: with 4-5; widened for few backends, 0.91-0.98 with 3 and 0.945-0.98 with 4-8; see
#: :mod:`profkit.analyze.stats`).
MIN_BACKENDS = 4


def resolve_min_kept(value: int | str | None, reps: int,
                     error: type[ProfkitError] = HarnessError) -> int:
    """*min_kept* of :class:`SessionOptions` from what a user gave: ``"auto"`` → half
    the repetitions, rounded up (a cell the vCPU rule left with fewer gets extra
    repetitions); None or 0 → never; an integer 0..*reps* → itself."""
    if value is None or value == "auto":
        return 0 if value is None else (reps + 1) // 2
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= reps:
        raise error(f"min_kept must be 'auto' or an integer from 0 to the repetitions "
                    f"({reps}), got {value!r}")
    return value


def rep_text(rep: int, reps: int, word: str = "rep") -> str:
    """A repetition in progress messages: ``rep 3/10``, or ``extra rep 11`` past *reps*."""
    return f"{word} {rep}/{reps}" if rep <= reps else f"extra {word} {rep}"


def cell_name(cell: Any) -> str:
    """A cell as messages show it: ``('join_sum', 'plain')`` → ``join_sum plain``."""
    return " ".join(map(str, cell)) if isinstance(cell, tuple) else str(cell)


#: The most backends "auto" gives an arm (each adds a cluster start and a warm-up per cell).
MAX_AUTO_BACKENDS = 12


def auto_backends(reps: int) -> int:
    """The default number of backends per arm: one below 8 repetitions (too few to split
    into :data:`MIN_BACKENDS`), else one backend per repetition, at most
    :data:`MAX_AUTO_BACKENDS`: 3 -> 1, 8 -> 8, 10 -> 10, 25 or more -> 12.

    Why so many: on this VM most of an interval's variance lies between backends, and an
    interval over K backends rests on K − 1 degrees of freedom.  At a fixed number of
    repetitions, more backends with fewer repetitions each give narrower intervals that
    still hold their level.  Measured:

    - A/A runs of 12 repetitions: 25 runs per design, 2026-12-07.  The median width of
      the 95 % interval was 13.7 points on 4 backends, 12.4 on 6 and 8.7 on 12; 0, 0
      and 1 of the 25 intervals excluded 0.
    - Simulated, the report's interval covered 0.945–0.98 for every design.  With one
      repetition per backend its width was 0.46–0.66 of 4 backends' (95 %, 12
      repetitions), and 0.40–0.51 of it at the 99.71 % of ``make demo``'s 17 intervals.

    The price: each backend adds a cluster start and one warm-up execution per cell.
    ``make demo``'s benchmark and instruction counts took 164 s on 10 backends against
    115 s on 4 (one run each).  The measured repetitions stay *reps*.  Sources:
    ``benchmarks/aa_false_positive.py``, ``benchmarks/hier_small_k.py`` and
    ``benchmarks/results/backends_per_rep-20261207.txt``."""
    if reps < 2 * MIN_BACKENDS:
        return 1
    return min(int(reps), MAX_AUTO_BACKENDS)


#: What the experiment does per cell: (target, cell, rep, slot, order) -> None.
CellHook = Callable[[Target, Any, int, int, int], None]


@dataclass
class Group:
    """Cells run together: every repetition runs each (arm, cell) once, shuffled by
    *seed*; *warm(target, cell)* runs *warmup* times per cell before a block's first
    repetition; *include(rep, cell)* may leave a cell out of a repetition."""

    name: str
    cells: Sequence[Any]
    seed: int | str
    run: CellHook
    warm: Callable[[Target, Any], None] | None = None
    warmup: int = 1
    include: Callable[[int, Any], bool] | None = None


class Session:
    """The engine of a timing experiment: arms' clusters and backends, block by block.

    *builds*: arm label -> Build, or a sequence of builds (code layouts of one build):
    block *b* then runs ``builds[(b - 1) % len]`` (:meth:`build_for`), so each of the
    arm's backends runs its own layout and the between-backend level of the interval
    carries the layout's effect. *prepare(target)* runs once per fresh backend, after
    it connected (load the workload, SET what the experiment needs...). The experiment
    calls :meth:`run` with its groups of cells; everything else — clusters (one per arm
    and block, its settings in postgresql.conf, its server log kept in ``log_dir``),
    connections, pinning, calibration, priority, the interleaving, the timing
    (:meth:`execute`) and the failure report (:meth:`failure`) — is here.
    """

    def __init__(self, arms: Sequence[Arm], builds: Mapping[str, Build | Sequence[Build]], *,
                 name: str,
                 log_dir: Path, options: SessionOptions | None = None,
                 prepare: Callable[[Target], None] | None = None,
                 say: Callable[[str], None] | None = None, arm_word: str = "arm") -> None:
        self.arms = list(arms)
        self.arm_word = arm_word  # what the experiment calls an arm in its messages
        self.builds = dict(builds)
        self.name = name
        self.log_dir = log_dir
        self.options = options or SessionOptions()
        self.prepare = prepare
        self.say = say or (lambda _m: None)
        self.targets: list[Target] = []        # the current block's
        self.all_targets: list[Target] = []    # every block's, in order
        self.clusters: Clusters | None = None
        self.vcpu: VcpuProbe | None = None
        self.order = 0
        self.given: Cluster | None = None
        # the vCPU calibrations of every repetition's executions, per (arm, group,
        # cell index, rep), and the cell running now (set by _run_group)
        self.calibrations: dict[tuple[str, str, int, int], list[tuple[float, float]]] = {}
        self._cell: tuple[str, str, int, int] | None = None
        self.extra_reps = 0
        self.short_after: dict[str, int] = {}  # cells still short when the extras ran out

    @classmethod
    def on_cluster(cls, cluster: Cluster, *, options: SessionOptions | None = None,
                   prepare: Callable[[Target], None] | None = None,
                   say: Callable[[str], None] | None = None) -> Session:
        """A session of one arm on a cluster the caller started (observers, correction:
        the experiment measures that cluster's build); the cluster is not stopped."""
        arm = Arm(cluster.build.name, cluster.build.name)
        s = cls([arm], {arm.label: cluster.build}, name="given", log_dir=Path("."),
                options=options, prepare=prepare, say=say)
        s.given = cluster
        return s

    @classmethod
    def single(cls, target: Cluster | Build, *, name: str, log_dir: Path,
               options: SessionOptions | None = None,
               prepare: Callable[[Target], None] | None = None,
               say: Callable[[str], None] | None = None) -> Session:
        """A session of one arm: on *target*'s build, whose cluster the session starts,
        loads through *prepare* and stops (its server log kept in *log_dir*); or, given a
        running cluster (a notebook's own), on that cluster (:meth:`on_cluster`)."""
        if isinstance(target, Cluster):
            return cls.on_cluster(target, options=options, prepare=prepare, say=say)
        label = target.name.replace("/", "-").replace("@", "-")
        arm = Arm(label, target.name)
        return cls([arm], {label: target}, name=name, log_dir=log_dir, options=options,
                   prepare=prepare, say=say)

    # -- clusters and backends --------------------------------------------------
    def build_for(self, arm: Arm, block: int) -> Build:
        """The build *arm* runs in *block* (a layout of it, when the arm has several)."""
        b = self.builds[arm.label]
        if isinstance(b, (list, tuple)):
            return b[(block - 1) % len(b)]
        return b  # type: ignore[return-value]

    def log_name(self, arm: Arm, block: int) -> str:
        return arm.label if self.options.backends <= 1 or block == 1 else \
            f"{arm.label}-b{block}"

    def open_block(self, stack: contextlib.ExitStack, block: int) -> list[Target]:
        """Start every arm's cluster and backend of *block* (stopped when *stack* closes)."""

        if self.options.calibrate and self.vcpu is None:  # a caller's cluster too
            self.vcpu = stack.enter_context(VcpuProbe(self.options.pin_cpu))
            stack.callback(setattr, self, "vcpu", None)
        if self.given is not None:
            t = Target(self.arms[0], self.given.build, self.given, block)
            self.targets = [t]
            self.all_targets.append(t)
            stack.callback(self.disconnect, t)
            self.connect(t)
            if self.prepare is not None:
                self.prepare(t)
            return self.targets
        self.clusters = Clusters(stack, self.log_dir)
        self.targets = []
        for arm in self.arms:
            b = self.build_for(arm, block)
            suffix = "" if self.options.backends <= 1 else f"-b{block}"
            try:
                cl = self.clusters.start(
                    b, f"{self.name}-{arm.label}{suffix}",
                    {**self.options.settings, **arm.settings_dict},
                    log_name=self.log_name(arm, block))
            except ClusterError as e:
                if arm.settings and "configuration" in str(e):
                    raise HarnessError(
                        f"the cluster of {self.arm_word} {arm.label!r} (preset {arm.preset}) "
                        "did not start "
                        f"with its settings {arm.settings_text}: is every name a setting of "
                        f"this build (`SHOW ALL` on it)? {e}") from None
                raise
            t = Target(arm, b, cl, block)
            self.targets.append(t)
            self.all_targets.append(t)
            stack.callback(self.disconnect, t)
            self.connect(t)
            if self.prepare is not None:
                self.prepare(t)
            for k, _ in arm.settings:  # names checked by parse_settings
                assert t.conn is not None
                t.shown[k] = str(t.conn.execute(f"SHOW {k}").fetchone()[0])  # type: ignore[index]
        return self.targets

    def connect(self, t: Target) -> None:
        """(Re)connect *t*'s backend: pinned, prioritised, pg_stat_statements keys kept."""
        qids = dict(t.qids)
        t.conn, t.backend_pid = connect(t.cluster, pgss=self.options.pgss,
                                        dbname=self.options.dbname)
        if self.options.pin_cpu is not None:
            pin(t.backend_pid, self.options.pin_cpu)
        if self.options.nice is not None:
            try:
                prioritise(t.backend_pid, self.options.nice)
            except OSError as e:
                raise HarnessError(
                    f"cannot set the priority of backend {t.backend_pid} to "
                    f"{self.options.nice} ({e}); run as root or pass nice=None "
                    "(--nice none)") from None
        if self.options.pgss:
            t.pgss = Pgss(t.conn)
            t.pgss.qids.update(qids)

    @staticmethod
    def disconnect(t: Target) -> None:
        close(t.conn)
        t.conn = None

    # -- one execution ----------------------------------------------------------
    def execute(self, t: Target, sql: str, *, what: str, key: str | None = None,
                stamps: bool = False,
                observe: Callable[[Callable[[], list[tuple[Any, ...]]]], Any] | None = None
                ) -> Timed:
        """:func:`timed_execute` on *t*'s backend (pg_stat_statements under *key* when
        the session has it; *stamps*: the backend's clock_timestamp() around it;
        *observe*: an observer wrapping the execution), with the session's vCPU
        calibration. A database error raises :class:`ExecFailed`."""
        assert t.conn is not None
        try:
            m = timed_execute(t.conn, sql, pid=t.backend_pid,
                              pgss=t.pgss if key is not None else None, key=key,
                              stamps=stamps, observe=observe, vcpu=self.vcpu)
        except HarnessError:
            raise
        except Exception as e:  # psycopg errors, and a broken connection's own errors
            raise ExecFailed(t, what, e) from e
        if self._cell is not None and self.vcpu is not None:
            self.calibrations.setdefault(self._cell, []).append(
                (m.calib_before_ms, m.calib_after_ms))
        return m

    def failure(self, e: ExecFailed, when: str, kept: str = "") -> tuple[bool, str]:
        """THE failure report of an execution: (did the server crash, one sentence naming
        the arm, what and when, then *kept* — what the experiment kept — and, after a
        crash, that the run's clusters are stopped and the server log kept in the run
        directory). Called while the clusters run
        (from the cell hook), so the crash report is read from the live server."""
        t = e.target
        crashed, detail = failure_detail(t.cluster, t.conn)
        where = f"{self.arm_word} {t.label!r}, {e.what}, during {when}"
        tail = f". {kept}" if kept else ""
        if crashed:
            log = (self.clusters.log_file(self.log_name(t.arm, t.block)) if self.clusters
                   else t.cluster.log_path)
            stopped = "; all clusters of this run are stopped" if self.given is None else ""
            return True, f"the server of {where} {detail}{tail}{stopped} (server log: {log})"
        return False, f"the query failed on {where}: {e.err}{tail}"

    # -- the run ----------------------------------------------------------------
    def run(self, reps: int, groups: Sequence[Group], *,
            after: Callable[[list[Target]], None] | None = None,
            on_block: Callable[[list[Target]], None] | None = None) -> None:
        """Every block: fresh clusters and backends for all arms, *on_block(targets)*,
        then per group its warm-up and its repetitions of the block in the seeded
        interleaved order (the same order whatever the number of blocks: with one
        block it is exactly :func:`interleave`'s). *after(targets)* runs on the last
        block's backends before they stop (instruction counts)."""
        blocks = split_reps(reps, self.options.backends)
        for bi, block_reps in enumerate(blocks, 1):
            with contextlib.ExitStack() as stack:
                targets = self.open_block(stack, bi)
                if len(blocks) > 1:
                    self.say(f"backend {bi} of {len(blocks)} per arm: repetitions "
                             f"{block_reps.start}-{block_reps.stop - 1}")
                if on_block is not None:
                    on_block(targets)
                for g in groups:
                    self._run_group(g, targets, block_reps)
                if bi == len(blocks):
                    self._run_extra(groups, targets, reps)
                    if after is not None:
                        after(targets)

    def _run_group(self, g: Group, targets: list[Target], block_reps: range, *,
                   warm: bool = True) -> None:
        if warm and g.warm is not None:
            for t in targets:
                for _ in range(max(g.warmup, 1)):
                    for c in g.cells:
                        g.warm(t, c)
        pairs = [(t, i, c) for t in targets for i, c in enumerate(g.cells)]
        # the interleaving of (arm, cell) pairs, seeded per group and drawn for all
        # repetitions at once so a block's part is the same as in a one-block run
        inc = g.include
        for rep, slot, (t, i, c) in interleave(
                pairs, block_reps.stop - 1, g.seed,
                include=None if inc is None else (lambda r, tic: inc(r, tic[2]))):
            if rep not in block_reps:
                continue
            self._cell = (t.label, g.name, i, rep)
            try:
                g.run(t, c, rep, slot, self.order)
            finally:
                self._cell = None
            self.order += 1

    # -- repetitions the vCPU rule took away ----------------------------------------
    def kept_counts(self) -> dict[tuple[str, str, int], int]:
        """Per (arm, group, cell index): the repetitions whose every execution had both
        calibrations at or under the threshold of all calibrations so far (the vCPU
        rule of :func:`profkit.analyze.stats.vcpu_adjust`)."""
        values = [v for pairs in self.calibrations.values() for p in pairs for v in p]
        _ref, _mad, thr = slow_threshold(values)
        kept: dict[tuple[str, str, int], int] = {}
        for (label, group, i, _rep), pairs in self.calibrations.items():
            ok = all(b <= thr and a <= thr for b, a in pairs)  # NaN compares False
            kept[(label, group, i)] = kept.get((label, group, i), 0) + int(ok)
        return kept

    def _run_extra(self, groups: Sequence[Group], targets: list[Target], reps: int) -> None:
        want = self.options.min_kept
        if not (self.options.calibrate and want > 0 and self.calibrations):
            return
        limit = reps if self.options.max_extra is None else self.options.max_extra
        cells = {(g.name, i): c for g in groups for i, c in enumerate(g.cells)}
        rep = reps
        while True:
            short = {k: n for k, n in self.kept_counts().items() if n < want}
            if not short:
                self.short_after = {}
                return
            self.short_after = {f"{label} {cell_name(cells[(g, i)])}": n
                                for (label, g, i), n in sorted(short.items())}
            if self.extra_reps >= limit:
                self.say(f"vCPU rule: after {self.extra_reps} extra repetitions "
                         f"{len(short)} cells still keep fewer than {want}: "
                         + ", ".join(f"{k} {n}" for k, n in self.short_after.items()))
                return
            rep += 1
            self.extra_reps += 1
            worst = min(short.values())
            self.say(f"vCPU rule: {len(short)} cells keep fewer than {want} repetitions "
                     f"(the fewest {worst}): extra repetition {rep} "
                     f"({self.extra_reps} of at most {limit})")
            for g in groups:
                self._run_group(g, targets, range(rep, rep + 1), warm=False)

    def extra_facts(self) -> dict[str, Any]:
        """What the run's provenance says of the extra repetitions."""
        return {"min_kept": self.options.min_kept if self.options.calibrate else 0,
                "max_extra": self.options.max_extra, "extra_reps": self.extra_reps,
                "short_after_extra": dict(self.short_after)}
