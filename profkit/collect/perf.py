"""perf on a running PostgreSQL backend: ``perf record`` while a query runs, ``perf stat``.

What :func:`record_query` does, for one backend (the pid behind a connection):

1. writes into the run it is given (``profiles/<run_id>/``, opened by the caller with
   :func:`profkit.rundir.open_run`) and saves this kernel's vDSO image there
   (``vdso.so``, see below);
2. starts ``perf record -F FREQ -g -p PID -o perf.data`` (frame-pointer call graphs: the
   builds use ``-fno-omit-frame-pointer -mno-omit-leaf-frame-pointer``;
   ``call_graph="dwarf"`` records ``--call-graph dwarf`` instead, ~8 MB/s) and, where
   asked, ``perf stat -x, -p PID`` beside it, both through :class:`profkit.processes.Background`;
3. waits until perf is attached — perf prints nothing reliable when it is, so we poll
   ``/proc/<perf pid>/fd`` for its ``anon_inode:[perf_event]`` descriptors and then give
   it a moment to map its ring buffers — so the first rows of the query are sampled;
4. runs the query (``reps`` times), then stops perf with SIGINT (never SIGKILL: that
   leaves an unreadable perf.data) and waits for it to finish writing;
5. ``perf script -i perf.data`` → ``perf.script.txt`` (streamed to the file; gzip on
   request), folded by :mod:`profkit.parse.perf_script` into ``stacks.folded``,
   ``stacks.parquet`` and ``functions.parquet``; ``perf stat``'s CSV into
   ``perf_stat.parquet``.

Collecting and parsing are separate steps (:func:`record_query` / :func:`record_pid`
record; :func:`script` and :func:`fold_run` turn a run directory into tables) so a run
can be parsed again later, elsewhere, from its directory alone.

**Build-id cache.** ``perf record`` copies (hard-links, on the same file system) every
binary it sampled into a build-id cache, and ``perf script`` symbolises from there first.
profkit points perf at its own cache (``<profkit cache>/perf-buildid``, ``perf
--buildid-dir``) rather than ``~/.debug``: a rebuilt PostgreSQL at the same path does
not spoil older recordings, and nothing lands in root's home.

**vDSO frames.** clock_gettime's fast path runs in the vDSO. perf names its frames
(``__vdso_clock_gettime``) only if it finds the image: ``perf record`` caches it under
``[vdso]/<build-id>/vdso`` in the build-id cache, so on this machine ``perf script``
prints ``b46 __vdso_clock_gettime+0x56 ([vdso])``. With another cache, user or machine it
prints ``b46 [unknown] ([vdso])``; for that case the collector keeps a copy of the image
(``vdso.so``, read from this process's own ``[vdso]`` mapping — the kernel maps the same
image into every process) and the folding names those frames from its ELF symbols
(:class:`profkit.parse.perf_script.VdsoSymbols`). Either way the frame is called
``__vdso_clock_gettime``. The image's build-id is checked against the one perf recorded.

**Bad input.** A pid that does not exist, or a backend that exits while perf records,
raises :class:`PerfError` after perf is stopped; perf.data (and, when possible, its perf
script text) stays in the run directory and the message names it. perf missing raises
:class:`~profkit.errors.ToolNotFound` with the package to install. A perf.data whose
PostgreSQL frames cannot be symbolised — nearly all of them ``[unknown]`` while perf
names the postgres binary as their module, i.e. the binary at that path is not the one
that was recorded (rebuilt since, or another machine's) — raises :class:`PerfError`
saying so (:func:`check_symbolisation`).
"""
from __future__ import annotations

import functools
import gzip
import logging
import math
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pandas as pd

from profkit import paths, tables
from profkit.collect import perf_stat
from profkit.collect.artifacts import server_settings
from profkit.rundir import RunDir, load_run
from profkit.errors import CommandFailed, ProbeError, ToolNotFound
from profkit.parse.folded import instrumentation_share, read_folded, write_folded
from profkit.parse.perf_stat import parse_perf_stat
from profkit.parse.perf_script import PerfFolding, VdsoSymbols, dump_vdso, fold_perf_script
from profkit.processes import Background, format_argv, install_hint, which
from profkit.processes import run as run_argv

if TYPE_CHECKING:
    import psycopg

    from profkit.pg.cluster import Cluster

