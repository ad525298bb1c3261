"""The overhead benchmark: plain query vs EXPLAIN ANALYZE (TIMING off / on), across builds.

One throwaway cluster per build, all started up front and loaded with the same
workload at the same scale; after a warm-up, *reps* repetitions run in an
interleaved order: every repetition executes each (build, mode) pair once, in an
order shuffled by a seeded generator, so slow drift of a shared, noisy machine
(other processes, host steal time) falls on every build and mode alike instead of
on whichever ran last.

Per execution (one row of the ``timings`` table, profkit/tables.py):

- ``client_ms``: wall time around the simple-protocol round trip in the client,
  result rows fetched and discarded (the count row; the plan text for EXPLAIN).
  Auto-prepare is off, so every execution is parsed and planned like the first.
- ``server_ms``: the statement's ``total_exec_time`` delta in pg_stat_statements
  (the calls delta is checked to be exactly 1). For EXPLAIN this is the utility
  statement, which includes planning the inner query (~0.2 ms here) — a plain
  SELECT's execution time does not; at the benchmark scales that is < 0.1 % of a
  query.
- ``cpu_ms`` (extra column): the backend's on-CPU time over the execution, from
  ``/proc/PID/schedstat`` read while it is idle before and after. On an idle machine
  it equals ``server_ms``; on a shared one it leaves out the time the backend waited
  for a core, so it is the report's headline measure where recorded
  (:func:`default_metric`). Measured here (vanilla, scale 0.05, 12 reps, three busy
  loops competing for the 2 cores): Query-2 overhead 31.4 % [30.2, 33.9] by
  ``cpu_ms`` against 15.1 % [−15.3, 53.3] by ``server_ms``; idle, all three agree
  (31–38 %).
- ``explain_ms``/``planning_ms`` (extra columns): EXPLAIN's own "Execution Time" /
  "Planning Time" lines (NaN for the plain query).

Everything lands in the run directory as it happens, so a run that dies at
repetition 7 keeps repetitions 1–6: ``provenance.json`` is written before the first
cluster starts and rewritten at the end (status complete / interrupted / failed,
with the error); each row is appended to ``timings.csv`` with one ``write`` and an
``fsync`` (a write that fails half-way is truncated back, so the file stays
parseable); ``timings.parquet`` is written at the end (also after a failure, from
the rows measured). Instruction counts of one execution per build and mode go to
``instructions.csv`` (callgrind here; ``perf stat -e instructions`` where the CPU
counts them). :func:`write_report` turns the directory into ``summary.csv``,
``report.md`` and the overhead chart, reading only files.
"""
from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import errno
import io
import itertools
import json
import logging
import math
import os
import random
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd

from profkit.procfs import schedstat
from profkit import paths, tables
from profkit.errors import ComparisonError, ProfkitError

if TYPE_CHECKING:
    import psycopg

    from profkit.pg.build import Build
    from profkit.pg.cluster import Cluster
    from profkit.pg.workloads import Workload

log = logging.getLogger("profkit.bench")

TIMINGS_CSV = "timings.csv"
TIMINGS_PARQUET = "timings.parquet"
INSTRUCTIONS_CSV = "instructions.csv"
PROVENANCE_JSON = "provenance.json"
SUMMARY_CSV = "summary.csv"
REPORT_MD = "report.md"
CHART_PNG = "overheads.png"
CHART_SVG = "overheads.svg"

DEFAULT_MODES: tuple[str, ...] = ("plain", "analyze_notiming", "analyze_timing")

#: Columns of timings.csv: the ``timings`` table, then what the runner adds.
#: ``order`` is the execution's position in the whole run (0..N-1), ``slot`` its
#: position inside its repetition; ``t_start`` the Unix time it started (drift plots).
TIMINGS_COLUMNS: tuple[str, ...] = (
    *tables.SCHEMAS["timings"], "cpu_ms", "explain_ms", "planning_ms", "slot", "backend_pid",
    "preset", "t_start",
)

# How the work of a workload grows with its scale (nested_loop: |test1⋈test3| × |test2|).
# Used only to pick a smaller scale for callgrind when the bench scale would take too long.
WORK_EXPONENT: dict[str, float] = {"nested_loop": 2.0, "join_sum": 2.0, "count_star": 1.0}
# Measured here: an executor-bound backend runs 57-117x slower under callgrind.
CALLGRIND_SLOWDOWN = 100.0
CALLGRIND_STARTUP_S = 5.0
#: Default callgrind time budget per build (seconds) when choosing the counting scale.
CALLGRIND_BUDGET_S = 60.0
MIN_INSTR_SCALE = 0.002

# A provenance field must be equal in two runs before their timings are pooled
# (pyperf's checked metadata): same machine kind, clock, workload and scale.
BENCH_CHECKED_FIELDS: tuple[str, ...] = (
    "machine.cpu_model", "machine.kernel", "machine.clocksource", "machine.virtualization",
    "machine.cpus", "workload", "scale", "source.version",
)

InstructionCounter = Literal["auto", "callgrind", "perf_stat", "none"]


class BenchError(ProfkitError):
    """The benchmark cannot run or stopped; ``run_dir``/``rows`` say what was kept."""

    def __init__(self, message: str, *, run_dir: Path | None = None, rows: int = 0) -> None:
        super().__init__(message)
        self.run_dir = run_dir
        self.rows = rows


class ServerCrashed(BenchError):
    """A backend or postmaster died during the run."""


class ProfilesFull(BenchError):
    """No space left in the profiles folder."""


# ---------------------------------------------------------------------------
# input


@dataclass(frozen=True)
class BuildRef:
    """A build in a benchmark: the label its rows carry and the preset it is built from.

    ``"step1"`` is label and preset at once; ``"a=vanilla"`` runs preset vanilla under
    the label ``a`` (two labels on one preset make an A/A run: a check of the noise).
    """

    label: str
    preset: str


_LABEL = re.compile(r"^[A-Za-z0-9_.+-]+$")
_GUC = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def parse_builds(builds: str | Sequence[Any]) -> list[BuildRef]:
    """Build references from ``"vanilla,step1"``, a list of names, or Build objects.

    Raises :class:`BenchError` for an empty list, a duplicate label or an unknown
    preset (naming the known ones) — before anything is built or started.
    """
    from profkit.pg.build import Build, presets

    items: list[Any]
    if isinstance(builds, str):
        items = [s for s in (x.strip() for x in builds.split(",")) if s]
    else:
        items = list(builds)
    if not items:
        raise BenchError("no builds given: pass build presets, e.g. --builds vanilla,step1")
    refs: list[BuildRef] = []
    for it in items:
        if isinstance(it, Build):
            refs.append(BuildRef(it.name, it.name))
            continue
        if isinstance(it, BuildRef):
            refs.append(it)
            continue
        if not isinstance(it, str):
            raise BenchError(f"a build is a preset name (str), not {type(it).__name__}: {it!r}")
        label, sep, preset = it.partition("=")
        # "pg19/step3" alone is labelled "pg19-step3" (a label names files)
        label, preset = label.strip(), (preset.strip() if sep else label.strip())
        if not sep:
            label = label.replace("/", "-")
        if not label or not _LABEL.match(label):
            raise BenchError(f"build label {label!r} may only contain letters, digits and _.+-")
        refs.append(BuildRef(label, preset))
    labels = [r.label for r in refs]
    dups = sorted({x for x in labels if labels.count(x) > 1})
    if dups:
        raise BenchError(f"build {', '.join(dups)} given twice; to run one preset twice "
                         "(an A/A check) give the copies labels: a=vanilla,b=vanilla")
    known = presets()
    unknown = [r.preset for r in refs if r.preset not in known and not
               any(isinstance(i, Build) and i.name == r.preset for i in items)]
    if unknown:
        raise BenchError(f"unknown build {', '.join(map(repr, unknown))}; known presets: "
                         f"{', '.join(sorted(known))} (`profkit build --list`)")
    return refs


