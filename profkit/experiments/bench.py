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
counts them). :func:`write_report` turns the :class:`BenchResult` :func:`run_bench`
returns (or any run directory, read back by :func:`load_bench` through
:func:`profkit.rundir.load_run`) into ``summary.csv``, ``report.md`` and the overhead
chart: statistics from :mod:`profkit.analyze.stats`, every file from :mod:`profkit.render`.

The benchmark is a hook on :class:`profkit.experiments.harness.Session`, the engine:
it starts every arm's cluster (server logs kept in ``logs/``), on *backends* K fresh
clusters and backends per arm in turn (the repetitions split into K blocks, every block
interleaving all arms; ``backend`` column), times every execution with
:func:`~profkit.experiments.harness.timed_execute` in the order
:func:`~profkit.experiments.harness.interleave` draws, and reports failures; this module
loads the workload, records each arm's plan (``EXPLAIN (COSTS OFF)``: arms that chose
different plans stop the run unless allowed), checks answers and writes rows. The run's
folder and final status come from :func:`profkit.rundir.open_run`.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd

from profkit import rundir, tables
from profkit.errors import ComparisonError, ProfkitError
from profkit.collect import vcpu as vcpu_mod
from profkit.experiments import harness
from profkit.modes import PLAN_PREFIX, query_name
from profkit.parse.explain import explain_times
from profkit.progress import Progress, ProgressFn, as_progress
from profkit.analyze.stats import (
    aa_check,
    pg_major,
    attach_instructions,
    attach_reference,
    compare_chain_metric,
    default_metric,
    summarize_metric,
)
from profkit.collect.artifacts import server_settings
from profkit.collect.callgrind import (
    collect_callgrind_cluster,
    instruction_counter,
    perf_stat_instructions,
)
from profkit.parse.callgrind import instr_counts_from_session
from profkit.pg.build import Build, presets
from profkit.pg.cluster import BENCH_SETTINGS
from profkit.pg.workloads import EXPLAIN_PREFIX, check_scale, get_workload
from profkit.render.bench_report import (
    bench_extra_sections,
    engine_notes,
    engine_sections,
    plot_overheads,
    render_markdown,
    report_provenance,
    seed_table,
    write_summary_csv,
)

if TYPE_CHECKING:

    from profkit.pg.build import Build
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
    "preset", "t_start", "settings",
    # the vCPU's speed just before / after the execution (CPU ms of a fixed calibration
    # work on the backend's CPU) and what disturbed the backend over it (collect.vcpu)
    "calib_before_ms", "calib_after_ms", "runq_ms", "vol_cs", "invol_cs", "migrations",
    "minflt", "majflt", "steal_ms", "steal_cpu_ms", "last_cpu",
    # which of the arm's backends (1..K, each on a fresh cluster) ran the execution
    "backend",
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


#: A build in a benchmark is an arm (:class:`profkit.experiments.harness.Arm`): the label
#: its rows carry, the preset it is built from and the server settings its cluster runs
#: with. ``"step1"`` is label and preset at once; ``"a=vanilla"`` runs preset vanilla
#: under the label ``a`` (two labels on one preset make an A/A run: a check of the
#: noise); ``"pg19tsc=pg19/vanilla:timing_clock_source=tsc"`` runs pg19/vanilla with that
#: setting in its cluster's postgresql.conf (every arm has a cluster of its own).
BuildRef = harness.Arm


def parse_builds(builds: str | Sequence[Any]) -> list[BuildRef]:
    """Build references (arms) from ``"vanilla,step1"``, a list of names, or Build objects.

    Each item is ``[LABEL=]PRESET[:GUC=V,...]`` (:func:`harness.parse_arms`, the syntax
    of ``profkit timing-accuracy --arm``). In a comma-separated string an item's
    settings continue after its ``:`` until the next item that is not ``GUC=V``:
    ``"vanilla,t=pg19/vanilla:timing_clock_source=tsc,jit=off,step3"`` gives t both
    settings.

    Raises :class:`BenchError` for an empty list, a duplicate label, a malformed item or
    setting, or an unknown preset (naming the known ones) — before anything is built or
    started.
    """

    items: list[Any] = [] if isinstance(builds, str) else list(builds)
    if isinstance(builds, str):
        if not builds.strip(" ,"):
            raise BenchError("no builds given: pass build presets, e.g. --builds vanilla,step1")
    elif not items:
        raise BenchError("no builds given: pass build presets, e.g. --builds vanilla,step1")
    for it in items:
        if not isinstance(it, (str, Build, harness.Arm)):
            raise BenchError(f"a build is a preset name (str), not {type(it).__name__}: {it!r}")
    known = set(presets()) | {b.name for b in items if isinstance(b, Build)}
    try:
        return harness.parse_arms(
            builds if isinstance(builds, str)
            else [harness.Arm(i.name, i.name) if isinstance(i, Build) else i for i in items],
            known)
    except harness.HarnessError as e:
        raise BenchError(f"build {e}") from None