T = TypeVar("T")
log = logging.getLogger("profkit.collect.perf")

DEFAULT_FREQ = 999
SOFTWARE_EVENTS: tuple[str, ...] = ("task-clock", "context-switches", "cpu-migrations",
                                    "page-faults")
HARDWARE_EVENTS: tuple[str, ...] = ("instructions", "cycles", "branches", "branch-misses")
CallGraph = Literal["fp", "dwarf"]

# artifact names inside a run directory
PERF_DATA = "perf.data"
RECORD_LOG = "perf-record.log"
STAT_CSV = "perf-stat.csv"
STAT_LOG = "perf-stat.log"
SCRIPT_TXT = "perf.script.txt"
SCRIPT_ERR = "perf-script.err"
VDSO_IMAGE = "vdso.so"
FOLDED = "stacks.folded"
STACKS_PARQUET = "stacks.parquet"
FUNCTIONS_PARQUET = "functions.parquet"
STAT_PARQUET = "perf_stat.parquet"
QUERY_OUTPUT = "query-output.txt"
# perf script's output: only the fields the folding reads (the default adds symbol offsets
# and, with --inline on by default in newer perfs, addr2line lookups per frame; see
# benchmarks/bench_folding.py for the time each saves)
SCRIPT_ARGS: tuple[str, ...] = ("-F", "comm,tid,time,period,event,ip,sym,dso", "--no-inline")

# A frame-pointer walk ends in one unsymbolised frame in the binary (the return address
# below _start), so a sound recording has ~1 unknown postgres frame in ~20; a binary
# that changed since recording has nearly all of them unknown.
MISMATCH_UNKNOWN_SHARE = 0.5
MISMATCH_MIN_FRAMES = 20


class PerfError(ProbeError):
    """perf could not record or symbolise; the message says why, what was kept, what to do."""


# --------------------------------------------------------------------------- tool

def perf_path(perf: str = "perf") -> str:
    """The perf executable, or :class:`ToolNotFound` with the package that installs it."""
    try:
        return which(perf)
    except ToolNotFound:
        raise ToolNotFound(f"perf not found ({perf!r} is not an executable on PATH or a "
                           f"path); {install_hint('perf')}") from None


def buildid_dir() -> Path:
    """profkit's perf build-id cache (see the module docstring)."""
    return paths.sub("perf-buildid")


def _perf(perf: str, *args: str | os.PathLike[str]) -> list[str]:
    return [perf, "--buildid-dir", str(buildid_dir()), *(str(a) for a in args)]


def hardware_counters(perf: str = "perf") -> bool:
    """True if ``perf stat -e instructions`` counts here (False in most VMs)."""
    return perf_stat.counts("instructions", perf_path(perf))


def stat_events(perf: str = "perf") -> tuple[str, ...]:
    """Events for ``perf stat``: hardware counters where they exist, software always."""
    return (HARDWARE_EVENTS if hardware_counters(perf) else ()) + SOFTWARE_EVENTS


# --------------------------------------------------------------------------- processes

def pid_alive(pid: int) -> bool:
    """True while *pid* exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _perf_event_fds(pid: int) -> int:
    n = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            if "perf_event" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                n += 1
        except OSError:
            continue
    return n


def wait_attached(bg: Background, *, timeout: float = 15.0, settle: float = 0.3) -> bool:
    """Wait until perf (*bg*) holds perf_event descriptors, then *settle* seconds more
    (it maps the ring buffers and enables the events after opening them). False if perf
    exited first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not bg.alive():
            return False
        if _perf_event_fds(bg.pid):
            time.sleep(settle)
            return bg.alive()
        time.sleep(0.02)
    return bg.alive()


def _log_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


_SAMPLES = re.compile(r"\((\d+) samples\)")


def _samples_from_log(text: str) -> int | None:
    m = _SAMPLES.search(text)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- recording

@dataclass(frozen=True)
class PerfRecording:
    """What one ``perf record`` wrote (paths are inside ``run_dir``)."""

    run_id: str
    run_dir: str
    pid: int
    perf_data: str
    record_argv: tuple[str, ...]
    samples: int | None
    freq: int
    call_graph: str
    stat_csv: str | None = None
    vdso_image: str | None = None
    seconds: float = 0.0
    action_seconds: tuple[float, ...] = ()