def parse_settings(items: Sequence[str] | Mapping[str, Any] | None) -> dict[str, str]:
    """Server settings from ``["name=value", ...]`` or a dict, checked for safe names.

    The values go into postgresql.conf as ``name = 'value'``: a quote or line break in a
    value, or a name that is not a GUC name, is refused with :class:`BenchError`.
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
                raise BenchError(f"setting {it!r} is not name=value (e.g. --set work_mem=64MB)")
            pairs.append((name.strip(), value.strip()))
    out: dict[str, str] = {}
    for name, value in pairs:
        v = str(value).lower() if isinstance(value, bool) else str(value)
        if not _GUC.match(name):
            raise BenchError(f"{name!r} is not a PostgreSQL setting name")
        if "'" in v or "\n" in v or "\\" in v:
            raise BenchError(f"setting {name}: the value {v!r} may not contain quotes, "
                             "backslashes or line breaks")
        out[name] = v
    spl = out.get("shared_preload_libraries")
    if spl is not None and "pg_stat_statements" not in [x.strip() for x in spl.split(",")]:
        raise BenchError("shared_preload_libraries must keep pg_stat_statements: the server-"
                         "side times come from it (e.g. --set shared_preload_libraries="
                         "pg_stat_statements,auto_explain)")
    return out


@dataclass(frozen=True)
class BenchRequest:
    """A checked benchmark request (what :func:`check_request` returns)."""

    refs: tuple[BuildRef, ...]
    workload: str
    scale: float
    reps: int
    modes: tuple[str, ...]
    warmup: int
    settings: dict[str, str]


def check_request(builds: str | Sequence[Any], workload: str, scale: float, reps: int,
                  modes: Sequence[str] | str = DEFAULT_MODES, warmup: int = 1,
                  settings: Sequence[str] | Mapping[str, Any] | None = None) -> BenchRequest:
    """Validate everything about a run before anything is built, started or written."""
    from profkit.pg.workloads import EXPLAIN_PREFIX, check_scale, get_workload

    get_workload(workload)  # WorkloadError naming the known ones
    check_scale(scale)
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise BenchError(f"reps must be an integer >= 1, got {reps!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise BenchError(f"warmup must be an integer >= 0, got {warmup!r}")
    if isinstance(modes, str):
        modes = [m.strip() for m in modes.split(",") if m.strip()]
    modes = tuple(modes)
    bad = [m for m in modes if m not in EXPLAIN_PREFIX]
    if bad:
        raise BenchError(f"unknown mode {', '.join(map(repr, bad))}; known: "
                         f"{', '.join(EXPLAIN_PREFIX)}")
    if len(set(modes)) != len(modes):
        raise BenchError(f"a mode is given twice: {', '.join(modes)}")
    if "plain" not in modes:
        raise BenchError("modes must include 'plain': every overhead is relative to the plain "
                         "query of the same build")
    refs = parse_builds(builds)
    return BenchRequest(tuple(refs), workload, float(scale), reps, modes, warmup,
                        parse_settings(settings))


# ---------------------------------------------------------------------------
# progress


ProgressFn = Callable[[str], None]


class _Reporter:
    """Progress for a run: a rich bar (``progress=True``), a callable, or nothing."""

    def __init__(self, progress: bool | ProgressFn | None) -> None:
        self._fn: ProgressFn | None = None
        self._rich: Any = None
        self._task: Any = None
        self._lock = threading.Lock()
        if progress is True:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._rich = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(),
                                  TimeRemainingColumn(), console=Console(stderr=True),
                                  transient=False)
        elif callable(progress):
            self._fn = progress

    def __enter__(self) -> _Reporter:  # noqa: PYI034 - a private, final class
        if self._rich is not None:
            self._rich.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.stop()

    def say(self, msg: str) -> None:
        with self._lock:
            if self._rich is not None:
                self._rich.console.log(msg)
            elif self._fn is not None:
                self._fn(msg)

    def phase(self, description: str, total: int) -> None:
        if self._rich is not None:
            if self._task is not None:
                self._rich.update(self._task, visible=False)
            self._task = self._rich.add_task(description, total=total)
        elif self._fn is not None:
            self._fn(f"{description} ({total})")

    def advance(self, description: str | None = None) -> None:
        if self._rich is not None and self._task is not None:
            kw = {"description": description} if description else {}
            self._rich.update(self._task, advance=1, **kw)
        elif self._fn is not None and description:
            self._fn(description)


# ---------------------------------------------------------------------------
# files


def _is_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


def _full_message(out_dir: Path, e: OSError, rows: int) -> str:
    kept = (f"; the {rows} rows measured before are kept in {out_dir / TIMINGS_CSV}"
            if rows else "")
    return (f"profiles folder is full: free space or choose --out (writing in {out_dir} "
            f"failed: {e.strerror or e}){kept}")


class _RowWriter:
    """Append-only CSV with one ``write`` + ``fsync`` per row.

    A write that fails (disk full) is truncated back to the last whole row, so the file
    always parses and holds every row that was reported written.
    """

    def __init__(self, path: Path, columns: Sequence[str]) -> None:
        self.path = path
        self.columns = tuple(columns)
        self.rows = 0
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            self._append(self._line(self.columns))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _line(values: Sequence[Any]) -> bytes:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(values)
        return buf.getvalue().encode()

    @staticmethod
    def _cell(v: Any) -> Any:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        if isinstance(v, float):
            return repr(v)
        return v

    def _append(self, data: bytes) -> None:
        pos = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            n = os.write(self._fd, data)
            if n != len(data):  # a short write to a regular file means the disk filled up
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
            os.fsync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, pos)
            raise

    def write(self, row: Mapping[str, Any]) -> None:
        self._append(self._line([self._cell(row.get(c)) for c in self.columns]))
        self.rows += 1

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def new_run_id(workload: str, root: Path | None = None) -> str:
    """``20261130-031500-nested_loop`` (local time); ``-2``, ``-3``... if taken in *root*."""
    base = f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{workload}"
    if root is None:
        return base
    rid, n = base, 1
    while (root / rid).exists():
        n += 1
        rid = f"{base}-{n}"
    return rid


def update_latest(run_dir: Path) -> Path:
    """Point ``<profiles>/latest`` at *run_dir* (a relative symlink, replaced atomically)."""
    run_dir = Path(run_dir)
    root = run_dir.parent
    link = root / "latest"
    if link.exists() and not link.is_symlink():
        raise BenchError(f"{link} exists and is not a symlink: move it away so profkit can "
                         "point 'latest' at the newest run")
    tmp = root / f".latest.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(run_dir.name, tmp)
    os.replace(tmp, link)
    return link


def load_timings(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """The run's timings: ``timings.parquet`` if written, else the streamed ``timings.csv``.

    The CSV is what survives a run that died; rows are whole (see :class:`_RowWriter`).
    """
    d = Path(run_dir)
    pq = d / TIMINGS_PARQUET
    if pq.exists():
        return tables.validate(pd.read_parquet(pq), "timings")
    cv = d / TIMINGS_CSV
    if not cv.exists():
        raise BenchError(f"no timings in {d}: neither {TIMINGS_PARQUET} nor {TIMINGS_CSV} "
                         "(is it a `profkit bench` run directory?)")
    df = pd.read_csv(cv, dtype={"run_id": "string", "build": "string", "workload": "string",
                                "query": "string", "mode": "string", "preset": "string"})
    df = df.dropna(subset=["rep", "order"])
    return tables.validate(df, "timings")


def load_instructions(run_dir: str | os.PathLike[str]) -> pd.DataFrame | None:
    """``instructions.csv`` as the ``instr_counts`` table, or None when not counted."""
    p = Path(run_dir) / INSTRUCTIONS_CSV
    if not p.exists():
        return None
    df = pd.read_csv(p, dtype={"run_id": "string", "build": "string", "workload": "string",
                               "query": "string", "mode": "string", "tool": "string",
                               "scope": "string"})
    return tables.validate(df, "instr_counts")


def load_provenance(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The run's provenance.json exactly as written (nothing filled in from this machine)."""
    p = Path(run_dir) / PROVENANCE_JSON
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise BenchError(f"no {PROVENANCE_JSON} in {run_dir}: not a benchmark run") from None
    except ValueError as e:
        raise BenchError(f"{p} is damaged ({e})") from None