def parse_settings(items: Sequence[str] | Mapping[str, Any] | None) -> dict[str, str]:
    """Server settings from ``["name=value", ...]`` or a dict
    (:func:`harness.parse_settings`; :class:`BenchError` for a bad one)."""
    try:
        return harness.parse_settings(items)
    except harness.HarnessError as e:
        raise BenchError(str(e)) from None


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
    backends: int = 1
    allow_plan_differences: bool = False
    #: code layouts per arm (0: the build itself): backend b runs layout b (see
    #: :func:`layout_presets`), so the interval's between-backend level carries layout
    layouts: int = 0


def check_request(builds: str | Sequence[Any], workload: str, scale: float, reps: int,
                  modes: Sequence[str] | str = DEFAULT_MODES, warmup: int = 1,
                  settings: Sequence[str] | Mapping[str, Any] | None = None,
                  backends: int | str = "auto", aa: bool = False,
                  allow_plan_differences: bool = False, layouts: int = 0) -> BenchRequest:
    """Validate everything about a run before anything is built, started or written.

    *backends*: independent backends (each on a fresh cluster) per arm, the repetitions
    split between them (``"auto"``: :func:`harness.auto_backends`). *aa*: add an A/A arm
    (:func:`add_aa_arm`). *allow_plan_differences*: keep going when the arms chose
    different plans (marked in every table) instead of stopping. *layouts*: L >= 2 runs
    every arm on L code layouts of its build (``PRESET@layout1`` ... ``@layoutL``: the same
    code linked in other function orders), one backend each: *backends* becomes L, and
    the hierarchical interval treats layout as the random factor it is.
    """

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
    if aa:
        refs = add_aa_arm(refs)
    if backends == "auto":
        k = harness.auto_backends(reps)
    elif isinstance(backends, bool) or not isinstance(backends, int) or backends < 1:
        raise BenchError(f"backends must be an integer >= 1 or 'auto', got {backends!r}")
    elif backends > reps:
        raise BenchError(f"backends ({backends}) must not exceed reps ({reps}): every backend "
                         "runs at least one repetition")
    else:
        k = backends
    if isinstance(layouts, bool) or not isinstance(layouts, int) or layouts < 0 \
            or layouts == 1:
        raise BenchError(f"layouts must be 0 (none) or an integer >= 2, got {layouts!r}")
    if layouts:
        with_variant = [r.label for r in refs if r.variant is not None]
        if with_variant:
            raise BenchError(f"--layouts builds each arm's layouts itself: name the builds "
                             f"without @variant ({', '.join(with_variant)})")
        if backends != "auto" and backends != layouts:
            raise BenchError(f"--layouts {layouts} runs one backend per layout: leave "
                             f"--backends at auto or give {layouts}")
        if layouts > reps:
            raise BenchError(f"layouts ({layouts}) must not exceed reps ({reps}): every "
                             "layout runs at least one repetition")
        k = layouts
    return BenchRequest(tuple(refs), workload, float(scale), reps, modes, warmup,
                        parse_settings(settings), k, bool(allow_plan_differences),
                        int(layouts))


def layout_presets(ref: BuildRef, layouts: int) -> list[str]:
    """The builds an arm runs with *layouts* L: ``PRESET@layout1`` ... ``@layoutL`` in
    block order; the A/A arm starts one later (layout 2, 3, ..., 1), so in every block
    vanilla and its A/A twin run different layouts."""
    order = list(range(1, layouts + 1))
    if ref.label == AA_LABEL:
        order = order[1:] + order[:1]
    return [f"{ref.preset}@layout{i}" for i in order]


#: The label of the A/A arm ``--aa`` adds.
AA_LABEL = "vanilla-aa"


def add_aa_arm(refs: Sequence[BuildRef]) -> list[BuildRef]:
    """*refs* plus an A/A arm: the reference vanilla again, on clusters (and backends) of
    its own, labelled :data:`AA_LABEL`. Its difference from vanilla is noise by
    construction, so its interval is the smallest difference the run could detect.

    Where the build layer offers variants of a build (another code layout:
    ``vanilla@layout2``) the A/A arm should run one, so that layout shifts count as
    noise too; :data:`AA_VARIANT` names it (None until such variants exist).
    """
    vanillas = [r for r in refs if r.base_preset.split("/")[-1] == "vanilla"
                and not r.settings and r.variant is None]
    if not vanillas:
        raise BenchError("--aa repeats the vanilla build: include vanilla (or pg19/vanilla) "
                         "in --builds")
    if any(r.label == AA_LABEL for r in refs):
        raise BenchError(f"--aa adds an arm labelled {AA_LABEL!r}: that label is taken")
    ref = vanillas[0]
    preset = f"{ref.preset}@{AA_VARIANT}" if AA_VARIANT else ref.preset
    return [*refs, BuildRef(AA_LABEL, preset)]