def record_pid(pid: int, action: Callable[[], T], *, run: RunDir, perf: str = "perf",
               freq: int = DEFAULT_FREQ, call_graph: CallGraph = "fp", stat: bool = True,
               binary: str | os.PathLike[str] | None = None, attach_timeout: float = 15.0,
               stop_timeout: float = 120.0, system_wide: bool = False
               ) -> tuple[PerfRecording, T]:
    """Record *pid* with ``perf record`` (and ``perf stat``) while ``action()`` runs.

    *system_wide*: ``perf record -a`` (every CPU, every process) instead of ``-p PID``,
    for processes that start while recording (a query's parallel workers); the caller
    keeps the samples of the pids it wants (``perf script --pid``).

    Writes perf.data, perf-record.log, vdso.so and (with *stat*) perf-stat.csv into
    *run*; returns the recording and what *action* returned. *binary* is only recorded
    in the provenance (the checks use it later). See the module docstring for errors.
    """
    exe = perf_path(perf)
    if call_graph not in ("fp", "dwarf"):
        raise PerfError(f"call_graph must be 'fp' (frame pointers) or 'dwarf', not "
                        f"{call_graph!r}")
    if freq <= 0:
        raise PerfError(f"freq must be a positive number of samples per second, not {freq}")
    if not pid_alive(pid):
        raise PerfError(f"process {pid} does not exist (has the backend exited? a connection "
                        "that was closed or terminated has no backend): reconnect and pass "
                        "the new backend's pid, e.g. Cluster.backend_pid(conn)")
    data = run.file(PERF_DATA)
    log_path = run.file(RECORD_LOG)
    vdso_path: str | None = None
    try:
        vdso_path = str(dump_vdso(run.file(VDSO_IMAGE)))
        run.add_artifact(VDSO_IMAGE, "this kernel's vDSO image, to name [vdso] frames")
    except Exception:  # noqa: BLE001 - a missing vDSO only loses frame names
        vdso_path = None
    cg = ["-g"] if call_graph == "fp" else ["--call-graph", "dwarf"]
    target = ["-a"] if system_wide else ["-p", str(pid)]
    argv = _perf(exe, "record", "-F", str(freq), *cg, *target, "-o", data)
    run.update(backend_pid=pid, tool_command=format_argv(argv[0:1] + argv[3:]),
               tool_summary=f"perf record -F {freq} {' '.join(cg)}"
                            + (" -a" if system_wide else ""),
               perf={"freq": freq, "call_graph": call_graph, "binary": str(binary or ""),
                     "buildid_dir": str(buildid_dir())})
    rec = Background(argv, stdout_path=log_path, stderr_path=log_path,
                     stop_signal=signal.SIGINT, stop_timeout=stop_timeout, what="perf record")
    st: Background | None = None
    stat_csv = run.file(STAT_CSV)
    t0 = time.monotonic()
    times: list[float] = []
    result: Any = None
    failure: BaseException | None = None
    rec.start()
    try:
        if not wait_attached(rec, timeout=attach_timeout):
            rec.stop()
            text = _log_text(log_path)
            if "No such process" in text or not pid_alive(pid):
                raise PerfError(f"process {pid} exited before perf could attach; nothing was "
                                f"recorded (perf said: {text[-300:]!r})")
            raise PerfError(f"perf record did not start: {text[-800:] or 'no output'} "
                            f"(command: {format_argv(argv)}). If it mentions "
                            "perf_event_paranoid, run as root or lower "
                            "/proc/sys/kernel/perf_event_paranoid.")
        run.add_artifact(PERF_DATA, f"perf record ({call_graph} call graphs, {freq} Hz)")
        run.add_artifact(RECORD_LOG, "perf record's messages")
        if stat:
            st = Background(_perf(exe, "stat", "-x,", "-o", stat_csv,
                                  "-e", ",".join(stat_events(exe)), "-p", str(pid)),
                            stdout_path=run.file(STAT_LOG), stderr_path=run.file(STAT_LOG),
                            stop_signal=signal.SIGINT, stop_timeout=30, what="perf stat")
            st.start()
            wait_attached(st, timeout=attach_timeout, settle=0.0)
            run.add_artifact(STAT_CSV, "perf stat -x, counters over the same window")
        ta = time.monotonic()
        try:
            result = action()
        finally:
            times.append(time.monotonic() - ta)
    except PerfError as e:
        run.finish(status="failed", error=str(e))
        raise
    except BaseException as e:  # noqa: BLE001 - action failed or Ctrl-C: stop perf, keep data
        failure = e
    finally:
        if st is not None:
            st.stop()
            if run.file(STAT_LOG).exists() and run.file(STAT_LOG).stat().st_size == 0:
                run.file(STAT_LOG).unlink()
        rc = rec.stop()
        run.update(record_returncode=rc)
    seconds = time.monotonic() - t0
    log = _log_text(log_path)
    samples = _samples_from_log(log)
    recording = PerfRecording(
        run_id=run.run_id, run_dir=str(run.path), pid=pid, perf_data=str(data),
        record_argv=tuple(argv), samples=samples, freq=freq, call_graph=call_graph,
        stat_csv=str(stat_csv) if stat and stat_csv.exists() else None,
        vdso_image=vdso_path, seconds=seconds, action_seconds=tuple(times))
    run.update(samples=samples, recording_seconds=round(seconds, 3))
    exited = not pid_alive(pid)
    if failure is not None or exited:
        if isinstance(failure, KeyboardInterrupt):
            run.finish(status="interrupted")
            raise failure
        kept = _keep_what_we_can(run, exe)
        what = (f"process {pid} exited while perf was recording" if exited
                else f"the profiled action failed while perf was recording: {failure}")
        run.finish(status="failed", error=what)
        again = (" Reconnect (a new backend has a new pid) and record again." if exited
                 else "")
        raise PerfError(f"{what}. perf was stopped; what it recorded is kept: {kept} "
                        f"(run {run.run_id}).{again}") from failure
    if rc not in (0, -signal.SIGINT, 128 + signal.SIGINT):
        raise PerfError(f"perf record failed with exit status {rc}: {log[-800:]} (perf.data "
                        f"kept at {data})")
    if not data.exists() or data.stat().st_size == 0:
        raise PerfError(f"perf record wrote no data ({data}); its log: {log[-800:]}")
    return recording, result