def load_bench(run_dir: str | os.PathLike[str] | None = None) -> BenchResult:
    """A benchmark run read back from its directory (default: ``profiles/latest``)."""
    d = Path(run_dir) if run_dir is not None else paths.profiles_dir() / "latest"
    prov = load_provenance(d)
    return BenchResult(str(prov.get("run_id") or d.resolve().name), d.resolve(),
                       load_timings(d), load_instructions(d), prov)


def _get(d: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = d
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def check_comparable(a: Mapping[str, Any], b: Mapping[str, Any], *, force: bool = False,
                     fields: Sequence[str] = BENCH_CHECKED_FIELDS) -> dict[str, tuple[Any, Any]]:
    """Differences of the checked provenance fields of two runs.

    Raises :class:`ComparisonError` listing them unless *force* (then returns them). A
    field missing from one run counts as different: an old run is never completed with
    this machine's values.
    """
    diff = {f: (_get(a, f), _get(b, f)) for f in fields if _get(a, f) != _get(b, f)}
    if diff and not force:
        lines = "; ".join(f"{k}: {x!r} vs {y!r}" for k, (x, y) in diff.items())
        raise ComparisonError(f"runs {a.get('run_id')} and {b.get('run_id')} are not "
                              f"comparable ({lines}); pass force=True to compare anyway")
    return diff


# ---------------------------------------------------------------------------
# the run


@dataclass
class _Target:
    """One build's running cluster and the connection the benchmark drives."""

    ref: BuildRef
    build: Build
    cluster: Cluster
    conn: psycopg.Connection | None = None
    backend_pid: int = 0
    qids: dict[str, int] = field(default_factory=dict)


class _ExecFailed(Exception):
    def __init__(self, target: _Target, mode: str, err: BaseException) -> None:
        super().__init__(str(err))
        self.target = target
        self.mode = mode
        self.err = err


_EXEC_TIME = re.compile(r"Execution Time: ([0-9.]+) ms")
_PLAN_TIME = re.compile(r"Planning Time: ([0-9.]+) ms")


def _explain_times(rows: Sequence[tuple[Any, ...]]) -> tuple[float, float]:
    ex = pl = math.nan
    for r in rows:
        line = str(r[0]) if r else ""
        m = _EXEC_TIME.search(line)
        if m:
            ex = float(m.group(1))
        m = _PLAN_TIME.search(line)
        if m:
            pl = float(m.group(1))
    return ex, pl


def _cpu_ns(pid: int) -> int | None:
    """Nanoseconds *pid* has run on a CPU, read while the backend is idle (profkit.procfs)."""
    st = schedstat(pid)
    return None if st is None else st[0]


def _pgss_snapshot(conn: psycopg.Connection) -> dict[int, int]:
    """queryid -> calls for every statement except the ones reading pg_stat_statements."""
    rows = conn.execute("SELECT queryid, calls, query FROM pg_stat_statements(true)",
                        prepare=False).fetchall()
    out: dict[int, int] = {}
    for qid, calls, text in rows:
        if qid is None or (text and "pg_stat_statements" in text):
            continue
        out[int(qid)] = out.get(int(qid), 0) + int(calls)
    return out


def _pgss_read(conn: psycopg.Connection, qid: int) -> tuple[int, float]:
    row = conn.execute(
        "SELECT coalesce(sum(calls), 0)::int8, coalesce(sum(total_exec_time), 0)::float8 "
        f"FROM pg_stat_statements(false) WHERE queryid = {int(qid)}", prepare=False).fetchone()
    assert row is not None
    return int(row[0]), float(row[1])


class _Runner:
    def __init__(self, req: BenchRequest, wl: Workload, run_id: str, out_dir: Path,
                 reporter: _Reporter, order_seed: int) -> None:
        self.req = req
        self.wl = wl
        self.run_id = run_id
        self.out_dir = out_dir
        self.progress = reporter
        self.order_seed = order_seed
        self.targets: list[_Target] = []
        self.rows: list[dict[str, Any]] = []
        self.writer: _RowWriter | None = None
        self.expected = wl.expected_rows(req.scale)

    # -- one execution --------------------------------------------------------
    def execute(self, t: _Target, mode: str) -> dict[str, Any]:
        """Run *mode* once on *t*; times and pg_stat_statements delta. Raises _ExecFailed."""
        conn = t.conn
        assert conn is not None
        sql = self.wl.query(mode)
        try:
            qid = t.qids.get(mode)
            snap = _pgss_snapshot(conn) if qid is None else None
            before = _pgss_read(conn, qid) if qid is not None else (0, 0.0)
            cur = conn.cursor()
            cpu0 = _cpu_ns(t.backend_pid)
            t_start = time.time()
            t0 = time.perf_counter_ns()
            cur.execute(sql, prepare=False)
            rows = cur.fetchall()
            t1 = time.perf_counter_ns()
            cpu1 = _cpu_ns(t.backend_pid)
            cur.close()
            if qid is None:
                assert snap is not None
                qid = self._identify(conn, snap, t, mode)
                t.qids[mode] = qid
                # the statement's stats are the whole entry when it was new, else a delta
                before = (snap.get(qid, 0), math.nan)
            after = _pgss_read(conn, qid)
        except Exception as e:  # psycopg errors, and a broken connection's own errors
            if isinstance(e, BenchError):
                raise
            raise _ExecFailed(t, mode, e) from e
        if after[0] - before[0] != 1:
            raise BenchError(
                f"pg_stat_statements counted {after[0] - before[0]} calls of the {mode} "
                f"statement on {t.ref.label} for one execution (expected 1): is another "
                "session running it? The benchmark's clusters must be private")
        server_ms = after[1] - before[1] if not math.isnan(before[1]) else math.nan
        if mode == "plain" and self.expected is not None:
            got = rows[0][0] if rows and rows[0] else None
            if got != self.expected:
                raise BenchError(
                    f"build {t.ref.label} returned {got!r} for the plain {self.wl.name} query at "
                    f"scale {self.req.scale}, expected {self.expected}: the build computes "
                    "wrong results (check its patches with `profkit regress`)")
        ex, pl = _explain_times(rows) if mode != "plain" else (math.nan, math.nan)
        cpu_ms = (cpu1 - cpu0) / 1e6 if cpu0 is not None and cpu1 is not None else math.nan
        return {"client_ms": (t1 - t0) / 1e6, "server_ms": server_ms, "cpu_ms": cpu_ms,
                "explain_ms": ex,
                "planning_ms": pl, "t_start": t_start, "backend_pid": t.backend_pid}

    def _identify(self, conn: psycopg.Connection, before: dict[int, int], t: _Target,
                  mode: str) -> int:
        after = _pgss_snapshot(conn)
        grown = [q for q, c in after.items() if c - before.get(q, 0) == 1]
        if len(grown) != 1:
            raise BenchError(
                f"could not find the {mode} statement of {t.ref.label} in pg_stat_statements "
                f"({len(grown)} statements ran once): is pg_stat_statements.track 'top' and "
                "the cluster private?")
        return grown[0]

    # -- phases ---------------------------------------------------------------
    def start_clusters(self, stack: contextlib.ExitStack, builds: Mapping[str, Build],
                       settings: Mapping[str, str]) -> None:
        import psycopg

        from profkit.pg.cluster import Cluster

        self.progress.phase("starting clusters and loading data", len(self.req.refs))
        for ref in self.req.refs:
            b = builds[ref.label]
            cl = Cluster(b, name=f"bench-{ref.label}", settings=dict(settings))
            stack.enter_context(cl)
            t = _Target(ref, b, cl)
            self.targets.append(t)
            # LIFO: runs before the cluster stops and removes its directory
            stack.callback(self._keep_log, t)
            stack.callback(self._close, t)
            try:
                self.connect(t)
                self.wl.load(t.conn, self.req.scale)  # type: ignore[arg-type]
            except psycopg.Error as e:
                raise BenchError(f"could not prepare the cluster of build {ref.label!r} "
                                 f"(pg_stat_statements, loading {self.wl.name} at scale "
                                 f"{self.req.scale}): {e}; server log: "
                                 f"{self.out_dir / 'logs' / f'postgres-{ref.label}.log'}") from e
            self.progress.advance(f"{ref.label}: cluster on port {cl.port}, {self.wl.name} "
                                  f"loaded at scale {self.req.scale}")

    def connect(self, t: _Target) -> None:
        t.conn = t.cluster.connect(prepare_threshold=None)
        t.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        t.backend_pid = t.cluster.backend_pid(t.conn)

    @staticmethod
    def _close(t: _Target) -> None:
        if t.conn is not None:
            with contextlib.suppress(Exception):
                t.conn.close()
            t.conn = None

    def _keep_log(self, t: _Target) -> None:
        """Copy the server log into the run directory (it goes with the cluster's dir)."""
        with contextlib.suppress(OSError, AssertionError):
            dest = self.out_dir / "logs"
            dest.mkdir(exist_ok=True)
            shutil.copyfile(t.cluster.log_path, dest / f"postgres-{t.ref.label}.log")

    def warm_up(self) -> None:
        n = len(self.targets) * len(self.req.modes) * max(self.req.warmup, 1)
        self.progress.phase("warm-up", n)
        for t in self.targets:
            # at least one execution per mode: it checks the plain result and finds each
            # statement's pg_stat_statements entry
            for _ in range(max(self.req.warmup, 1)):
                for mode in self.req.modes:
                    try:
                        self.execute(t, mode)
                    except _ExecFailed as e:
                        raise self._failure(e, "the warm-up") from e.err
                    self.progress.advance(f"warm-up {t.ref.label} {mode}")

    def measure(self) -> None:
        rng = random.Random(self.order_seed)
        pairs = [(t, m) for t in self.targets for m in self.req.modes]
        total = self.req.reps * len(pairs)
        self.progress.phase("benchmark", total)
        order = 0
        for rep in range(1, self.req.reps + 1):
            seq = pairs[:]
            rng.shuffle(seq)
            for slot, (t, mode) in enumerate(seq):
                try:
                    m = self.execute(t, mode)
                except _ExecFailed as e:
                    raise self._failure(e, f"repetition {rep} of {self.req.reps}") from e.err
                row = {
                    "run_id": self.run_id, "build": t.ref.label, "workload": self.wl.name,
                    "query": _query_name(mode), "mode": mode, "rep": rep, "order": order,
                    **m, "slot": slot, "preset": t.ref.preset,
                }
                self.rows.append(row)
                assert self.writer is not None
                self.writer.write(row)
                order += 1
                self.progress.advance(f"rep {rep}/{self.req.reps}: {t.ref.label} {mode} "
                                  f"{m['client_ms']:.0f} ms")

    def _failure(self, e: _ExecFailed, when: str) -> BenchError:
        t = e.target
        crash = t.cluster.crash_report()
        broken = t.conn is None or t.conn.closed or t.conn.broken
        deadline = time.monotonic() + 3.0
        # the postmaster logs a backend's death just after the client sees the socket close
        while broken and not crash and time.monotonic() < deadline:
            time.sleep(0.1)
            crash = t.cluster.crash_report()
        # (Cluster.stop waits for crash recovery before it asks for a fast shutdown)
        alive = t.cluster.proc is not None and t.cluster.proc.alive()
        kept = len(self.rows)
        where = f"build {t.ref.label!r}, {e.mode}, during {when}"
        if crash or not alive:
            what = "crashed" if alive else "exited"
            detail = crash or f"postmaster (pid {t.cluster.proc.pid if t.cluster.proc else '?'}) " \
                              "is gone"
            return ServerCrashed(
                f"the server of {where} {what}: {detail}. The {kept} rows measured before are "
                f"kept in {self.out_dir / TIMINGS_CSV}; all benchmark clusters were stopped "
                f"(server log: {self.out_dir / 'logs' / f'postgres-{t.ref.label}.log'})",
                run_dir=self.out_dir, rows=kept)
        return BenchError(f"the query failed on {where}: {e.err}. The {kept} rows measured "
                          f"before are kept in {self.out_dir / TIMINGS_CSV}",
                          run_dir=self.out_dir, rows=kept)


def _query_name(mode: str) -> str:
    from profkit.pg.workloads import SEED_QUERY_NAMES

    return SEED_QUERY_NAMES.get(mode, mode)


# ---------------------------------------------------------------------------
# instruction counts


def _round_down(x: float, digits: int = 2) -> float:
    if x <= 0:
        return x
    e = math.floor(math.log10(x)) - digits + 1
    q = 10.0 ** e
    return round(math.floor(x / q + 1e-9) * q, max(0, -e))


def choose_instr_scale(workload: str, scale: float, timings: pd.DataFrame,
                       budget_s: float = CALLGRIND_BUDGET_S) -> tuple[float, str]:
    """The scale at which callgrind counts one execution of every mode within *budget_s*.

    Estimate per build: (warm-up plain + one of each mode) × the callgrind slowdown,
    from the run's own median client times; the slowest build decides. Counting at a
    smaller scale keeps the per-row costs (what the overhead is about) and gives the
    fixed per-statement costs (parse, plan, EXPLAIN output) more weight, so the
    instruction overhead is slightly lower there than at the bench scale.
    """
    if timings.empty:
        return scale, "no timings to estimate from: counted at the bench scale"
    med = timings.groupby(["build", "mode"])["client_ms"].median()
    per_build = {}
    for b in med.index.get_level_values(0).unique():
        mb = med[b]
        per_build[b] = float(mb.sum() + mb.get("plain", 0.0)) / 1000.0
    worst = max(per_build.values())
    est = CALLGRIND_SLOWDOWN * worst + CALLGRIND_STARTUP_S
    if est <= budget_s:
        return scale, (f"bench scale: ~{est:.0f} s per build under callgrind (budget "
                       f"{budget_s:.0f} s)")
    k = WORK_EXPONENT.get(workload, 1.0)
    room = max(budget_s - CALLGRIND_STARTUP_S, 1.0) / max(est - CALLGRIND_STARTUP_S, 1e-9)
    s = max(_round_down(scale * room ** (1.0 / k)), MIN_INSTR_SCALE)
    return s, (f"the bench scale {scale} would take ~{est:.0f} s per build under callgrind "
               f"(budget {budget_s:.0f} s); counted at scale {s} (work ∝ scale^{k:g})")


def resolve_counter(instructions: InstructionCounter) -> str:
    """'callgrind', 'perf_stat' or 'none' for the requested counter ('auto': what works)."""
    from profkit.collect.callgrind import instruction_counter

    if instructions not in ("auto", "callgrind", "perf_stat", "none"):
        raise BenchError(f"instructions must be auto, callgrind, perf_stat or none, not "
                         f"{instructions!r}")
    if instructions == "auto":
        return instruction_counter()
    return instructions


def _count_callgrind(r: _Runner, instr_scale: float, timeout: float) -> pd.DataFrame:
    from profkit.collect.callgrind import collect_callgrind_cluster
    from profkit.parse.callgrind import instr_counts_from_session

    queries = {m: r.wl.query(m) for m in r.req.modes}

    def one(t: _Target) -> pd.DataFrame:
        _Runner._close(t)
        if instr_scale != r.req.scale:
            with t.cluster.connect() as c:
                r.wl.load(c, instr_scale)
        dest = r.out_dir / "callgrind" / t.ref.label
        session = collect_callgrind_cluster(t.cluster, queries, dest, warmup_sql="",
                                            timeout=timeout)
        df = instr_counts_from_session(session, run_id=r.run_id, build=t.ref.label,
                                       workload=r.wl.name)
        df["scale"] = instr_scale
        df["preset"] = t.ref.preset
        df["query"] = df["mode"].map(_query_name)
        df["out_file"] = df["out_file"].map(lambda p: os.path.relpath(p, r.out_dir))
        r.progress.advance(f"callgrind {t.ref.label}: "
                       + ", ".join(f"{m} {int(v):,}" for m, v in zip(df["mode"],
                                                                      df["instructions"],
                                                                      strict=True)))
        return df

    r.progress.phase(f"instruction counts (callgrind, scale {instr_scale})", len(r.targets))
    # Instruction counts do not depend on what else runs, so builds are counted in
    # parallel (one valgrind per core).
    workers = max(1, min(len(r.targets), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="callgrind") as ex:
        parts = list(ex.map(one, r.targets))
    return pd.concat(parts, ignore_index=True)


def _count_perf_stat(r: _Runner) -> pd.DataFrame:
    from profkit.collect.callgrind import perf_stat_instructions

    rows = []
    r.progress.phase("instruction counts (perf stat)", len(r.targets) * len(r.req.modes))
    for t in r.targets:
        conn = t.conn
        assert conn is not None
        for mode in r.req.modes:
            sql = r.wl.query(mode)
            out = r.out_dir / "perf_stat" / f"{t.ref.label}.{mode}.csv"
            n = perf_stat_instructions(
                t.backend_pid,
                lambda c=conn, q=sql: c.execute(q, prepare=False).fetchall(),
                out_path=out)
            rows.append({"run_id": r.run_id, "build": t.ref.label, "workload": r.wl.name,
                         "query": _query_name(mode), "mode": mode, "instructions": round(n),
                         "tool": "perf_stat", "scope": "backend (perf stat -e instructions:u -p)",
                         "scale": r.req.scale, "preset": t.ref.preset,
                         "out_file": os.path.relpath(out, r.out_dir)})
            r.progress.advance(f"perf stat {t.ref.label} {mode}: {n:,.0f}")
    return tables.validate(pd.DataFrame(rows), "instr_counts")


# ---------------------------------------------------------------------------


@dataclass
class BenchResult:
    """A finished run: where it is and what it measured (all of it is on disk too)."""

    run_id: str
    out_dir: Path
    timings: pd.DataFrame
    instructions: pd.DataFrame | None
    provenance: dict[str, Any]

    def summary(self, metric: str | None = None) -> pd.DataFrame:
        from profkit.analyze.stats import attach_instructions

        return attach_instructions(summarize_metric(self.timings, metric), self.instructions)

    def _repr_html_(self) -> str:
        import html

        from profkit.render.report import seed_table

        head = (f"<b>Benchmark {html.escape(self.run_id)}</b>: {self.provenance.get('workload')} "
                f"at scale {self.provenance.get('scale')}, {self.provenance.get('reps')} "
                f"repetitions, <code>{html.escape(str(self.out_dir))}</code>")
        return head + seed_table(self.summary()).to_html(index=False, na_rep="–")

    def __repr__(self) -> str:
        return (f"<BenchResult {self.run_id}: {len(self.timings)} executions, "
                f"{self.timings['build'].nunique()} builds, at {self.out_dir}>")


def run_bench(
    builds: str | Sequence[Any],
    workload: str = "nested_loop",
    scale: float = 0.05,
    reps: int = 10,
    modes: Sequence[str] | str = DEFAULT_MODES,
    warmup: int = 1,
    settings: Sequence[str] | Mapping[str, Any] | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    progress: bool | ProgressFn | None = True,
    *,
    instructions: InstructionCounter = "auto",
    instr_scale: float | None = None,
    callgrind_budget_s: float = CALLGRIND_BUDGET_S,
    order_seed: int | None = None,
    run_id: str | None = None,
    command_line: Sequence[str] | None = None,
) -> BenchResult:
    """Benchmark *modes* of *workload* on every build, interleaved; see the module doc.

    *out_dir* is the run directory (default ``profiles/<run_id>``; it must not exist or
    be empty). *instructions*: ``"auto"`` counts with perf stat where the CPU has
    counters, else callgrind; ``"none"`` skips counting. *instr_scale* forces the
    callgrind scale (default: the bench scale if it fits *callgrind_budget_s* per build,
    else a smaller one; the scale used is in instructions.csv and the provenance).

    Raises :class:`BenchError` (bad input, before anything starts), :class:`ServerCrashed`
    (naming the build and repetition; rows so far kept), :class:`ProfilesFull`.
    """
    from profkit.collect.artifacts import RunDir, machine_info, server_settings, tool_version
    from profkit.pg.build import Build, get_build
    from profkit.pg.cluster import BENCH_SETTINGS
    from profkit.pg.workloads import check_scale, get_workload

    req = check_request(builds, workload, scale, reps, modes, warmup, settings)
    wl = get_workload(req.workload)
    if instr_scale is not None:
        check_scale(instr_scale)
    counter = resolve_counter(instructions) if instructions != "none" else "none"
    seed = order_seed if order_seed is not None else random.SystemRandom().randrange(2**31)

    if out_dir is None:
        root = paths.profiles_dir()
        run_id = run_id or new_run_id(req.workload, root)
        out = root / run_id
    else:
        out = Path(out_dir)
        run_id = run_id or out.name
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BenchError(f"{out} already exists and is not empty; runs are never overwritten: "
                         "choose another --out")

    reporter = _Reporter(progress)
    with reporter:
        # Builds first (cached ones return at once): a build failure leaves no run dir.
        passed = {b.name: b for b in ([] if isinstance(builds, str) else builds)
                  if isinstance(b, Build)}
        built: dict[str, Build] = {}
        for ref in req.refs:
            built[ref.label] = passed.get(ref.preset) or get_build(ref.preset,
                                                                   progress=reporter.say)
        cluster_settings = {**BENCH_SETTINGS, **req.settings}
        rows_kept = 0
        try:
            out.mkdir(parents=True, exist_ok=True)
            rd = RunDir(run_id, out, {
                "run_id": run_id, "kind": "bench", "status": "running", "started_at": _now(),
                "command_line": list(command_line) if command_line is not None
                else list(sys.argv),
                "workload": req.workload, "workload_sql": {m: wl.query(m) for m in req.modes},
                "scale": req.scale, "reps": req.reps, "warmup": req.warmup,
                "modes": list(req.modes), "order_seed": seed,
                "settings": dict(req.settings), "cluster_settings": cluster_settings,
                "builds": {r.label: {**built[r.label].provenance(), "preset": r.preset}
                           for r in req.refs},
                "source": next(iter(built.values())).source,
                "machine": machine_info(),
                "loadavg_start": list(os.getloadavg()),
                "tools": {t: tool_version(t) for t in ("valgrind", "perf", "gcc")},
                "python_packages": _package_versions(),
                "metric_note": ("server_ms = pg_stat_statements total_exec_time delta (EXPLAIN: "
                                "the utility statement, inner planning included); client_ms = "
                                "client round trip, rows fetched; explain_ms = EXPLAIN's "
                                "Execution Time"),
                "instruction_counter": counter,
                "files": {"timings": TIMINGS_CSV, "provenance": PROVENANCE_JSON},
            })
            rd.save()
            runner = _Runner(req, wl, run_id, out, reporter, seed)
            runner.writer = _RowWriter(out / TIMINGS_CSV, TIMINGS_COLUMNS)
        except OSError as e:
            if _is_full(e):
                raise ProfilesFull(_full_message(out, e, 0), run_dir=out) from None
            raise

        status, error = "failed", ""
        instr_df: pd.DataFrame | None = None
        try:
            with contextlib.ExitStack() as stack:
                runner.start_clusters(stack, built, cluster_settings)
                rd.update(clusters={t.ref.label: {"dir": str(t.cluster.dir), "port":
                                                  t.cluster.port, "postmaster_pid":
                                                  t.cluster.pid} for t in runner.targets})
                runner.warm_up()
                rd.update(backend_pids={t.ref.label: t.backend_pid for t in runner.targets},
                          pgss_queryids={t.ref.label: {m: str(q) for m, q in t.qids.items()}
                                         for t in runner.targets},
                          server_settings={t.ref.label: server_settings(t.conn)
                                           for t in runner.targets if t.conn is not None},
                          expected_rows=runner.expected)
                runner.measure()
                rows_kept = len(runner.rows)
                rd.update(measured_at=_now(), rows=rows_kept,
                          loadavg_after_timings=list(os.getloadavg()))
                try:
                    if counter == "callgrind":
                        tdf = pd.DataFrame(runner.rows)
                        if instr_scale is not None:
                            iscale, why = instr_scale, "given (--instr-scale)"
                        else:
                            iscale, why = choose_instr_scale(req.workload, req.scale, tdf,
                                                             callgrind_budget_s)
                        rd.update(instr_scale=iscale, instr_scale_reason=why)
                        reporter.say(f"instruction counts: {why}")
                        instr_df = _count_callgrind(runner, iscale, timeout=max(
                            1800.0, 20 * callgrind_budget_s))
                    elif counter == "perf_stat":
                        rd.update(instr_scale=req.scale,
                                  instr_scale_reason="bench scale (perf stat)")
                        instr_df = _count_perf_stat(runner)
                except ProfkitError as e:
                    # The timings are complete and worth more than the counts: finish the
                    # run without them and say so (provenance and report).
                    if isinstance(e, BenchError) or (isinstance(e, OSError) and _is_full(e)):
                        raise
                    instr_df = None
                    rd.update(instructions_error=f"{type(e).__name__}: {e}")
                    reporter.say(f"[instruction counts failed, the run continues without "
                                 f"them] {e}")
                if instr_df is not None:
                    tmp = out / (INSTRUCTIONS_CSV + ".tmp")
                    instr_df.to_csv(tmp, index=False)
                    os.replace(tmp, out / INSTRUCTIONS_CSV)
            timings = _timings_frame(runner.rows)
            timings.to_parquet(out / TIMINGS_PARQUET, index=False)
            status = "complete"
        except OSError as e:
            error = f"{type(e).__name__}: {e}"
            if _is_full(e):
                raise ProfilesFull(_full_message(out, e, len(runner.rows)), run_dir=out,
                                   rows=len(runner.rows)) from None
            raise
        except (KeyboardInterrupt, SystemExit) as e:
            status, error = "interrupted", type(e).__name__
            raise
        except BaseException as e:
            error = f"{type(e).__name__}: {e}"
            if isinstance(e, BenchError):
                e.run_dir, e.rows = out, len(runner.rows)
            raise
        finally:
            if runner.writer is not None:
                runner.writer.close()
            if status != "complete":
                _salvage(out, runner.rows)
            try:
                rd.update(status=status, error=error or None, ended_at=_now(),
                          rows=len(runner.rows), loadavg_end=list(os.getloadavg()),
                          files=_files(out))
            except OSError as e:  # a full disk: the first provenance.json stays
                log.warning("could not update %s: %s", out / PROVENANCE_JSON, e)
                with contextlib.suppress(OSError):
                    (out / (PROVENANCE_JSON + ".tmp")).unlink()
    return BenchResult(run_id, out, timings, instr_df, rd.provenance)


def _files(out: Path) -> dict[str, str]:
    names = {"timings": TIMINGS_CSV, "timings_parquet": TIMINGS_PARQUET,
             "instructions": INSTRUCTIONS_CSV, "provenance": PROVENANCE_JSON}
    return {k: v for k, v in names.items() if (out / v).exists()}


def _timings_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    if not rows:
        df = tables.empty("timings")
        for c in TIMINGS_COLUMNS:
            if c not in df.columns:
                df[c] = pd.Series(dtype="float64")
        return df
    df = pd.DataFrame(rows, columns=list(TIMINGS_COLUMNS))
    df["preset"] = df["preset"].astype("string")
    return tables.validate(df, "timings")


def _salvage(out: Path, rows: list[dict[str, Any]]) -> None:
    """After a failure: the measured rows as parquet too, if the disk lets us."""
    if not rows:
        return
    tmp = out / (TIMINGS_PARQUET + ".tmp")
    try:
        _timings_frame(rows).to_parquet(tmp, index=False)
        os.replace(tmp, out / TIMINGS_PARQUET)
    except Exception as e:  # noqa: BLE001 - the CSV already holds every row
        log.warning("could not write %s (the rows are in %s): %s", TIMINGS_PARQUET,
                    TIMINGS_CSV, e)
        with contextlib.suppress(OSError):
            tmp.unlink()


def _package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in ("psycopg", "pandas", "numpy", "scipy", "pyarrow"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            pass
    return out


# ---------------------------------------------------------------------------
# report


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_report` wrote, and the summary table it wrote from."""

    run_dir: Path
    summary: pd.DataFrame
    comparisons: pd.DataFrame | None
    summary_csv: Path
    report_md: Path
    chart_png: Path
    chart_svg: Path


def _report_provenance(prov: Mapping[str, Any]) -> dict[str, Any]:
    """The provenance fields a reader of the report needs, in the report's vocabulary."""
    m = prov.get("machine") or {}
    machine = {k: m.get(k) for k in ("cpu_model", "cpus", "kernel", "clocksource",
                                     "virtualization", "governor") if k in m}
    cmd = prov.get("command_line")
    out: dict[str, Any] = {
        "run_id": prov.get("run_id"), "started_at": prov.get("started_at"),
        "ended_at": prov.get("ended_at"),
        "command_line": " ".join(cmd) if isinstance(cmd, list) else cmd,
        "workload": prov.get("workload"), "scale": prov.get("scale"),
        "reps": prov.get("reps"), "metric": prov.get("report_metric"),
        "instruction_counter": prov.get("instruction_counter"),
        "machine": machine, "builds": _ordered_builds(prov.get("builds")),
        "settings": prov.get("settings"),
        "status": prov.get("status"),
        "instructions counted at scale": prov.get("instr_scale"),
        "load average (1/5/15 min) at start": _loadavg(prov.get("loadavg_start")),
        "load average at end": _loadavg(prov.get("loadavg_end")),
        "order seed": prov.get("order_seed"),
    }
    if prov.get("error"):
        out["error"] = prov["error"]
    if prov.get("instructions_error"):
        out["instruction counts failed"] = prov["instructions_error"]
    return out


def _ordered_builds(builds: Any) -> Any:
    """The builds in the seed's order (provenance.json stores them sorted by name)."""
    from profkit.analyze.stats import build_order

    if not isinstance(builds, Mapping):
        return builds
    return {b: builds[b] for b in build_order(list(builds))}


def _loadavg(x: Any) -> str | None:
    if not isinstance(x, list):
        return None
    return " / ".join(f"{v:.2f}" for v in x)


METRICS: tuple[str, ...] = ("cpu_ms", "server_ms", "client_ms")


def default_metric(timings: pd.DataFrame) -> str:
    """``cpu_ms`` when every row has it (Linux), else ``server_ms``.

    The backend's on-CPU time is the headline: on an idle machine it equals the
    server's wall time to 0.1 ms (measured here), and on a shared one it does not
    count the time the backend waited for a core — waiting that inflated plain-query
    wall times here by up to 2x under a load average of 7 and so biased the overhead.
    """
    if "cpu_ms" in timings.columns and len(timings) and timings["cpu_ms"].notna().all():
        return "cpu_ms"
    return "server_ms"


def _metric_frame(timings: pd.DataFrame, metric: str) -> tuple[pd.DataFrame, str]:
    """(frame, column name stats understands): other time columns ride as server_ms."""
    if metric not in METRICS:
        raise BenchError(f"metric must be one of {', '.join(METRICS)}, not {metric!r}")
    if metric in ("server_ms", "client_ms"):
        return timings, metric
    if metric not in timings.columns or timings[metric].isna().any():
        raise BenchError(f"this run has no complete {metric} column (recorded on Linux only); "
                         "use metric='server_ms'")
    # profkit.analyze.stats knows the timings table's two time columns: feed the other
    # one in under server_ms's name and put the real name back on the result.
    return timings.assign(server_ms=timings[metric].astype("float64")), "server_ms"


def summarize_metric(timings: pd.DataFrame, metric: str | None = None,
                     **kwargs: Any) -> pd.DataFrame:
    """:func:`profkit.analyze.stats.summarize` on any of :data:`METRICS` (default: see
    :func:`default_metric`)."""
    from profkit.analyze.stats import summarize

    metric = metric or default_metric(timings)
    frame, col = _metric_frame(timings, metric)
    out = summarize(frame, col, **kwargs)  # type: ignore[arg-type]
    out["metric"] = metric
    return out


def write_report(run_dir: str | os.PathLike[str], *, metric: str | None = None,
                 center: str = "median") -> ReportFiles:
    """summary.csv, report.md and the overhead chart (PNG + SVG) of a run directory.

    Reads only the run's files (timings, instructions.csv, provenance.json), so it
    works on a run copied from another machine and on a run that died half-way.
    *metric*: cpu_ms, server_ms or client_ms (default: :func:`default_metric`); the
    report shows the other two below the main table.
    """
    from profkit.analyze.stats import attach_instructions, compare_chain, summary_csv
    from profkit.render.report import plot_overheads, render_markdown

    d = Path(run_dir)
    prov = load_provenance(d)
    timings = load_timings(d)
    instr = load_instructions(d)
    metric = metric or default_metric(timings)
    s = summarize_metric(timings, metric, center=center)
    s = attach_instructions(s, instr)
    comps = None
    builds = timings["build"].unique().tolist()
    if len(builds) >= 2 and not timings.empty:
        frame, col = _metric_frame(timings, metric)
        parts = []
        for mode in ("analyze_notiming", "analyze_timing"):
            if mode in set(timings["mode"]):
                with contextlib.suppress(ComparisonError):
                    parts.append(compare_chain(frame, mode=mode, metric=col,  # type: ignore[arg-type]
                                               center=center))
        comps = pd.concat(parts, ignore_index=True).assign(metric=metric) if parts else None
    rprov = _report_provenance({**prov, "report_metric": metric})
    try:
        summary_csv(s, path=d / SUMMARY_CSV)
        plot_overheads(s, d / CHART_PNG, d / CHART_SVG, provenance=rprov)
        md = render_markdown(s, rprov, comparisons=comps, chart=CHART_PNG)
        md += _extra_sections(timings, instr, metric, center)
        (d / REPORT_MD).write_text(md)
    except OSError as e:
        if _is_full(e):
            raise ProfilesFull(_full_message(d, e, 0)) from None
        raise
    return ReportFiles(d, s, comps, d / SUMMARY_CSV, d / REPORT_MD, d / CHART_PNG,
                       d / CHART_SVG)


def _extra_sections(timings: pd.DataFrame, instr: pd.DataFrame | None, metric: str,
                    center: str) -> str:
    """The other time measures and the raw instruction counts, after the main report."""
    out = ["", "## The time measures", "",
           (f"The tables above use `{metric}`. `cpu_ms`: the backend's on-CPU time over the "
            "execution (/proc/PID/schedstat), blind to waiting for a core on a shared machine; "
            "`server_ms`: pg_stat_statements' total_exec_time delta (EXPLAIN's includes "
            "planning its query, ~0.2 ms); `client_ms`: the client's round trip, rows "
            "fetched. Overhead % by each, same executions (brackets: 95 % CI):"), "",
           "| build | mode | " + " | ".join(f"{m} median | {m} overhead % [95% CI]"
                                            for m in METRICS) + " |",
           "| :--- | :--- |" + " ---: | ---: |" * len(METRICS)]
    sums = {}
    for m in METRICS:
        try:
            sums[m] = summarize_metric(timings, m, center=center).set_index(["build", "mode"])
        except ProfkitError:
            continue
    if sums:
        first = next(iter(sums.values()))
        for key in first.index:
            cells = []
            for m in METRICS:
                r = sums[m].loc[key] if m in sums and key in sums[m].index else None
                if r is None:
                    cells += ["–", "–"]
                    continue
                ci = ("" if not (_num(r.ci_low_pct) and _num(r.ci_high_pct))
                      else f" [{r.ci_low_pct:.2f}, {r.ci_high_pct:.2f}]")
                cells += [f"{r.median_ms:.2f}", f"{r.overhead_pct:.2f}{ci}"]
            out.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    out += _plain_across_builds(timings, instr, metric)
    if instr is not None and not instr.empty:
        tools = ", ".join(sorted(set(instr["tool"].astype(str))))
        scopes = ", ".join(sorted(set(instr["scope"].astype(str))))
        scales = ", ".join(str(x) for x in sorted(set(instr.get("scale", pd.Series([])))))
        out += ["", "## Instruction counts (one execution each)", "",
                (f"Counter: {tools}; scope: {scopes}; scale {scales}. `executor` is the "
                 "inclusive count of standard_ExecutorRun (no parse, plan or EXPLAIN output)."),
                "",
                ("| build | mode | instructions | overhead % | executor instructions | "
                 "executor overhead % |"),
                "| :--- | :--- | ---: | ---: | ---: | ---: |"]
        has_ex = "executor_instructions" in instr.columns
        for b in instr["build"].unique():
            ib = instr[instr["build"] == b].set_index("mode")
            base = ib["instructions"].get("plain")
            base_ex = ib["executor_instructions"].get("plain") if has_ex else None
            for mode, r in ib.iterrows():
                ov = (r["instructions"] / base - 1) * 100 if _num(base) else math.nan
                ex = r["executor_instructions"] if has_ex else None
                ovx = (ex / base_ex - 1) * 100 if _num(ex) and _num(base_ex) else math.nan
                out.append(f"| {b} | {mode} | {int(r['instructions']):,} | {ov:.2f} | "
                           f"{f'{int(ex):,}' if _num(ex) else '–'} | "
                           f"{'–' if math.isnan(ovx) else f'{ovx:.2f}'} |")
    return "\n".join(out) + "\n"


def _plain_across_builds(timings: pd.DataFrame, instr: pd.DataFrame | None,
                         metric: str) -> list[str]:
    """Query-1 of every build against the first (the seed's step 3 slowed it by ~1 %)."""
    from profkit.analyze.stats import build_order, compare_builds

    builds = build_order(timings["build"].unique().tolist())
    if len(builds) < 2 or "plain" not in set(timings["mode"]):
        return []
    frame, col = _metric_frame(timings, metric)
    ic = None
    if instr is not None and not instr.empty:
        ic = instr[instr["mode"] == "plain"].set_index("build")["instructions"].astype(float)
    base = builds[0]
    out = ["", f"## The plain query across builds (against {base})", "",
           (f"Median `{metric}` of Query-1 relative to {base}'s (Mann–Whitney U on the "
            "per-execution times) and its instruction count: what a patch costs a query "
            "that is not being explained."), "",
           "| build | median ms | time vs " + base + " % | p | instructions vs " + base + " % |",
           "| :--- | ---: | ---: | ---: | ---: |"]
    for b in builds[1:]:
        try:
            c = compare_builds(frame, base, b, "plain", col)  # type: ignore[arg-type]
        except ComparisonError:
            continue
        iv = (ic[b] / ic[base] - 1) * 100 if ic is not None and b in ic and base in ic \
            else math.nan
        out.append(f"| {b} | {c.median_b_ms:.2f} | {(c.time_ratio - 1) * 100:+.2f} | "
                   f"{c.time_p_value:.3g} | {'–' if math.isnan(iv) else f'{iv:+.2f}'} |")
    return out


def _num(x: Any) -> bool:
    try:
        return x is not None and x is not pd.NA and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False



SEED_BUILDS: tuple[str, ...] = ("vanilla", "step1", "step2", "step3")


def ordering_check(summary: pd.DataFrame, comparisons: pd.DataFrame | None = None, *,
                   builds: Sequence[str] = SEED_BUILDS, mode: str = "analyze_notiming",
                   ) -> list[str]:
    """Sentences on whether *mode*'s overhead falls along *builds* (the seed's claim).

    Checked in instructions (``instr_overhead_pct``) and in wall-clock overhead; for the
    latter, each neighbouring pair says whether the bootstrap CI of the difference (from
    *comparisons*, :func:`profkit.analyze.stats.compare_chain`) excludes zero. Empty when
    fewer than two of *builds* are in the summary.
    """
    s = summary[summary["mode"] == mode].set_index("build")
    present = [b for b in builds if b in s.index]
    if len(present) < 2:
        return []
    out = []
    metric = str(s["metric"].iloc[0]) if "metric" in s.columns and len(s) else "time"
    for col, what in (("instr_overhead_pct", "instructions"), ("overhead_pct", f"time ({metric})")):
        if col not in s.columns:
            continue
        vals = [s.loc[b, col] for b in present]
        if not all(_num(v) for v in vals):
            continue
        fv = [float(v) for v in vals]
        holds = all(a > b for a, b in itertools.pairwise(fv))
        chain = " > ".join(f"{b} {v:.2f} %" for b, v in zip(present, fv, strict=True))
        line = (f"{_query_name(mode)} overhead by {what}: {chain} — the ordering "
                f"{'holds' if holds else 'does NOT hold'}")
        if col == "overhead_pct" and comparisons is not None and not comparisons.empty:
            c = comparisons[comparisons["mode"] == mode]
            sep = []
            for r in c.itertuples():
                if r.a in present and r.b in present:
                    sep.append(f"{r.a}→{r.b} {'beyond' if r.overhead_differs else 'within'} "
                               "noise")
            if sep:
                line += " (" + ", ".join(sep) + ")"
        out.append(line)
    return out