#: The build variant an A/A arm runs (another code layout of the same source) once the
#: build layer makes them; None: the same binary on another cluster and backends.
AA_VARIANT: str | None = None


# ---------------------------------------------------------------------------
# files


def _full_message(out_dir: Path, e: OSError, rows: int) -> str:
    kept = (f"; the {rows} rows measured before are kept in {out_dir / TIMINGS_CSV}"
            if rows else "")
    return (f"profiles folder is full: free space or choose --out (writing in {out_dir} "
            f"failed: {e.strerror or e}){kept}")


def _now() -> str:
    return rundir.now()


def load_timings(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """The run's timings: ``timings.parquet`` if written, else the streamed ``timings.csv``.

    The CSV is what survives a run that died; rows are whole (see :class:`profkit.rundir.RowWriter`).
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
                                "query": "string", "mode": "string", "preset": "string",
                                "settings": "string"})
    df = df.dropna(subset=["rep", "order"])
    if "settings" in df.columns:
        df["settings"] = df["settings"].fillna("")
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


def load_bench(run_dir: str | os.PathLike[str] | None = None) -> BenchResult:
    """A benchmark run read back from its directory (default: ``profiles/latest``),
    through the one run loader (:func:`profkit.rundir.load_run`)."""
    rd = rundir.load_run(run_dir)
    kind = rd.provenance.get("kind")
    if kind not in (None, "bench"):
        raise BenchError(f"{rd.path} is a {kind} run, not a benchmark: load it with "
                         "profkit.rundir.load_run")
    return BenchResult(rd.run_id, rd.path, load_timings(rd.path), load_instructions(rd.path),
                       rd.provenance)


# ---------------------------------------------------------------------------
# the run


class PlanDifference(BenchError):
    """The arms chose different plans for the same query: their times are not comparable."""


class _Bench:
    """What a benchmark does per cell of the :class:`harness.Session` (the engine runs
    clusters, backends, interleaving and timing): run a mode, check its answer, write the
    row; and the plans each arm chose (``EXPLAIN (COSTS OFF)``), compared across arms."""

    def __init__(self, req: BenchRequest, wl: Workload, run_id: str, out_dir: Path,
                 reporter: Progress, session: harness.Session) -> None:
        self.req = req
        self.wl = wl
        self.run_id = run_id
        self.out_dir = out_dir
        self.progress = reporter
        self.session = session
        self.rows: list[dict[str, Any]] = []
        self.writer: rundir.RowWriter | None = None
        self.expected = wl.expected_rows(req.scale)
        #: label -> the plan its first backend chose (EXPLAIN (COSTS OFF) of the query)
        self.plans: dict[str, str] = {}
        self.plan_differs = False
        self.block = 0

    @property
    def targets(self) -> list[harness.Target]:
        return self.session.targets

    # -- per backend -------------------------------------------------------------
    def prepare(self, t: harness.Target) -> None:
        """A fresh backend: load the workload, record the plan it chooses."""
        import psycopg

        if t.arm == self.session.arms[0]:
            self.block = t.block
            self.progress.phase("starting clusters and loading data"
                                + (f" (backend {t.block} of {self.req.backends} per build)"
                                   if self.req.backends > 1 else ""), len(self.req.refs))
        try:
            self.wl.load(t.conn, self.req.scale)  # type: ignore[arg-type]
            rows = t.conn.execute(PLAN_PREFIX + self.wl.select_sql,  # type: ignore[union-attr]
                                  prepare=False).fetchall()
        except psycopg.Error as e:
            assert self.session.clusters is not None
            raise BenchError(f"could not prepare the cluster of build {t.label!r} "
                             f"(pg_stat_statements, loading {self.wl.name} at scale "
                             f"{self.req.scale}): {e}; server log: "
                             f"{self.session.clusters.log_file(t.label)}") from e
        plan = "\n".join(str(r[0]) for r in rows)
        self.plans.setdefault(t.label, plan)
        self.progress.advance(f"{t.label}: cluster on port {t.cluster.port}, {self.wl.name} "
                              f"loaded at scale {self.req.scale}")

    def check_plans(self, targets: list[harness.Target]) -> None:
        """Same plan or no comparison: stop when the arms chose different plans (both
        shown), unless allowed (then every table says so)."""
        majors: dict[str, dict[str, list[str]]] = {}
        for t in targets:
            plan = self.plans.get(t.label, "")
            major = pg_major(t.build.version)
            majors.setdefault(major, {}).setdefault(plan, []).append(t.label)
        # builds of one PostgreSQL major must agree; another major's planner (and EXPLAIN
        # format) may differ: those are compared per major only
        differ = {m: g for m, g in majors.items() if len(g) > 1}
        if not differ:
            return
        self.plan_differs = True
        shown = "\n\n".join(f"{', '.join(labels)}:\n{plan}" for g in differ.values()
                            for plan, labels in g.items())
        if not self.req.allow_plan_differences:
            raise PlanDifference(
                f"the builds chose different plans for the {self.wl.name} query, so their "
                f"times would compare different work:\n\n{shown}\n\nPass "
                "--allow-plan-differences to measure anyway (every table is then marked)")
        self.progress.say(f"[the builds chose different plans; every table is marked]\n{shown}")

    # -- per cell ------------------------------------------------------------------
    def execute(self, t: harness.Target, mode: str) -> dict[str, Any]:
        """Run *mode* once on *t* (:meth:`harness.Session.execute`)."""
        try:
            m = self.session.execute(t, self.wl.query(mode), what=mode, key=mode)
        except harness.HarnessError as e:
            raise BenchError(f"{e} (build {t.label}, {mode})") from None
        if m.pgss_calls != 1:
            raise BenchError(
                f"pg_stat_statements counted {m.pgss_calls} calls of the {mode} "
                f"statement on {t.label} for one execution (expected 1): is another "
                "session running it? The benchmark's clusters must be private")
        if mode == "plain" and self.expected is not None:
            got = harness.first_value(m.rows)
            if got != self.expected:
                raise BenchError(
                    f"build {t.label} returned {got!r} for the plain {self.wl.name} query at "
                    f"scale {self.req.scale}, expected {self.expected}: the build computes "
                    "wrong results (check its patches with `profkit regress`)")
        ex, pl = explain_times(m.rows) if mode != "plain" else (math.nan, math.nan)
        return {"client_ms": m.client_ms, "server_ms": m.server_ms, "cpu_ms": m.cpu_ms,
                "explain_ms": ex, "planning_ms": pl, "t_start": m.t_start,
                "backend_pid": t.backend_pid, "calib_before_ms": m.calib_before_ms,
                "calib_after_ms": m.calib_after_ms, "runq_ms": m.runq_ms, **m.counters}

    def warm(self, t: harness.Target, mode: str) -> None:
        # at least one execution per mode: it checks the plain result and finds each
        # statement's pg_stat_statements entry
        try:
            self.execute(t, mode)
        except harness.ExecFailed as e:
            raise self._failure(e, "the warm-up") from e.err
        self.progress.advance(f"warm-up {t.label} {mode}")

    def on_block(self, targets: list[harness.Target]) -> None:
        if targets and targets[0].block == 1:
            self.check_plans(targets)
        n = len(targets) * len(self.req.modes)
        block = harness.split_reps(self.req.reps, self.req.backends)[targets[0].block - 1]
        self.progress.phase("warm-up and benchmark", n * (max(self.req.warmup, 1)
                                                          + len(block)))

    def cell(self, t: harness.Target, mode: str, rep: int, slot: int, order: int) -> None:
        self.extra(rep, slot)
        try:
            m = self.execute(t, mode)
        except harness.ExecFailed as e:
            raise self._failure(e, f"repetition {rep} of {self.req.reps}"
                                + (" (an extra one)" if rep > self.req.reps else "")) from e.err
        row = {
            "run_id": self.run_id, "build": t.label, "workload": self.wl.name,
            "query": query_name(mode), "mode": mode, "rep": rep, "order": order,
            **m, "slot": slot, "preset": t.arm.preset, "settings": t.arm.settings_text,
            "backend": t.block,
        }
        self.rows.append(row)
        assert self.writer is not None
        self.writer.write(row)
        self.progress.advance(f"{harness.rep_text(rep, self.req.reps)}: {t.label} {mode} "
                              f"{m['client_ms']:.0f} ms")

    def extra(self, rep: int, slot: int) -> None:
        """Before the first cell of an extra repetition: its own progress phase."""
        if rep > self.req.reps and slot == 0:
            self.progress.phase(f"extra repetition {rep} (vCPU rule)",
                                len(self.session.targets) * len(self.req.modes))

    def _failure(self, e: harness.ExecFailed, when: str) -> BenchError:
        kept = len(self.rows)
        what = f"The {kept} rows measured before are kept in {self.out_dir / TIMINGS_CSV}"
        crashed, msg = self.session.failure(e, when, kept=what)
        return (ServerCrashed if crashed else BenchError)(msg, run_dir=self.out_dir, rows=kept)

    def shown_settings(self) -> dict[str, dict[str, str]]:
        """``SHOW`` of every arm's own settings, as its server reports them (the check
        that a setting took: a value it rounds or refuses shows here)."""
        return {t.label: dict(t.shown) for t in self.session.all_targets
                if t.block == 1 and t.shown}


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

    if instructions not in ("auto", "callgrind", "perf_stat", "none"):
        raise BenchError(f"instructions must be auto, callgrind, perf_stat or none, not "
                         f"{instructions!r}")
    if instructions == "auto":
        return instruction_counter()
    return instructions


def _count_callgrind(r: _Bench, instr_scale: float, timeout: float) -> pd.DataFrame:

    queries = {m: r.wl.query(m) for m in r.req.modes}

    def one(t: harness.Target) -> pd.DataFrame:
        harness.Session.disconnect(t)
        if instr_scale != r.req.scale:
            with t.cluster.connect() as c:
                r.wl.load(c, instr_scale)
        dest = r.out_dir / "callgrind" / t.label
        session = collect_callgrind_cluster(t.cluster, queries, dest, warmup_sql="",
                                            timeout=timeout)
        df = instr_counts_from_session(session, run_id=r.run_id, build=t.label,
                                       workload=r.wl.name)
        df["scale"] = instr_scale
        df["preset"] = t.arm.preset
        df["query"] = df["mode"].map(query_name)
        df["out_file"] = df["out_file"].map(lambda p: os.path.relpath(p, r.out_dir))
        r.progress.advance(f"callgrind {t.label}: "
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


def _count_perf_stat(r: _Bench) -> pd.DataFrame:

    rows = []
    r.progress.phase("instruction counts (perf stat)", len(r.targets) * len(r.req.modes))
    for t in r.targets:
        conn = t.conn
        assert conn is not None
        for mode in r.req.modes:
            sql = r.wl.query(mode)
            out = r.out_dir / "perf_stat" / f"{t.label}.{mode}.csv"
            n = perf_stat_instructions(
                t.backend_pid,
                lambda c=conn, q=sql: c.execute(q, prepare=False).fetchall(),
                out_path=out)
            rows.append({"run_id": r.run_id, "build": t.label, "workload": r.wl.name,
                         "query": query_name(mode), "mode": mode, "instructions": round(n),
                         "tool": "perf_stat", "scope": "backend (perf stat -e instructions:u -p)",
                         "scale": r.req.scale, "preset": t.arm.preset,
                         "out_file": os.path.relpath(out, r.out_dir)})
            r.progress.advance(f"perf stat {t.label} {mode}: {n:,.0f}")
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
    #: (metric, center) -> the summary computed once (:func:`summary_table`)
    summaries: dict[tuple[str, str], pd.DataFrame] = field(default_factory=dict, repr=False)

    def summary(self, metric: str | None = None, center: str = "median") -> pd.DataFrame:
        """Per build and mode, as in summary.csv (with the columns against vanilla):
        :func:`summary_table`, computed once per metric and center and read after (the
        report's table is this one)."""
        key = (metric or default_metric(self.timings), center)
        if key not in self.summaries:
            self.summaries[key] = summary_table(self.timings, self.instructions,
                                                self.provenance, key[0], center=key[1])
        return self.summaries[key]

    def _repr_html_(self) -> str:
        import html


        head = (f"<b>Benchmark {html.escape(self.run_id)}</b>: {self.provenance.get('workload')} "
                f"at scale {self.provenance.get('scale')}, {self.provenance.get('reps')} "
                f"repetitions, <code>{html.escape(str(self.out_dir))}</code>")
        return head + seed_table(self.summary()).to_html(index=False, na_rep="–")

    def __repr__(self) -> str:
        return (f"<BenchResult {self.run_id}: {len(self.timings)} executions, "
                f"{self.timings['build'].nunique()} builds, at {self.out_dir}>")


def run_bench(
    builds: str | Sequence[Any] | BenchRequest,
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
    root: str | os.PathLike[str] | None = None,
    calibrate: bool = True,
    pin_cpu: int | str | None = "auto",
    backends: int | str = "auto",
    aa: bool = False,
    allow_plan_differences: bool = False,
    layouts: int = 0,
    min_kept: int | str | None = "auto",
) -> BenchResult:
    """Benchmark *modes* of *workload* on every build, interleaved; see the module doc.

    *out_dir* is the run directory (it must not exist or be empty); without it the run
    is named here (:func:`profkit.rundir.new_run_id`) under *root* (default profiles/)
    and ``<root>/latest`` points at it once it completes. *instructions*: ``"auto"``
    counts with perf stat where the CPU has counters, else callgrind; ``"none"`` skips
    counting. *instr_scale* forces the callgrind scale (default: the bench scale if it
    fits *callgrind_budget_s* per build, else a smaller one; the scale used is in
    instructions.csv and the provenance).

    *pin_cpu*: the CPU every backend is pinned to (``"auto"``: the last one, when there
    are two or more; None: not pinned). *calibrate*: run the vCPU calibration
    (:mod:`profkit.collect.vcpu`) just before and after every execution, on that CPU;
    its times and the backend's context switches, migrations, page faults and steal
    time are extra columns of the timings (the report's robust estimates use them,
    :func:`profkit.analyze.stats.vcpu_adjust`).

    *min_kept* (with *calibrate*): a cell (build, mode) the vCPU rule left with fewer
    kept repetitions than this gets extra repetitions of every cell, interleaved as the
    others, at most *reps* of them (``"auto"``: half the repetitions, rounded up; 0 or
    None: never); the provenance's ``extra_repetitions`` says how many ran.

    *backends*, *aa*, *allow_plan_differences*, *layouts*: see :func:`check_request` (ignored when
    *builds* is a checked :class:`BenchRequest`).

    Raises :class:`BenchError` (bad input, before anything starts), :class:`ServerCrashed`
    (naming the build and repetition; rows so far kept), :class:`PlanDifference` (the
    arms chose different plans), :class:`ProfilesFull`.
    """

    # a BenchRequest is already checked (the CLI checks before it names the run)
    req = (builds if isinstance(builds, BenchRequest)
           else check_request(builds, workload, scale, reps, modes, warmup, settings,
                              backends=backends, aa=aa,
                              allow_plan_differences=allow_plan_differences,
                              layouts=layouts))
    wl = get_workload(req.workload)
    if instr_scale is not None:
        check_scale(instr_scale)
    counter = resolve_counter(instructions) if instructions != "none" else "none"
    pin = vcpu_mod.resolve_pin(pin_cpu, BenchError)
    keep = harness.resolve_min_kept(min_kept, req.reps, BenchError)
    seed = order_seed if order_seed is not None else harness.new_seed()

    try:
        run_id, out = rundir.place("bench", req.workload, path=out_dir, base=root,
                                   run_id=run_id)
    except rundir.RunDirError as e:
        raise BenchError(str(e)) from None

    reporter = as_progress(progress)
    with reporter:
        # Builds first (cached ones return at once): a build failure leaves no run dir.
        passed = {b.name: b for b in ([] if isinstance(builds, (str, BenchRequest)) else builds)
                  if isinstance(b, Build)}
        built: dict[str, Build] = {}
        layout_builds: dict[str, list[Build]] = {}
        # one list: each one's configure while the one before it compiles
        made = harness.resolve_builds(
            [p for ref in req.refs
             for p in (layout_presets(ref, req.layouts) if req.layouts
                       else [ref.preset] if ref.preset not in passed else [])],
            progress=reporter.say)  # type: ignore[arg-type]
        for ref in req.refs:
            if req.layouts:
                layout_builds[ref.label] = [made[p] for p in layout_presets(ref, req.layouts)]
                built[ref.label] = layout_builds[ref.label][0]
                continue
            built[ref.label] = passed.get(ref.preset) or made[ref.preset]
        cluster_settings = {**BENCH_SETTINGS, **req.settings}
        session = harness.Session(
            req.refs, {**built, **layout_builds}, name="bench", log_dir=out / "logs",
            options=harness.SessionOptions(backends=req.backends, pin_cpu=pin,
                                           calibrate=calibrate, settings=req.settings,
                                           min_kept=keep),
            say=reporter.say, arm_word="build")
        runner = _Bench(req, wl, run_id, out, reporter, session)
        session.prepare = runner.prepare
        instr_df: pd.DataFrame | None = None
        try:
            with rundir.open_run(
                "bench", path=out, run_id=run_id, workload=req.workload,
                latest=out_dir is None,
                tools=("valgrind", "perf", "gcc"),
                command_line=list(command_line) if command_line is not None
                else list(sys.argv),
                workload_sql={m: wl.query(m) for m in req.modes},
                scale=req.scale, reps=req.reps, warmup=req.warmup,
                backends=req.backends, layouts=req.layouts or None,
                layout_builds={k: [b.name for b in v] for k, v in layout_builds.items()}
                or None,
                aa_label=AA_LABEL if any(
                    r.label == AA_LABEL for r in req.refs) else None,
                modes=list(req.modes), order_seed=seed,
                settings=dict(req.settings), cluster_settings=cluster_settings,
                builds={r.label: {**built[r.label].provenance(), "preset": r.preset,
                                  "arm_settings": r.settings_dict}
                        for r in req.refs},
                source=next(iter(built.values())).source,
                python_packages=_package_versions(),
                metric_note=("server_ms = pg_stat_statements total_exec_time delta (EXPLAIN: "
                             "the utility statement, inner planning included); client_ms = "
                             "client round trip, rows fetched; explain_ms = EXPLAIN's "
                             "Execution Time"),
                instruction_counter=counter,
                pin_cpu=pin, vcpu_calibration=vcpu_mod.calibration_facts(calibrate),
                files={"timings": TIMINGS_CSV, "provenance": PROVENANCE_JSON}) as rd:
                try:
                    runner.writer = rd.rows(TIMINGS_CSV, TIMINGS_COLUMNS)
                    instr_df = _measure(runner, rd, seed, counter, instr_scale,
                                        callgrind_budget_s, reporter)
                    timings = _timings_frame(runner.rows)
                    timings.to_parquet(out / TIMINGS_PARQUET, index=False)
                except BaseException as e:
                    if isinstance(e, BenchError):
                        e.run_dir, e.rows = out, len(runner.rows)
                    _salvage(out, runner.rows)
                    raise
                finally:
                    if runner.writer is not None:
                        runner.writer.close()
                    with contextlib.suppress(OSError):
                        rd.update(rows=len(runner.rows), files=_files(out))
        except rundir.RunDiskFull as e:
            raise ProfilesFull(_full_message(out, e.oserror, len(runner.rows)), run_dir=out,
                               rows=len(runner.rows)) from None
    return BenchResult(run_id, out, timings, instr_df, rd.provenance)


def _measure(runner: _Bench, rd: rundir.RunDir, seed: int, counter: str,
             instr_scale: float | None, callgrind_budget_s: float,
             reporter: Progress) -> pd.DataFrame | None:
    """The session's blocks (clusters, warm-up, interleaved repetitions), then the
    instruction counts on the last block's backends."""

    req, out, session = runner.req, runner.out_dir, runner.session
    instr: list[pd.DataFrame | None] = [None]
    clusters: dict[str, Any] = {}
    pids: dict[str, int] = {}

    def on_block(targets: list[harness.Target]) -> None:
        for t in targets:
            name = session.log_name(t.arm, t.block)
            clusters[name] = {"dir": str(t.cluster.dir), "port": t.cluster.port,
                              "postmaster_pid": t.cluster.pid}
            pids[name] = t.backend_pid
        facts: dict[str, Any] = {"clusters": clusters, "backend_pids": pids}
        if targets[0].block == 1:
            facts.update(server_settings={t.label: server_settings(t.conn)
                                          for t in targets if t.conn is not None},
                         arm_settings_shown=runner.shown_settings(),
                         expected_rows=runner.expected, plans=runner.plans)
        rd.update(**facts)
        runner.on_block(targets)
        if targets[0].block == 1:
            rd.update(plan_differs=runner.plan_differs)

    def after(targets: list[harness.Target]) -> None:
        rd.update(measured_at=_now(), rows=len(runner.rows),
                  extra_repetitions=session.extra_facts(),
                  pgss_queryids={t.label: {m: str(q) for m, q in t.qids.items()}
                                 for t in targets},
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
                instr[0] = _count_callgrind(runner, iscale, timeout=max(
                    1800.0, 20 * callgrind_budget_s))
            elif counter == "perf_stat":
                rd.update(instr_scale=req.scale, instr_scale_reason="bench scale (perf stat)")
                instr[0] = _count_perf_stat(runner)
        except ProfkitError as e:
            # The timings are complete and worth more than the counts: finish the
            # run without them and say so (provenance and report).
            if isinstance(e, BenchError) or (isinstance(e, OSError) and rundir.is_disk_full(e)):
                raise
            instr[0] = None
            rd.update(instructions_error=f"{type(e).__name__}: {e}")
            reporter.say(f"[instruction counts failed, the run continues without "
                         f"them] {e}")

    group = harness.Group("bench", req.modes, seed, run=runner.cell, warm=runner.warm,
                          warmup=req.warmup)
    try:
        session.run(req.reps, [group], after=after, on_block=on_block)
    except harness.HarnessError as e:  # not an execution's failure: a cluster's, a setting's
        raise BenchError(str(e), run_dir=out, rows=len(runner.rows)) from None
    if instr[0] is not None:
        tmp = out / (INSTRUCTIONS_CSV + ".tmp")
        instr[0].to_csv(tmp, index=False)
        os.replace(tmp, out / INSTRUCTIONS_CSV)
    return instr[0]


def builds_info(prov: Mapping[str, Any], timings: pd.DataFrame | None = None
                ) -> dict[str, dict[str, Any]]:
    """label -> {preset, version, arm_settings} from a run's provenance (the timings'
    preset column for a label the provenance lacks; the version is then unknown)."""
    out: dict[str, dict[str, Any]] = {}
    for label, b in (prov.get("builds") or {}).items():
        if not isinstance(b, Mapping):
            continue
        src = b.get("source") if isinstance(b.get("source"), Mapping) else {}
        pgc = b.get("pg_config") if isinstance(b.get("pg_config"), Mapping) else {}
        version = (src or {}).get("version") or str((pgc or {}).get("VERSION", "")).replace(
            "PostgreSQL ", "") or None
        out[str(label)] = {"preset": b.get("preset", label), "version": version,
                           "arm_settings": dict(b.get("arm_settings") or {})}
    if timings is not None and "preset" in timings.columns:
        for label, g in timings.groupby("build"):
            if str(label) not in out:
                out[str(label)] = {"preset": str(g["preset"].iloc[0]), "version": None,
                                   "arm_settings": {}}
    return out


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
    df["settings"] = df["settings"].fillna("").astype("string")
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


def summary_table(timings: pd.DataFrame, instr: pd.DataFrame | None,
                  prov: Mapping[str, Any], metric: str, *, center: str = "median"
                  ) -> pd.DataFrame:
    """THE summary of a bench run (what summary.csv, the report, the console and a
    notebook show): :func:`~profkit.analyze.stats.summarize_metric` per build and mode,
    the instruction counts, the columns against the reference, and the note when plans
    differ between builds."""
    s = summarize_metric(timings, metric, center=center)
    s = attach_instructions(s, instr)
    s = attach_reference(s, timings, builds_info(prov, timings), instr, metric, center=center)
    if prov.get("plan_differs"):
        mark = "plans differ between builds (measured with --allow-plan-differences)"
        s["note"] = [f"{n}; {mark}" if n else mark for n in s["note"].fillna("")]
    return s


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
    #: lines for the console: plans, executions not measured, the A/A reading, backends
    notes: tuple[str, ...] = ()
    aa: Any = None


def write_report(run: BenchResult | str | os.PathLike[str], *, metric: str | None = None,
                 center: str = "median") -> ReportFiles:
    """summary.csv, report.md and the overhead chart (PNG + SVG) of a run.

    *run*: the :class:`BenchResult` :func:`run_bench` returned (nothing is re-read), or a
    run directory, read through :func:`load_bench` — so it works on a run copied from
    another machine and on a run that died half-way. *metric*: cpu_ms, server_ms or
    client_ms (default: :func:`default_metric`); the report shows the other two below
    the main table.
    """

    res = run if isinstance(run, BenchResult) else load_bench(run)
    d, prov, timings, instr = res.out_dir, res.provenance, res.timings, res.instructions
    metric = metric or default_metric(timings)
    s = res.summary(metric, center)
    aa = aa_check(s, str(prov.get("aa_label"))) if prov.get("aa_label") else None
    comps = None
    builds = timings["build"].unique().tolist()
    if len(builds) >= 2 and not timings.empty:
        parts = []
        for mode in ("analyze_notiming", "analyze_timing"):
            if mode in set(timings["mode"]):
                with contextlib.suppress(ComparisonError):
                    parts.append(compare_chain_metric(timings, mode=mode, metric=metric,
                                                      center=center))
        comps = pd.concat(parts, ignore_index=True) if parts else None
    rprov = report_provenance({**prov, "report_metric": metric})
    try:
        write_summary_csv(s, d / SUMMARY_CSV)
        plot_overheads(s, d / CHART_PNG, d / CHART_SVG, provenance=rprov)
        md = render_markdown(s, rprov, comparisons=comps, chart=CHART_PNG)
        md += engine_sections(s, prov, aa)
        md += bench_extra_sections(timings, instr, metric, center)
        (d / REPORT_MD).write_text(md)
    except OSError as e:
        if rundir.is_disk_full(e):
            raise ProfilesFull(_full_message(d, e, 0)) from None
        raise
    return ReportFiles(d, s, comps, d / SUMMARY_CSV, d / REPORT_MD, d / CHART_PNG,
                       d / CHART_SVG, tuple(engine_notes(s, prov, aa)), aa)