def _keep_what_we_can(run: RunDir, perf: str) -> str:
    """After a failure: name the perf.data kept and try to convert it to text too."""
    data = run.file(PERF_DATA)
    if not data.exists() or data.stat().st_size == 0:
        return "nothing (perf.data is empty)"
    samples = _samples_from_log(_log_text(run.file(RECORD_LOG)))
    msg = f"{data} ({samples if samples is not None else '?'} samples)"
    try:
        txt = script(run, perf=perf)
        msg += f" and its perf script text {txt}"
    except Exception as e:  # noqa: BLE001 - best effort: perf.data itself is what counts
        log.warning("could not convert %s to text: %s", data, e)
    return msg


@dataclass(frozen=True)
class QueryResult:
    """The last repetition's result rows and every repetition's wall time."""

    rows: list[tuple[Any, ...]]
    seconds: tuple[float, ...]


def run_query(conn: psycopg.Connection, sql: str, reps: int = 1) -> QueryResult:
    """Run *sql* *reps* times on *conn*, fetching everything (EXPLAIN output included)."""
    rows: list[tuple[Any, ...]] = []
    times: list[float] = []
    for _ in range(max(1, reps)):
        t = time.perf_counter()
        cur = conn.execute(sql)
        rows = cur.fetchall() if cur.description is not None else []
        times.append(time.perf_counter() - t)
    return QueryResult(rows, tuple(times))


def format_rows(rows: Sequence[tuple[Any, ...]]) -> str:
    out = []
    for r in rows:
        out.append("\t".join(str(v) for v in r) if len(r) != 1 or not isinstance(r[0], str)
                   else r[0])
    return "\n".join(out) + ("\n" if out else "")


