"""Collect the timing-accuracy runs of the clock-source variants.

For each *arm* (a build preset plus optional settings: ``vanilla``, ``coarse_clock``,
``tsc_clock``, ``sampled_timing`` at its default sample rate and at 1) and each seed
workload, repetitions run the plain query, ``EXPLAIN (ANALYZE, TIMING FALSE, FORMAT
JSON)`` and ``EXPLAIN (ANALYZE, TIMING TRUE, FORMAT JSON)``, interleaved: every
repetition runs each (arm, mode) pair once in an order shuffled by a seeded generator,
so drift of this shared, noisy machine lands on all arms alike.

Per execution the client's wall time is measured (``time.perf_counter_ns`` around the
round trip: an independent clock, not the one under test) and, for EXPLAIN, the JSON
plan is kept verbatim.  Files in ``profiles/<run_id>/`` (written as they happen, so a
run that fails keeps what it measured):

- ``provenance.json``: arms, builds (patches and hashes, configure flags), the patch
  GUCs in effect (``SHOW``) per arm, workloads and scales, seed, machine, clock tick;
- ``timings.csv``: the ``timings`` table (+ explain_ms, planning_ms, preset, settings);
- ``plans.jsonl``: one line per EXPLAIN execution (workload, arm, mode, rep, order, plan).

:func:`analyze_run` then reads only those files and writes ``nodes.parquet``/``.csv``
(the ``timing_nodes`` table), ``accuracy.csv``, ``cost.csv``, ``truth.csv``,
``mismatches.csv``, ``verdicts.csv``, ``summary.csv`` and ``report.md``.

The run is a hook on :class:`profkit.experiments.harness.Session` (the engine of every
timing experiment): every arm runs on clusters of its own with its settings in their
postgresql.conf — a session setting (``explain_timing_sample_rate``) and one that needs a
restart (``instr_clock_source``) alike — on *backends* independent backends per arm
(fresh clusters, the repetitions split between them).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from profkit import rundir, tables
from profkit.analyze import stats
from profkit.analyze import timing_accuracy as ta
from profkit.collect import vcpu
from profkit.errors import ProfkitError
from profkit.experiments import harness
from profkit.modes import MODES, query_name
from profkit.render import markdown as render_md
from profkit.render.bench_report import extra_reps_note
from profkit.progress import ProgressFn
from profkit.collect.clock import measure_clocks
from profkit.patches import PATCH_GUCS, PRESETS
from profkit.pg.build import find_build, get_build, presets
from profkit.pg.workloads import check_scale, get_workload
from profkit.rundir import load_run

if TYPE_CHECKING:
    import psycopg

    from profkit.rundir import RunDir
    from profkit.pg.build import Build

log = logging.getLogger("profkit.experiments.timing_accuracy")


TIMINGS_CSV = "timings.csv"
PLANS_JSONL = "plans.jsonl"
TIMINGS_COLUMNS: tuple[str, ...] = (
    *tables.SCHEMAS["timings"], "cpu_ms", "wait_ms", "explain_ms", "planning_ms", "preset",
    "settings", "slot", "backend_pid", "t_start", "backend", "calib_before_ms",
    "calib_after_ms",
    # what disturbed the backend over the execution (page faults, context switches,
    # migrations, steal; collect.vcpu), as profkit bench records it: a plain query slower
    # than its EXPLAIN (stats.plain_suspect) can then be told from a memory effect
    *vcpu.DELTA_COLUMNS,
)

#: Modest scales, so that one run of all arms takes minutes on 2 cores.
DEFAULT_SCALES: dict[str, float] = {"nested_loop": 0.05, "join_sum": 0.2, "count_star": 0.1}
DEFAULT_REPS = 9
BASELINE = "vanilla"
#: The second yardstick: the TSC clock's times carry a fraction of vanilla's clock
#: overhead and its Execution Time agrees with the wall clock (checked per run).
DEFAULT_REFERENCE = "tsc_clock"

# Linux's clock id (time.h): Python's time module does not export it.
CLOCK_MONOTONIC_COARSE = getattr(time, "CLOCK_MONOTONIC_COARSE", 6)


class TimingAccuracyError(ta.TimingAccuracyError):
    """The run cannot start or stopped; ``run_dir`` says where its files are."""

    def __init__(self, message: str, *, run_dir: Path | None = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir


# ---------------------------------------------------------------------------
# arms


#: An arm of the timing-accuracy run is the harness's arm (one model for every
#: experiment): a build preset measured under a label, its settings in its own cluster.
Arm = harness.Arm


DEFAULT_ARMS: tuple[Arm, ...] = (
    Arm("vanilla", "vanilla"),
    Arm("coarse_clock", "coarse_clock"),
    Arm("tsc_clock", "tsc_clock"),
    Arm("sampled_timing", "sampled_timing"),
    # rate 1 times every call through the same code: must behave like vanilla
    Arm("sampled_timing_n1", "sampled_timing", (("explain_timing_sample_rate", "1"),)),
)


def parse_arm(text: str | Arm) -> Arm:
    """``"tsc_clock"``, ``"label=preset"`` or ``"label=preset:guc=value,guc=value"``
    (:func:`harness.parse_arm`; :class:`TimingAccuracyError` for a bad one).

    >>> parse_arm("s1=sampled_timing:explain_timing_sample_rate=1")
    Arm(label='s1', preset='sampled_timing', settings=(('explain_timing_sample_rate', '1'),))
    """
    try:
        return harness.parse_arm(text)
    except harness.HarnessError as e:
        raise TimingAccuracyError(f"arm {e}") from None


def check_arms(arms: Sequence[str | Arm], baseline: str) -> list[Arm]:

    parsed = [parse_arm(a) for a in arms]
    if not parsed:
        raise TimingAccuracyError("no arms given: name at least the baseline and one variant")
    labels = [a.label for a in parsed]
    dups = sorted({x for x in labels if labels.count(x) > 1})
    if dups:
        raise TimingAccuracyError(f"arm label(s) {', '.join(dups)} given twice")
    known = presets()
    bad = sorted({a.base_preset for a in parsed if a.base_preset not in known})
    if bad:
        raise TimingAccuracyError(f"unknown build preset(s) {', '.join(bad)}; known: "
                                  f"{', '.join(sorted(known))}")
    if baseline not in labels and baseline.replace("/", "-") in labels:
        baseline = baseline.replace("/", "-")  # named by its preset: "pg19/vanilla"
    if baseline not in labels:
        raise TimingAccuracyError(f"the baseline {baseline!r} is not among the arms "
                                  f"({', '.join(labels)}): every comparison needs it")
    if len(parsed) < 2:
        raise TimingAccuracyError("only the baseline given: add a variant to compare")
    return parsed


def check_scales(scales: Mapping[str, float]) -> dict[str, float]:

    if not scales:
        raise TimingAccuracyError("no workloads given")
    out = {}
    for name, s in scales.items():
        get_workload(name)
        check_scale(s)
        out[name] = float(s)
    return out


def resolve_builds(arms: Sequence[Arm], *, build_missing: bool, baseline: str,
                   progress: ProgressFn | None = None) -> tuple[dict[str, Build], list[Arm]]:
    """preset -> cached Build (building missing ones only when asked); skipped arms.

    Without *build_missing* an arm whose build is not in the cache is skipped (and
    listed), except the baseline's: without it nothing can be compared.
    """

    builds: dict[str, Build] = {}
    skipped: list[Arm] = []
    for a in arms:
        if a.preset in builds:
            continue
        b = find_build(a.preset)
        if b is None and (build_missing or a.label == baseline):
            b = get_build(a.preset, progress=progress)
        if b is not None:
            builds[a.preset] = b
    kept = [a for a in arms if a.preset in builds]
    skipped = [a for a in arms if a.preset not in builds]
    if len(kept) < 2:
        raise TimingAccuracyError(
            "no variant build is cached (" + ", ".join(a.preset for a in skipped)
            + "): build them first (`profkit build coarse_clock tsc_clock sampled_timing`) "
            "or pass --build-missing")
    return builds, skipped


# ---------------------------------------------------------------------------
# the run


_now = rundir.now

METRIC_NOTE = (
    "cpu_ms / wait_ms: the backend's on-CPU / run-queue-wait time during "
    "the statement (/proc/PID/schedstat deltas read by the client before "
    "and after; ns resolution, independent of the clock under test); "
    "server_ms: clock_timestamp() read by the backend right before and "
    "after the statement, in one simple-protocol message (gettimeofday, "
    "not instr_time: independent of the clock under test; includes "
    "parse/plan/output; NOT pg_stat_statements as in `profkit bench`, "
    "which would time with the clock under test); client_ms: wall time "
    "around the round trip in the client (scheduling noise of the "
    "client process included); explain_ms/planning_ms: EXPLAIN's own "
    "Execution/Planning Time (measured by the build's clock)")


def coarse_tick_ms() -> float | None:
    """Resolution of CLOCK_MONOTONIC_COARSE in ms (the kernel's tick), None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return time.clock_getres(CLOCK_MONOTONIC_COARSE) * 1000.0
    except OSError:
        return None


def _text_json(conn: psycopg.Connection) -> None:
    """Receive EXPLAIN's json as text: parsing it must not count in the client time."""
    from psycopg.types.string import TextLoader

    conn.adapters.register_loader("json", TextLoader)


class _Accuracy:
    """What a timing-accuracy run does per cell of the :class:`harness.Session`: run a
    mode (the backend's own clock_timestamp() around it: not the clock under test),
    check the plain answer, keep EXPLAIN's JSON plan, write the row and the plan."""

    def __init__(self, scales: Mapping[str, float], run_id: str,
                 session: harness.Session, say: ProgressFn) -> None:
        self.scales = dict(scales)
        self.run_id = run_id
        self.session = session
        self.say = say
        self.timings: rundir.RowWriter | None = None
        self.plans: rundir.RowWriter | None = None

    @property
    def order(self) -> int:
        return self.session.order

    def prepare(self, t: harness.Target) -> None:
        """A fresh backend: every workload loaded, EXPLAIN's json as text, the patch
        settings in effect recorded (``SHOW``)."""

        assert t.conn is not None
        for wl, sc in self.scales.items():
            get_workload(wl).load(t.conn, sc)
        _text_json(t.conn)
        gucs = [g for p in PRESETS.get(t.arm.base_preset, []) for g in PATCH_GUCS.get(p, {})]
        for g in dict.fromkeys(gucs):
            t.shown[g] = str(t.conn.execute(f"SHOW {g}").fetchone()[0])  # type: ignore[index]
        self.say(f"{t.label}: cluster on port {t.cluster.port}, loaded "
                 + ", ".join(f"{w} @ {s:g}" for w, s in self.scales.items()))

    def execute(self, t: harness.Target, workload: str, mode: str) -> dict[str, Any]:

        wl = get_workload(workload)
        sql = wl.query(mode, fmt="json" if mode != "plain" else None)
        try:
            # server_ms from the backend's clock_timestamp() around the statement, in
            # one message: not pg_stat_statements, which times with the clock under test
            m = self.session.execute(t, sql, what=f"{mode} of {workload}", stamps=True)
        except harness.ExecFailed as e:  # the caller adds what was kept
            raise TimingAccuracyError(self.session.failure(e, "the run")[1]) from e.err
        rows = m.rows
        res: dict[str, Any] = {"client_ms": m.client_ms, "t_start": m.t_start,
                               "server_ms": m.server_ms, "cpu_ms": m.cpu_ms,
                               "wait_ms": m.runq_ms, "calib_before_ms": m.calib_before_ms,
                               "calib_after_ms": m.calib_after_ms, "counters": m.counters,
                               "explain_ms": math.nan, "planning_ms": math.nan, "plan": None}
        if mode == "plain":
            exp = wl.expected_rows(self.scales[workload])
            got = rows[0][0] if rows and rows[0] else None
            if exp is not None and got != exp:
                raise TimingAccuracyError(
                    f"{t.label} returned {got!r} for the plain {workload} query at scale "
                    f"{self.scales[workload]}, expected {exp}: the build computes wrong results")
        else:
            text = rows[0][0]
            plan = json.loads(text)
            res["plan"] = text
            res["explain_ms"] = float(plan[0].get("Execution Time", math.nan))
            res["planning_ms"] = float(plan[0].get("Planning Time", math.nan))
        return res

    def group(self, workload: str, seed: int, warmup: int, reps: int) -> harness.Group:
        """The cells of one workload: its three modes on every arm."""
        n_arms = len(self.session.arms)

        def cell(t: harness.Target, mode: str, rep: int, slot: int, order: int) -> None:
            self._record(t, workload, mode, rep, slot, order, self.execute(t, workload, mode))
            if slot == n_arms * len(MODES) - 1:
                self.say(f"{workload}: {harness.rep_text(rep, reps, 'repetition')} done")

        return harness.Group(workload, MODES, f"{seed}-{workload}", run=cell,
                             warm=lambda t, m: self.execute(t, workload, m), warmup=warmup)

    def _record(self, t: harness.Target, workload: str, mode: str, rep: int, slot: int,
                order: int, r: Mapping[str, Any]) -> None:
        assert self.timings is not None and self.plans is not None
        row = {"run_id": self.run_id, "build": t.label, "workload": workload,
               "query": query_name(mode), "mode": mode, "rep": rep,
               "order": order, "client_ms": r["client_ms"], "server_ms": r["server_ms"],
               "cpu_ms": r["cpu_ms"], "wait_ms": r["wait_ms"],
               "explain_ms": r["explain_ms"], "planning_ms": r["planning_ms"],
               "preset": t.arm.preset, "settings": t.arm.settings_text,
               "slot": slot, "backend_pid": t.backend_pid, "t_start": r["t_start"],
               "backend": t.block, "calib_before_ms": r["calib_before_ms"],
               "calib_after_ms": r["calib_after_ms"], **r["counters"]}
        self.timings.write(row)
        if r["plan"] is not None:
            self.plans.json_line({"workload": workload, "arm": t.label,
                                  "preset": t.arm.preset, "mode": mode, "rep": rep,
                                  "order": order, "plan": json.loads(r["plan"])})


@dataclass
class TimingAccuracyResult:
    """What :func:`analyze_run` computed; every table is also a file in ``run_dir``."""

    run_dir: Path
    provenance: dict[str, Any]
    timings: pd.DataFrame
    nodes: pd.DataFrame
    mismatches: pd.DataFrame
    accuracy: pd.DataFrame
    cost: pd.DataFrame
    cost_wall: pd.DataFrame
    truth: pd.DataFrame
    verdicts: pd.DataFrame
    summary: pd.DataFrame
    grid: dict[str, pd.DataFrame]
    report_md: Path
    #: the slow-vCPU rule's account of the run ("" without calibration)
    vcpu_note: str = ""
    #: arms whose EXPLAIN ANALYZE ran faster than their plain query beyond noise
    #: (:func:`profkit.analyze.timing_accuracy.plain_suspects`): their overheads rest on
    #: suspect plain executions
    suspects: tuple[str, ...] = ()

    def _repr_html_(self) -> str:
        return (f"<b>timing accuracy</b> {self.run_dir}<br>"
                + self.summary.to_html(index=False) + "<ul>"
                + "".join(f"<li><b>{r.workload} / {r.arm}: {r.verdict}</b> — {r.text}</li>"
                          for r in self.verdicts.itertuples()) + "</ul>")


def run_timing_accuracy(
    arms: Sequence[str | Arm] = DEFAULT_ARMS,
    scales: Mapping[str, float] | None = None,
    *,
    reps: int = DEFAULT_REPS,
    warmup: int = 1,
    baseline: str = BASELINE,
    build_missing: bool = False,
    out_dir: str | os.PathLike[str] | None = None,
    run_id: str | None = None,
    seed: int | None = None,
    clock_cost: bool = True,
    nice: int | None | str = "auto",
    tol_pct: float = ta.DEFAULT_TOL_PCT,
    min_node_ms: float = ta.MIN_NODE_MS,
    progress: ProgressFn | None = None,
    backends: int | str = "auto",
    pin_cpu: int | str | None = "auto",
    calibrate: bool = True,
    min_kept: int | str | None = "auto",
) -> TimingAccuracyResult:
    """Measure, then analyse (see the module doc).  Returns :func:`analyze_run`'s result.

    *arms*: :class:`Arm` or strings for :func:`parse_arm`.  *scales*: workload -> scale
    (default :data:`DEFAULT_SCALES`).  Arms whose build is not cached are skipped unless
    *build_missing* (the baseline is always built).  *clock_cost*: also measure the cost
    of one read of each clock source (profkit.collect.clock) into ``clock_cost.csv``.
    *nice*: scheduling priority given to the measured backends (by pid); ``"auto"`` =
    −20 when running as root, else unchanged (None). *backends*: independent backends
    (each on a fresh cluster) per arm, the repetitions split between them (``"auto"``:
    :func:`harness.auto_backends`).

    As ``profkit bench`` does: every backend is pinned to *pin_cpu* (``"auto"``: the last
    CPU, when there are two or more; None: not pinned) and, with *calibrate*, the vCPU
    calibration runs just before and after every execution: the analysis leaves out the
    executions the slow-vCPU rule rejects (:func:`profkit.analyze.stats.vcpu_adjust`),
    and a cell left with fewer than *min_kept* repetitions gets extra repetitions of every
    cell (at most *reps*; ``"auto"``: half of *reps*, rounded up; 0 or None: never).

    Every arm runs on clusters of its own with its settings in their postgresql.conf (the
    harness's one rule), also arms of one preset that differ only in a session setting.
    """

    say = progress or (lambda s: None)
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise TimingAccuracyError(f"reps must be an integer >= 1, got {reps!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise TimingAccuracyError(f"warmup must be an integer >= 0, got {warmup!r}")
    arm_list = check_arms(arms, baseline)
    if baseline not in {a.label for a in arm_list}:
        baseline = baseline.replace("/", "-")  # check_arms accepted it as a bare pg19/ preset
    sc = check_scales(DEFAULT_SCALES if scales is None else scales)
    builds, skipped = resolve_builds(arm_list, build_missing=build_missing, baseline=baseline,
                                     progress=say)
    for a in skipped:
        say(f"skipping {a.label}: build {a.preset} is not cached (--build-missing builds it)")
    arm_list = [a for a in arm_list if a.preset in builds]
    seed = seed if seed is not None else harness.new_seed()
    if nice == "auto":
        nice = -20 if os.geteuid() == 0 else None
    if nice is not None and (isinstance(nice, bool) or not isinstance(nice, int)
                             or not -20 <= nice <= 19):
        raise TimingAccuracyError(f"nice must be an integer from -20 to 19 or None, got {nice!r}")
    if backends == "auto":
        backends = harness.auto_backends(reps)
    if isinstance(backends, bool) or not isinstance(backends, int) or not 1 <= backends <= reps:
        raise TimingAccuracyError(f"backends must be an integer from 1 to reps ({reps}) or "
                                  f"'auto', got {backends!r}")
    pin = vcpu.resolve_pin(pin_cpu, TimingAccuracyError)
    keep = harness.resolve_min_kept(min_kept, reps, TimingAccuracyError)

    try:
        run_id, out = rundir.place("timing_accuracy", path=out_dir, run_id=run_id)
    except rundir.RunDirError as e:
        raise TimingAccuracyError(str(e)) from None
    tick = coarse_tick_ms()
    session = harness.Session(
        arm_list, {a.label: builds[a.preset] for a in arm_list}, name="ta",
        log_dir=out / "logs",
        options=harness.SessionOptions(backends=backends, nice=nice, pgss=False, pin_cpu=pin,
                                       calibrate=calibrate, min_kept=keep), say=say)
    runner = _Accuracy(sc, run_id, session, say)
    session.prepare = runner.prepare
    try:
        with rundir.open_run("timing_accuracy", path=out, run_id=run_id, latest=False, **{
            "command_line": list(sys.argv),
            "baseline": baseline, "reps": reps, "backend_nice": nice, "warmup": warmup,
            "backends": backends,
            "order_seed": seed,
            "scales": sc, "modes": list(MODES),
            "arms": [{"label": a.label, "preset": a.preset, "settings": a.settings_dict}
                     for a in arm_list],
            "skipped_arms": [a.label for a in skipped],
            "builds": {p: b.provenance() for p, b in builds.items()},
            "source": next(iter(builds.values())).source,
            # one PostgreSQL version per build: an arm of pg19/... is not the 18.6 of "source"
            "build_versions": {p: (b.provenance().get("source") or {}).get("version")
                               for p, b in builds.items()},
            "patch_gucs": PATCH_GUCS,
            "clock_tick_ms": {"CLOCK_MONOTONIC_COARSE": tick},
            "tick_arms": {a.label: tick for a in arm_list
                          if a.preset == "coarse_clock" and tick is not None},
            "verdict_thresholds": {"tol_pct": tol_pct, "min_node_ms": min_node_ms},
            "metric_note": METRIC_NOTE,
            "pin_cpu": pin, "vcpu_calibration": vcpu.calibration_facts(calibrate),
            "files": {"timings": TIMINGS_CSV, "plans": PLANS_JSONL},
        }) as rd:
            try:
                runner.timings = rd.rows(TIMINGS_CSV, TIMINGS_COLUMNS)
                runner.plans = rd.rows(PLANS_JSONL)
                def on_block(targets: list[harness.Target]) -> None:
                    if targets[0].block == 1:
                        rd.update(arm_settings_shown={t.label: t.shown for t in targets})
                    rd.update(
                        backend_pids={session.log_name(t.arm, t.block): t.backend_pid
                                      for t in session.all_targets},
                        clusters={session.log_name(t.arm, t.block):
                                  {"dir": str(t.cluster.dir), "port": t.cluster.port,
                                   "postmaster_pid": t.cluster.pid}
                                  for t in session.all_targets})
                    say(f"warm-up, then repetitions of {len(targets)} arms × {len(MODES)} "
                        f"modes on {', '.join(sc)}")

                try:
                    session.run(reps, [runner.group(wl, seed, warmup, reps) for wl in sc],
                                on_block=on_block)
                except harness.HarnessError as e:
                    raise TimingAccuracyError(str(e)) from None
                rd.update(measured_at=_now(), extra_repetitions=session.extra_facts())
                if clock_cost:
                    _clock_cost(out, rd, say)
            finally:
                for f in (runner.timings, runner.plans):
                    if f is not None:
                        f.close()
                with contextlib.suppress(OSError):
                    rd.update(executions=runner.order)
    except TimingAccuracyError as e:
        raise TimingAccuracyError(
            f"{e} (the {runner.order} executions measured before are kept in {out}; "
            f"`profkit timing-accuracy --report {out}` analyses them)", run_dir=out) from e
    return analyze_run(out, tol_pct=tol_pct, min_node_ms=min_node_ms)


def _clock_cost(out: Path, rd: RunDir, say: ProgressFn) -> None:
    """ns per read of each clock source the arms use (context for the cost table)."""

    try:
        df = measure_clocks(("clock_monotonic", "clock_monotonic_coarse", "rdtsc", "rdtscp"),
                            loops=2_000_000, repeats=3, run_id=rd.run_id)
    except ProfkitError as e:  # a missing compiler must not lose the measured run
        say(f"clock cost not measured: {e}")
        rd.update(clock_cost_error=str(e))
        return
    df.drop(columns=["histogram"]).to_csv(out / "clock_cost.csv", index=False)
    rd.update(clock_cost_ns={r.source: r.ns_per_call for r in df.itertuples()})
    rd.add_artifact("clock_cost.csv", "ns per read per clock source (clock_bench)")


# ---------------------------------------------------------------------------
# analysis (reads only the run directory)


def load_timings(run_dir: Path) -> pd.DataFrame:
    p = Path(run_dir) / TIMINGS_CSV
    if not p.exists():
        raise TimingAccuracyError(f"{p} is missing: is {run_dir} a timing-accuracy run?")
    df = pd.read_csv(p, dtype={"settings": "string"}, keep_default_na=True)
    return tables.validate(df, "timings")


def load_nodes(run_dir: Path, run_id: str) -> pd.DataFrame:
    """Parse plans.jsonl into the ``timing_nodes`` table."""
    p = Path(run_dir) / PLANS_JSONL
    frames = []
    if p.exists():
        with open(p, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    # a run killed mid-write can leave one partial last line
                    log.warning("%s:%d: not JSON, skipped", p, i)
                    continue
                df = ta.node_times(rec["plan"])
                for k in ("workload", "arm", "preset", "mode", "rep", "order"):
                    df[k] = rec[k]
                df["run_id"] = run_id
                frames.append(df)
    if not frames:
        return tables.empty("timing_nodes")
    out = pd.concat(frames, ignore_index=True)
    return ta.validate_nodes(out)


def arm_versions(prov: Mapping[str, Any]) -> dict[str, str]:
    """arm label -> PostgreSQL version of its build, from a run's provenance (runs made
    before ``build_versions`` was recorded: the builds' own source records, else the
    run's one source)."""
    bv = dict(prov.get("build_versions") or {})
    builds = prov.get("builds") or {}
    default = str((prov.get("source") or {}).get("version", "?"))
    out = {}
    for a in prov.get("arms") or []:
        p = a["preset"]
        v = bv.get(p) or ((builds.get(p) or {}).get("source") or {}).get("version") or default
        out[a["label"]] = str(v)
    return out


def _major(version: str) -> str:
    m = re.match(r"(\d+)", version)
    return m.group(1) if m else version


def version_references(prov: Mapping[str, Any], baseline: str) -> dict[str, str]:
    """arm -> the arm whose plans it must reproduce: the baseline for arms of the
    baseline's major version, else the first arm of the arm's own major version (an
    unpatched one if there is one: another planner may choose another plan)."""
    versions = arm_versions(prov)
    arms = [a["label"] for a in prov.get("arms") or []]
    presets = {a["label"]: a["preset"] for a in prov.get("arms") or []}
    bmaj = _major(versions.get(baseline, "?"))
    out: dict[str, str] = {}
    for a in arms:
        maj = _major(versions[a])
        if maj == bmaj:
            out[a] = baseline
            continue
        same = [x for x in arms if _major(versions[x]) == maj]
        plain = [x for x in same if presets[x].split("/")[-1] == "vanilla"]
        out[a] = (plain or same)[0]
    return out


def vanilla_plain_of(prov: Mapping[str, Any], arms: Sequence[str] | None = None
                     ) -> dict[str, str]:
    """arm -> the vanilla arm of its major version whose plain query is its yardstick
    (the one without settings if several); arms of a version with no vanilla arm are
    left out."""
    versions = arm_versions(prov)
    spec = [a for a in prov.get("arms") or [] if arms is None or a["label"] in arms]
    vanillas = [a for a in spec if a["preset"].split("/")[-1] == "vanilla"]
    vanillas.sort(key=lambda a: bool(a.get("settings")))
    out: dict[str, str] = {}
    for a in spec:
        maj = _major(versions[a["label"]])
        v = [x["label"] for x in vanillas if _major(versions[x["label"]]) == maj]
        if v:
            out[a["label"]] = v[0]
    return out


def _vanilla_plain_section(cost_vanilla: pd.DataFrame, versions: Mapping[str, str]) -> str:
    """report.md: TIMING TRUE/FALSE against vanilla's plain query of the same version."""
    if cost_vanilla.empty:
        return ""
    lines = ["", "## Against vanilla's plain query (same PostgreSQL version)", "",
             f"Metric: {cost_vanilla['metric'].iloc[0]}; median of per-repetition "
             "overheads over the plain query of the arm named in `plain of` (paired "
             "bootstrap 95 % CI): a patch that slows the plain query cannot hide it here.",
             "", "| workload | arm | version | plain of | plain ms | TIMING TRUE vs it "
             "| TIMING FALSE vs it |", "|---|---|---|---|---|---|---|"]

    def ci(r: Any, k: str) -> str:
        v = getattr(r, f"{k}_vs_plain_of_pct", math.nan)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "–"
        return (f"{v:+.1f}% [{getattr(r, f'{k}_vs_plain_of_ci_low'):+.1f}, "
                f"{getattr(r, f'{k}_vs_plain_of_ci_high'):+.1f}]")

    for r in cost_vanilla.itertuples():
        lines.append(f"| {r.workload} | {r.arm} | {versions.get(r.arm, '?')} | {r.plain_of} "
                     f"| {r.plain_of_ms:.1f} | {ci(r, 'timing')} | {ci(r, 'notiming')} |")
    return "\n".join(lines) + "\n"


def apply_vcpu_rule(timings: pd.DataFrame, nodes: pd.DataFrame
                    ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, str, str]:
    """The slow-vCPU rule of ``profkit bench`` (:func:`profkit.analyze.stats.vcpu_adjust`)
    on a run's timings and plans: (all timings, marked ``calib_slow`` with
    ``cpu_kept_ms``; the kept timings; the kept plans' nodes; the rule's account; the
    CPU metric the tables use). Without calibrations nothing is left out (``cpu_ms``);
    a rule that would leave some (workload, arm, mode) without an execution is not
    applied either, and the account says so: every table needs each cell."""
    if not stats.has_calibration(timings):
        return timings, timings, nodes, "", "cpu_ms"
    adj, speed = stats.vcpu_adjust(timings)
    marked = timings.assign(calib_slow=adj["calib_slow"].to_numpy(dtype=bool),
                            cpu_kept_ms=adj["cpu_kept_ms"].to_numpy())
    kept_n = (~marked["calib_slow"]).groupby(
        [marked["workload"], marked["build"], marked["mode"]]).sum()
    empty = [" ".join(map(str, k)) for k, n in kept_n.items() if n == 0]
    if empty:
        return (timings, timings, nodes,
                f"{speed.describe()}; NOT applied: it would leave {', '.join(empty)} without "
                "an execution (the tables use them all)", "cpu_ms")
    slow = set(marked.loc[marked["calib_slow"], ["workload", "build", "mode", "rep"]]
               .itertuples(index=False, name=None))
    if slow and not nodes.empty:
        keys = zip(nodes["workload"], nodes["arm"], nodes["mode"], nodes["rep"], strict=True)
        nodes = nodes[[k not in slow for k in keys]]
    return (marked, marked[~marked["calib_slow"]].drop(columns="calib_slow"), nodes,
            f"{speed.describe()}; the rejected executions are left out of every table "
            "(cpu_kept_ms: the CPU time of the others)", "cpu_kept_ms")


def analyze_run(run_dir: str | os.PathLike[str], *, baseline: str | None = None,
                tol_pct: float | None = None, min_node_ms: float | None = None,
                reference: str | None = None) -> TimingAccuracyResult:
    """Tables, verdicts and report.md of a run directory (re-runnable: only reads files).

    *reference*: a second yardstick arm (default :data:`DEFAULT_REFERENCE`, used when
    it was measured; "" for none): the verdicts also say how far each arm's node
    times are from it (``accuracy_vs_<reference>.csv``).
    """

    rd = load_run(run_dir)
    out = rd.path
    prov = rd.provenance
    baseline = baseline or prov.get("baseline") or BASELINE
    thr = prov.get("verdict_thresholds") or {}
    tol = float(tol_pct if tol_pct is not None else thr.get("tol_pct", ta.DEFAULT_TOL_PCT))
    mnm = float(min_node_ms if min_node_ms is not None
                else thr.get("min_node_ms", ta.MIN_NODE_MS))
    timings = load_timings(out)
    if timings.empty:
        raise TimingAccuracyError(f"{out / TIMINGS_CSV} holds no executions yet")
    if baseline not in set(timings["build"]):
        raise TimingAccuracyError(f"no executions of the baseline {baseline!r} in {out}; "
                                  f"arms: {sorted(timings['build'].unique())}")
    # only complete repetitions: a failed run's last repetition must not bias the medians
    per_rep = timings.groupby(["workload", "rep"]).size()
    full = per_rep.groupby(level=0).transform("max")
    complete = per_rep[per_rep == full].index
    timings = timings.set_index(["workload", "rep"]).loc[
        lambda d: d.index.isin(complete)].reset_index()
    nodes = load_nodes(out, rd.run_id)
    if not nodes.empty:
        nodes = nodes.set_index(["workload", "rep"]).loc[
            lambda d: d.index.isin(complete)].reset_index()
    nodes.to_parquet(out / "nodes.parquet", index=False)
    nodes.to_csv(out / "nodes.csv", index=False)
    all_nodes = nodes
    all_timings, timings, nodes, vcpu_note, cpu = apply_vcpu_rule(timings, nodes)
    extra = extra_reps_note(prov)
    vcpu_note += f". {extra}" if extra and vcpu_note else ""
    all_timings.to_parquet(out / "timings.parquet", index=False)
    pair = "common" if cpu == "cpu_kept_ms" else "auto"

    versions = arm_versions(prov)
    same_version = version_references(prov, baseline)
    mism = ta.compare_rows(nodes, baseline, same_version)
    acc = ta.node_accuracy(nodes, baseline)
    have_cpu = "cpu_ms" in timings and timings["cpu_ms"].notna().all()
    metric = cpu if have_cpu else "server_ms"
    cost = ta.cost_table(timings, baseline, metric=metric, pair=pair)
    cost_wall = ta.cost_table(timings, baseline, metric="server_ms", pair=pair)
    truth = ta.truth_table(timings, nodes, baseline)
    plain_of = vanilla_plain_of(prov, arms=sorted(set(timings["build"])))
    cost_vanilla = ta.cost_vs_plain_of(timings, plain_of, metric=metric, pair=pair)
    if not cost_vanilla.empty:
        cost_vanilla.insert(2, "version", cost_vanilla["arm"].map(versions))
    tick_arms = {k: float(v) for k, v in (prov.get("tick_arms") or {}).items() if v}
    arms_present = set(timings["build"])
    ref = reference if reference is not None else prov.get("reference", DEFAULT_REFERENCE)
    ref = ref if ref and ref in arms_present and ref != baseline else None
    acc_ref = ta.node_accuracy(nodes, ref) if ref else None
    verd = ta.verdicts(acc, truth, cost, baseline, tol_pct=tol, min_node_ms=mnm,
                       tick_ms=tick_arms,
                       reference=(ref, acc_ref) if ref and acc_ref is not None else None)
    summ = ta.summary_table(verd, cost, truth, acc, cost_wall=cost_wall, min_node_ms=mnm,
                            reference=ref)
    if acc_ref is not None:
        acc_ref.to_csv(out / f"accuracy_vs_{ref}.csv", index=False)
    # signed mean error per node against vanilla, the second yardstick and vanilla minus
    # its own clock reads (in-situ cost per read): an estimator's bias, not its median
    read_ns = ta.in_situ_read_ns(timings, nodes, baseline, metric=metric) \
        if not nodes.empty else {}
    # arms of the baseline's major version only: another planner may choose another plan
    same_major = sorted(a for a in arms_present if same_version.get(a, baseline) == baseline)
    # an arm timing every call with a sampling build (explain_timing_sample_rate = 1) is
    # the same cluster's exact twin of the sampled arms: its corrected times are a
    # yardstick free of cluster-to-cluster differences
    twins = {f"{ta.CORRECTED}:{a['label']}": a["label"] for a in prov.get("arms", [])
             if str((a.get("settings") or {}).get("explain_timing_sample_rate")) == "1"
             and a["label"] in same_major}
    # the second yardstick minus its own (cheaper) clock reads, in situ, as for the
    # baseline: "corrected:tsc_clock" holds the least clock cost of the exact yardsticks
    if ref and ref in same_major:
        twins[f"{ta.CORRECTED}:{ref}"] = ref
    more = {name: (lab, ta.in_situ_read_ns(timings, nodes, lab, metric=metric))
            for name, lab in twins.items()} if not nodes.empty else {}
    yards = [baseline, *([ref] if ref in same_major else []), ta.CORRECTED, *more]
    bias = ta.bias_table(nodes, same_major, yards, ns_per_read=read_ns,
                         corrected_from=baseline, more_corrected=more) \
        if not nodes.empty else pd.DataFrame()
    bias.to_csv(out / "bias.csv", index=False)
    bias_md = ""
    if not bias.empty:
        bias_md = ("\n## Bias: signed mean error per node (inclusive time), ± its standard "
                   "error\n\n'corrected' = the baseline's times minus its own clock reads at "
                   + ", ".join(f"{w} {v:.1f} ns" for w, v in read_ns.items())
                   + " per read (in situ)"
                   + "".join(f"; '{n}' = {lab}'s, at " + ", ".join(
                       f"{w} {v:.1f} ns" for w, v in more[n][1].items())
                             for n, lab in twins.items())
                   + ". Exclusive times and run-to-run scatter: bias.csv."
                   "\n\n" + ta.bias_markdown(bias))
        (out / "bias.md").write_text(bias_md.lstrip())
    grid = {arm: ta.tick_grid(nodes[(nodes["arm"] == arm) & (nodes["mode"] == ta.TIMING_MODE)],
                              tick)
            for arm, tick in tick_arms.items()}
    for name, df in (("mismatches", mism), ("accuracy", acc), ("cost", cost),
                     ("cost_wall", cost_wall), ("cost_vs_vanilla", cost_vanilla),
                     ("truth", truth), ("verdicts", verd), ("summary", summ)):
        df.to_csv(out / f"{name}.csv", index=False)
    builds = prov.get("builds") or {}
    facts = {
        "run": f"{rd.run_id} ({prov.get('status', '?')}, {prov.get('started_at', '?')} → "
               f"{prov.get('ended_at', '?')})",
        "PostgreSQL": (", ".join(f"{v} ({', '.join(sorted(a for a, av in versions.items() if av == v))})"
                                 for v in sorted(set(versions.values()), key=str))
                       if len(set(versions.values())) > 1
                       else (prov.get("source") or {}).get("version", "?")),
        "builds": "; ".join(f"{p} (patches: {', '.join(x['name'] + ' ' + x['sha256'][:10] for x in b.get('patches', [])) or 'none'}; key {str(b.get('key', ''))[:12]})"  # noqa: E501
                            for p, b in builds.items()),
        "arms": "; ".join(f"{a['label']} = {a['preset']}"
                          + (f" {a['settings']}" if a.get("settings") else "")
                          + (f" [SHOW: {prov.get('arm_settings_shown', {}).get(a['label'])}]"
                             if prov.get("arm_settings_shown", {}).get(a["label"]) else "")
                          for a in prov.get("arms", [])),
        "workloads": ", ".join(f"{w} @ scale {s:g}" for w, s in (prov.get("scales") or {})
                               .items()),
        "repetitions": f"{prov.get('reps')} interleaved (seed {prov.get('order_seed')}), "
                       f"+{prov.get('warmup')} warm-up; backends at nice "
                       f"{prov.get('backend_nice')}",
        "machine": ", ".join(str((prov.get("machine") or {}).get(k)) for k in
                             ("cpu_model", "cpus", "kernel", "clocksource", "virtualization")),
        "CLOCK_MONOTONIC_COARSE tick": f"{(prov.get('clock_tick_ms') or {}).get('CLOCK_MONOTONIC_COARSE')} ms",  # noqa: E501
        "clock cost (ns/read)": ", ".join(f"{k} {v:.1f}" for k, v in
                                          (prov.get("clock_cost_ns") or {}).items()) or "–",
        "load average (start → end)": f"{prov.get('loadavg_start')} → {prov.get('loadavg_end')}",
        "vCPU": vcpu_note or "no vCPU calibration (calibrate=False, or a run from before it)",
    }
    suspects = tuple(ta.plain_suspects(cost))
    if suspects:
        facts["SUSPECT PLAIN EXECUTIONS"] = " ".join(suspects)
    md = render_md.timing_accuracy_report(title="Timing accuracy of the clock-source variants",
                            facts=facts, verdict_df=verd, cost=cost, truth=truth,
                            accuracy=acc, mismatches=mism, grid=grid, baseline=baseline,
                            cost_wall=cost_wall, min_node_ms=mnm, tol_pct=tol, reference=ref,
                            row_references=same_version)
    md += _vanilla_plain_section(cost_vanilla, versions)
    report = out / "report.md"
    report.write_text(md + bias_md)
    with contextlib.suppress(OSError):
        rd.update(analysis={"baseline": baseline, "tol_pct": tol, "min_node_ms": mnm,
                            "metric": metric, "vcpu": vcpu_note,
                            "analyzed_at": _now(), "mismatches": len(mism),
                            "in_situ_read_ns": read_ns,
                            "in_situ_read_ns_twins": {n: v for n, (_, v) in more.items()}},
                  files={**(prov.get("files") or {}), **{n: f"{n}.csv" for n in (
                      "mismatches", "accuracy", "cost", "cost_wall", "cost_vs_vanilla", "truth",
                      "verdicts", "summary", "bias")},
                      "nodes": "nodes.parquet", "report": "report.md"})
    return TimingAccuracyResult(out, rd.provenance, all_timings, all_nodes, mism, acc, cost,
                                cost_wall, truth, verd, summ, grid, report, vcpu_note,
                                suspects)