def record_query(cl: Cluster, conn: psycopg.Connection, sql: str, *, run: RunDir,
                 reps: int = 1, scale: float | None = None, query_name: str | None = None,
                 perf: str = "perf", freq: int = DEFAULT_FREQ, call_graph: CallGraph = "fp",
                 stat: bool = True) -> tuple[PerfRecording, QueryResult]:
    """Record the backend behind *conn* while it runs *sql* (``reps`` times).

    *run*: the run it writes into, opened by the caller with
    :func:`profkit.rundir.open_run` (which names the folder and writes the final status;
    :func:`profkit.experiments.profile.perf_on_cluster` does both steps). Records, writes
    the query's output (EXPLAIN text) to query-output.txt. Parsing is :func:`fold_run`.
    """
    perf_path(perf)  # a missing perf fails before anything is recorded
    pid = cl.backend_pid(conn)
    run.update(query=sql, reps=reps, scale=scale, query_name=query_name,
               settings=server_settings(conn), cluster={"port": cl.port,
                                                        "datadir": str(cl.datadir)})
    rec, res = record_pid(pid, lambda: run_query(conn, sql, reps), run=run, perf=perf,
                          freq=freq, call_graph=call_graph, stat=stat,
                          binary=cl.build.postgres)
    run.file(QUERY_OUTPUT).write_text(format_rows(res.rows))
    run.add_artifact(QUERY_OUTPUT, "the query's output (last repetition)")
    run.update(query_seconds=[round(s, 6) for s in res.seconds])
    return rec, res


# --------------------------------------------------------------------------- perf script

def script(run: RunDir, *, perf: str = "perf", compress: bool = False,
           symfs: str | os.PathLike[str] | None = None,
           buildid_cache: str | os.PathLike[str] | None = None,
           timeout: float = 1800, args: Sequence[str] = SCRIPT_ARGS,
           pids: Sequence[int] | None = None) -> Path:
    """``perf script -i perf.data`` → perf.script.txt (or .txt.gz), streamed to the file.

    *symfs*: look binaries up under this directory (perf's ``--symfs``), for a perf.data
    brought from another machine. *buildid_cache*: another build-id cache than
    profkit's (an empty directory shows what perf makes of the binaries alone). *args*:
    perf script's field options (default :data:`SCRIPT_ARGS`); *pids*: only these
    processes' samples (``--pid``).
    """
    exe = perf_path(perf)
    data = run.file(PERF_DATA)
    if not data.exists():
        raise PerfError(f"no {PERF_DATA} in {run.path}: record first (record_query)")
    out = run.file(SCRIPT_TXT)
    err = run.file(SCRIPT_ERR)
    out.unlink(missing_ok=True)
    argv = _perf(exe, "script", "-i", data, *args)
    if pids:
        argv += ["--pid", ",".join(str(p) for p in pids)]
    if buildid_cache is not None:
        argv[2] = str(buildid_cache)
    if symfs is not None:
        argv += ["--symfs", str(symfs)]
    try:
        cp = run_cmd(argv, timeout=timeout, stdout_path=out)
    except CommandFailed as e:
        raise PerfError(f"perf script could not read {data}: {e.output_tail[-800:]} (a "
                        "perf.data from a perf killed with SIGKILL is unreadable; record "
                        "again)") from None
    if cp.stderr and cp.stderr.strip():
        err.write_text(cp.stderr)
        run.add_artifact(SCRIPT_ERR, "perf script's warnings")
    if compress:
        gz = run.file(SCRIPT_TXT + ".gz")
        with open(out, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        out.unlink()
        out = gz
    run.add_artifact(out.name, "perf script text (input of the folding)")
    return out


# the one place this module runs a command for its output file (kept separate for tests)
run_cmd = functools.partial(run_argv, what="perf script")


def script_path(run: RunDir) -> Path:
    for name in (SCRIPT_TXT, SCRIPT_TXT + ".gz"):
        if run.file(name).exists():
            return run.file(name)
    raise PerfError(f"no perf script text in {run.path}: run profkit.collect.perf.script()")


# --------------------------------------------------------------------------- folding

@dataclass(frozen=True)
class PerfProfile:
    """A recording folded into tables (also written as parquet in the run directory)."""

    run: RunDir
    folding: PerfFolding
    stacks: pd.DataFrame
    functions: pd.DataFrame
    stat: pd.DataFrame | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, float]:
        return self.folding.counts

    @property
    def instrumentation_share(self) -> float:
        return instrumentation_share(self.functions)

    def top(self, n: int = 10) -> pd.DataFrame:
        """The *n* functions with the most self samples."""
        cols = ["function", "module", "self", "self_share", "total", "total_share"]
        return self.functions[cols].head(n).reset_index(drop=True)


#: The fewest samples a profile's shares mean something with. A function holding a share p
#: of the time shows up in a profile of n samples with a binomial standard error of
#: sqrt(p(1-p)/n): for a 5 % function that is ±2.2 points at n = 100 (its share reads
#: 1-9 % at 95 %), ±6.9 points at 10, and at 2 samples every share is 0, 50 or 100 %.
#: Below this, profkit says how many samples the recording gave and how to get more, and
#: withholds its one-number summary (the instrumentation share): a single percentage is
#: what gets quoted, and off 2 samples it is noise. Tables keep their sample counts.
MIN_SAMPLES = 100


@dataclass(frozen=True)
class SampleShortfall:
    """A recording with fewer than :data:`MIN_SAMPLES` samples, and what it ran."""

    samples: int
    freq: int | None                # perf record -F
    seconds: float | None           # how long the recorded work ran (all repetitions)
    reps: int = 1                   # repetitions of the query (1: once, or not a query)
    query: bool = True              # a query ran while recording (else: a backend for seconds)
    minimum: int = MIN_SAMPLES

    def per_rep(self) -> float:
        """Samples one repetition gave (the expected count from the frequency when perf
        kept none)."""
        if self.samples > 0:
            return self.samples / max(self.reps, 1)
        if self.freq and self.seconds:
            return max(self.freq * self.seconds / max(self.reps, 1), 0.01)
        return 0.01

    def repeat_needed(self) -> int:
        """Repetitions that give the minimum, with a 25 % margin, or twice the minimum when
        the rate comes from fewer than 25 samples: a count of n is only known to about
        ±2√n; doubled again when the rate comes from one run (see below)."""
        margin = 1.25 if self.samples >= 25 else 2.0
        if self.reps <= 1 and self.query:
            # one run in a new session also filled its caches and planned: here the first
            # run of join_sum's query gave 5 samples and the 40 after it 1.7 each
            margin *= 2
        return max(2, math.ceil(margin * self.minimum / self.per_rep()))

    def message(self, *, freq_flag: str = "--freq", repeat_flag: str | None = "--reps",
                max_freq: int | None = None) -> str:
        """What happened and what to do, in the words of the front door that recorded it
        (*freq_flag*, *repeat_flag*: its options; *max_freq*: the highest -F worth
        suggesting, default 10x the one used)."""
        n = self.samples
        head = (f"too few samples for a profile: {n} (shares need >= {self.minimum}: a "
                f"5 % function's share is then known to about ±2 points)")
        hz = f"{self.freq:g} Hz" if self.freq else "the frequency used"
        if self.query and self.seconds is not None:
            times = f" ({self.reps} runs)" if self.reps > 1 else ""
            ran = (f"the query ran {_fmt_s(self.seconds)}{times}; at {hz} that is about "
                   f"{(self.freq or 0) * self.seconds:.0f} samples of CPU time, perf kept {n}")
        elif self.seconds is not None:
            ran = (f"the backend was recorded for {_fmt_s(self.seconds)} and was on a CPU for "
                   f"about {_fmt_s(n / self.freq) if self.freq else '?'} of it ({n} samples at "
                   f"{hz})")
        else:
            ran = f"{n} samples at {hz}"
        fixes = []
        if self.query and repeat_flag:
            fixes.append(f"run the query more times in the recording: {repeat_flag} "
                         f"{self.repeat_needed()}")
        if not self.query:
            fixes.append("record while the backend is busy, or for longer (or record a query, "
                         f"repeated: {repeat_flag or 'N times'})")
        aside = ""
        if self.freq:
            want = math.ceil(self.freq * 1.25 * self.minimum / max(n, 1))
            cap = max_freq or self.freq * 10
            if want <= cap:
                fixes.append(f"raise the frequency: {freq_flag} {want}")
            else:
                aside = f" (a higher {freq_flag} alone would need {freq_flag} {want}, over {cap})"
        return f"{head}: {ran}. To fix: {'; or '.join(fixes)}{aside}."


def _fmt_s(s: float) -> str:
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def max_sample_rate() -> int | None:
    """This kernel's ceiling on perf's frequency (kernel.perf_event_max_sample_rate)."""
    try:
        return int(Path("/proc/sys/kernel/perf_event_max_sample_rate").read_text())
    except (OSError, ValueError):
        return None


def sample_shortfall(prof: PerfProfile) -> SampleShortfall | None:
    """None when *prof* has at least :data:`MIN_SAMPLES` samples; else what it ran, read
    from its run's provenance (a profkit recording, or a pk-record.sh capture imported)."""
    n = int(prof.folding.samples)
    if n >= MIN_SAMPLES:
        return None
    prov = prof.run.provenance
    cap = prov.get("capture") or {}
    freq = prof.run.get("perf.freq") or cap.get("freq")
    reps = prov.get("reps") or cap.get("repeat") or 1
    seconds: float | None = None
    query = True
    if prov.get("query_seconds"):
        seconds = float(sum(prov["query_seconds"]))
    elif cap.get("query_ms"):
        seconds = sum(float(t) for t in str(cap["query_ms"]).split()) / 1000
    elif cap:
        query = cap.get("what") == "query"
        try:
            seconds = float(cap["seconds"]) if cap.get("seconds") else None
        except ValueError:
            seconds = None
    else:
        query = bool(prov.get("query"))
        seconds = prov.get("recording_seconds")
    try:
        return SampleShortfall(samples=n, freq=int(freq) if freq else None,
                               seconds=float(seconds) if seconds is not None else None,
                               reps=int(reps), query=query)
    except (TypeError, ValueError):
        return SampleShortfall(samples=n, freq=None, seconds=None, query=query)


def _build_id(path: str | os.PathLike[str]) -> str | None:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            for sec in elf.iter_sections():
                if sec.header["sh_type"] == "SHT_NOTE":
                    for note in sec.iter_notes():
                        if note["n_type"] == "NT_GNU_BUILD_ID":
                            return str(note["n_desc"])
    except (OSError, ELFError):
        return None
    return None


def recorded_build_ids(run: RunDir, perf: str = "perf") -> dict[str, str]:
    """DSO path → build-id as perf recorded them (``perf buildid-list``)."""
    exe = perf_path(perf)
    cp = run_argv([*_perf(exe, "buildid-list", "-i", run.file(PERF_DATA))], timeout=120,
             check=False, what="perf buildid-list")
    out: dict[str, str] = {}
    for line in (cp.stdout or "").splitlines():
        bid, _, dso = line.strip().partition(" ")
        if dso:
            out[dso.strip()] = bid
    return out


def check_symbolisation(folding: PerfFolding, binary: str | os.PathLike[str], *,
                        recorded_build_id: str | None = None) -> tuple[int, int]:
    """Raise :class:`PerfError` if *binary*'s frames are (nearly) all unsymbolised.

    Counts, weighted by samples, the frames whose module is *binary* and how many of
    them perf left as ``[unknown]`` (named ``[postgres]`` by the folding). Returns
    ``(unknown, total)``. More than half unknown (over at least a few frames) means the
    binary at that path is not the one that was recorded.
    """
    b = str(binary)
    base = os.path.basename(b)
    unknown_name = f"[{base}]"
    in_binary = {n for n, m in folding.modules.items()
                 if m == b or (m and os.path.basename(m) == base)}
    unknown = total = 0.0
    for stack, w in folding.counts.items():
        for f in stack.split(";")[1:]:
            if f in in_binary:
                total += w
                if f == unknown_name:
                    unknown += w
    if total >= MISMATCH_MIN_FRAMES and unknown / total > MISMATCH_UNKNOWN_SHARE:
        now = _build_id(b)
        ids = ""
        if recorded_build_id or now:
            ids = (f" (build-id recorded {recorded_build_id or '?'}, now {now or '?'} at "
                   f"that path)")
        raise PerfError(
            f"{unknown / total:.0%} of the {int(total)} stack frames in {b} could not be "
            f"symbolised: the binary changed since recording{ids}, or the perf.data comes "
            "from another machine. perf.data and its text are kept. Profile again with the "
            "current build, or symbolise with the recorded binary: keep its build-id cache "
            f"({buildid_dir()}) or pass symfs= a directory holding it.")
    return int(unknown), int(total)


def fold_run(run: RunDir | str | os.PathLike[str], *, perf: str = "perf",
             binary: str | os.PathLike[str] | None = None, check: bool = True,
             compress: bool = False, symfs: str | os.PathLike[str] | None = None,
             buildid_cache: str | os.PathLike[str] | None = None) -> PerfProfile:
    """perf script (if not done yet) → folded stacks → stacks/functions/perf_stat tables.

    Writes stacks.folded, stacks.parquet, functions.parquet and perf_stat.parquet into
    the run directory. *binary* (default: the build's postgres from the provenance)
    is checked with :func:`check_symbolisation` unless ``check=False``.
    """
    rd = run if isinstance(run, RunDir) else load_run(run)
    try:
        txt = script_path(rd)
    except PerfError:
        txt = script(rd, perf=perf, compress=compress, symfs=symfs,
                     buildid_cache=buildid_cache)
    vdso: VdsoSymbols | None = None
    if rd.file(VDSO_IMAGE).exists():
        try:
            vdso = VdsoSymbols.from_image(rd.file(VDSO_IMAGE))
        except Exception:  # noqa: BLE001 - the frames then stay "[vdso]"
            vdso = None
    # profkit's own reading, not stackcollapse-perf.pl's default: 1 per sample, vDSO
    # frames named from the saved image, truncated or garbled text refused
    folding = fold_perf_script(txt, vdso=vdso, vdso_names=True, weight="samples", strict=True)
    build = str(rd.provenance.get("build_name") or "")
    if binary is None:
        binary = (rd.get("perf.binary") or rd.get("build.postgres")) or None
    unknown_total: tuple[int, int] | None = None
    if binary:
        rec_id = None
        if check:
            try:
                rec_id = recorded_build_ids(rd, perf).get(str(binary))
            except Exception:  # noqa: BLE001 - only enriches the message
                rec_id = None
            if vdso is not None and vdso.build_id:
                rd.update(vdso_build_id=vdso.build_id)
        try:
            unknown_total = check_symbolisation(folding, binary, recorded_build_id=rec_id)
        except PerfError:
            if check:
                rd.update(status="unsymbolised")
                raise
    stacks = folding.stacks_df(run_id=rd.run_id, build=build, tool="perf")
    functions = folding.functions_df(run_id=rd.run_id, build=build, tool="perf")
    write_folded(folding.counts, rd.file(FOLDED))
    stacks.to_parquet(rd.file(STACKS_PARQUET), index=False)
    functions.to_parquet(rd.file(FUNCTIONS_PARQUET), index=False)
    stat_df = None
    if rd.file(STAT_CSV).exists():

        stat_df = parse_perf_stat(rd.file(STAT_CSV), run_id=rd.run_id, build=build)
        stat_df.to_parquet(rd.file(STAT_PARQUET), index=False)
        rd.add_artifact(STAT_PARQUET, "perf_stat table")
    for name, what in ((FOLDED, "folded stacks (stackcollapse format)"),
                       (STACKS_PARQUET, "stacks table"),
                       (FUNCTIONS_PARQUET, "functions table (self/total samples)")):
        rd.add_artifact(name, what)
    share = instrumentation_share(functions)
    rd.finish(status="complete", samples_folded=folding.samples, events=list(folding.events),
              instrumentation_share=round(share, 6),
              unknown_binary_frames=list(unknown_total) if unknown_total else None)
    return PerfProfile(rd, folding, stacks, functions, stat_df,
                       {"instrumentation_share": share})


def load_profile(run: RunDir | str | os.PathLike[str]) -> PerfProfile:
    """A folded run read back from its directory (no perf needed)."""

    rd = run if isinstance(run, RunDir) else load_run(run)
    if not rd.file(FUNCTIONS_PARQUET).exists():
        raise PerfError(f"run {rd.run_id} has not been folded yet: fold_run({str(rd.path)!r})")
    counts = read_folded(rd.file(FOLDED), strict=True)
    folding = PerfFolding(counts=counts, modules={}, samples=int(sum(counts.values())))
    stacks = tables.validate(pd.read_parquet(rd.file(STACKS_PARQUET)), "stacks")
    functions = tables.validate(pd.read_parquet(rd.file(FUNCTIONS_PARQUET)), "functions")
    stat = (tables.validate(pd.read_parquet(rd.file(STAT_PARQUET)), "perf_stat")
            if rd.file(STAT_PARQUET).exists() else None)
    return PerfProfile(rd, folding, stacks, functions, stat,
                       {"instrumentation_share": instrumentation_share(functions)})
