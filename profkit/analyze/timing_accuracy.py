"""How far the clock-source variants' per-node times are from vanilla's, and what they cost.

For ``coarse_clock``, ``tsc_clock`` and ``sampled_timing`` the question is: how far are
their per-node times (EXPLAIN ANALYZE, TIMING TRUE) from vanilla's, and what do they
cost?  The collector (:mod:`profkit.experiments.timing_accuracy`) runs each workload's plain query,
``EXPLAIN (ANALYZE, TIMING FALSE, FORMAT JSON)`` and ``EXPLAIN (ANALYZE, TIMING TRUE,
FORMAT JSON)`` on every build ("arm"), interleaved, and keeps the JSON plans.  The
functions here are pure: plans and ``timings`` rows in, tables out.

Definitions
-----------
- **inclusive time** of a node: ``Actual Total Time × Actual Loops`` (EXPLAIN prints the
  per-loop average, rounded to 1 µs, so the product carries up to 0.5 µs × loops of
  rounding).
- **exclusive time**: inclusive minus the inclusive times of the node's children (its
  sub-plans included).  Can be negative when a child's time is overstated (a leaf's
  timer window holds about one clock read per call: its own start and stop reads
  half each) or estimated (sampling).
- **wall time** (``server_ms`` of the collected ``timings`` table): the backend reads
  ``clock_timestamp()`` right before and right after the statement, all three sent as
  one simple-protocol message, so no client round trip or client scheduling delay is
  inside (on this loaded 2-core VM the client's own wall time scattered by ±10 ms on
  a 10 ms query).  ``clock_timestamp()`` is gettimeofday(), not instr_time: none of the
  patches touches it, so it is the independent clock the variants are judged by.
  (``profkit bench``'s server_ms is pg_stat_statements' — timed with instr_time, i.e.
  with the very clock under test: coarse_clock's would be 4 ms-quantised.)
- **cost**: overhead of TIMING TRUE / FALSE over the plain query of the same arm in the
  backend's CPU time (``cpu_ms``, /proc/PID/schedstat: ns resolution, untouched by the
  patches and by run-queue waits), and in wall time beside it, with
  :func:`profkit.analyze.stats.summarize`'s estimator (median of per-repetition
  overheads, paired bootstrap 95 % CI), as in the bench.
- **truth**: the plain query's wall time minus what is not execution (parse, plan,
  result output), estimated per workload from the baseline's TIMING FALSE runs as
  ``median(wall − Execution Time)``.  EXPLAIN ANALYZE's root-node inclusive time
  approximates that truth; its excess over it is the observer effect (plus, for the
  clock variants, the clock's own error).
- **clock check**: ``wall − Execution Time`` under TIMING TRUE, against the baseline's:
  a clock that reports wrong durations (a 4 ms tick, a badly calibrated TSC) moves it.

Comparisons against vanilla mix two things: the variant's measurement error and
vanilla's own observer effect (vanilla's times include its ~30 ns clock reads, so a
cheaper clock *should* read lower).  The verdicts (:func:`verdicts`) therefore also
look at the total against the truth and at whether the variant's clock agrees with the
client's wall clock.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd

from profkit import tables
from profkit.analyze.correction import _descendants
from profkit.analyze.predict import MULTIEXEC_TYPES
from profkit.analyze.stats import plain_suspect, summarize
from profkit.parse.explain import flatten_plan
from profkit.errors import ProfkitError

INCLUSIVE = "inclusive_ms"
EXCLUSIVE = "exclusive_ms"
METRICS: tuple[str, ...] = (INCLUSIVE, EXCLUSIVE)
TIMING_MODE = "analyze_timing"
NOTIMING_MODE = "analyze_notiming"
PLAIN_MODE = "plain"

#: Default verdict thresholds: relative error allowed on nodes that take at least
#: ``MIN_NODE_MS`` in the baseline; shorter nodes are judged by absolute error
#: (``DEFAULT_TOL_PCT`` % of the larger of their time and ``MIN_NODE_MS``).
DEFAULT_TOL_PCT = 10.0
MIN_NODE_MS = 1.0

#: Fewer repetitions than this never make a node "outside" (an interquartile range of
#: 3 values says little on a machine whose runs scatter by 3x under load).
MIN_REPS_OUTSIDE = 5

#: EXPLAIN prints times in ms with 3 decimals (per loop).
EXPLAIN_ROUNDING_MS = 0.0005

#: Columns node_times() returns (before the collector adds run/arm columns).
NODE_COLUMNS: tuple[str, ...] = (
    "node_id", "parent_id", "node_type", "relationship", "depth", "rows", "loops",
    "startup_ms", "total_ms", INCLUSIVE, EXCLUSIVE, "timed",
)


class TimingAccuracyError(ProfkitError):
    """Input the timing-accuracy analysis cannot use (the message says what to pass)."""


# ---------------------------------------------------------------------------
# parsing one plan


def _load(explain: Any) -> dict[str, Any]:
    if isinstance(explain, (bytes, str)):
        try:
            explain = json.loads(explain)
        except ValueError as e:
            raise TimingAccuracyError(f"plan is not JSON ({e}); pass the output of "
                                      "EXPLAIN (ANALYZE, FORMAT JSON)") from None
    if isinstance(explain, (list, tuple)):
        if len(explain) == 1 and isinstance(explain[0], (list, tuple)):  # a psycopg row
            explain = explain[0]
        if len(explain) != 1:
            raise TimingAccuracyError(f"expected one plan, got {len(explain)}")
        explain = explain[0]
    if not isinstance(explain, Mapping) or "Plan" not in explain:
        raise TimingAccuracyError("expected EXPLAIN (FORMAT JSON) output: a list holding one "
                                  "object with a 'Plan' key")
    return dict(explain)


def _print_order(plan: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []) or []:
        out += _print_order(child)
    return out


def node_times(explain: Any) -> pd.DataFrame:
    """Per-node times of one ``EXPLAIN (ANALYZE, FORMAT JSON)`` result.

    Produced by ``EXPLAIN (ANALYZE TRUE, TIMING TRUE, FORMAT JSON) SELECT ...``
    (psycopg hands the JSON over parsed; a JSON string works too).  Input::

        [{"Plan": {"Node Type": "Aggregate", "Actual Total Time": 8.0, "Actual Loops": 1,
          "Actual Rows": 1, "Plans": [{"Node Type": "Seq Scan", "Actual Total Time": 4.0, ...

    Output (one row per node, numbered like ``plan_node_id`` by
    :func:`profkit.analyze.predict.flatten_plan`)::

        node_id parent_id node_type rows loops startup_ms total_ms inclusive_ms exclusive_ms
        0       <NA>      Aggregate 1.0  1.0   8.0        8.0      8.0          4.0

    With TIMING FALSE the time columns are NaN and ``timed`` is False.
    ``df.attrs`` holds ``execution_ms`` and ``planning_ms`` (EXPLAIN's own figures).
    """
    top = _load(explain)
    flat = flatten_plan([top])
    nodes = _print_order(top["Plan"])
    startup, total = [], []
    for o in flat["order"]:
        n = nodes[int(o)] if 0 <= int(o) < len(nodes) else {}
        s, t = n.get("Actual Startup Time"), n.get("Actual Total Time")
        startup.append(float(s) if s is not None else math.nan)
        total.append(float(t) if t is not None else math.nan)
    out = pd.DataFrame({
        "node_id": flat["node_id"].astype("int64"),
        "parent_id": flat["parent_id"].astype("Int64"),
        "node_type": flat["node_type"].astype("string"),
        "relationship": flat["relationship"].astype("string"),
        "depth": flat["depth"].astype("int64"),
        "rows": flat["rows"].astype("float64"),
        "loops": flat["loops"].astype("float64"),
        "startup_ms": startup,
        "total_ms": total,
    })
    out[INCLUSIVE] = out["total_ms"] * out["loops"]
    out[EXCLUSIVE] = _exclusive(out)
    out["timed"] = out["total_ms"].notna()
    out.attrs["execution_ms"] = _num(top.get("Execution Time"))
    out.attrs["planning_ms"] = _num(top.get("Planning Time"))
    return out


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _exclusive(df: pd.DataFrame) -> pd.Series:
    """Inclusive minus the children's inclusive time, within one plan."""
    child_sum = df.dropna(subset=["parent_id"]).groupby("parent_id")[INCLUSIVE].sum(min_count=1)
    kids = df["node_id"].map(child_sum)
    return df[INCLUSIVE] - kids.fillna(0.0).where(df[INCLUSIVE].notna())


# ---------------------------------------------------------------------------
# same answers


_KEYS = ["workload", "node_id"]


def compare_rows(nodes: pd.DataFrame, baseline: str,
                 references: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Every plan node whose type, rows or loops differ from the baseline's.

    *nodes*: the collected ``timing_nodes`` table (all arms, modes and repetitions).  The
    reference per workload is the baseline's first TIMING FALSE execution (else its
    first execution); every row of every arm, the baseline's own included, is checked
    against it, and a node missing on either side is a "plan shape" mismatch.
    *references*: arm -> the arm it is checked against instead of the baseline (an
    arm of another PostgreSQL version is checked against a vanilla of its own
    version: another planner may pick another plan for the same query).
    Returns columns workload, arm, mode, rep, node_id, field, expected, got (empty:
    all answers equal).
    """
    cols = ["workload", "arm", "mode", "rep", "node_id", "field", "expected", "got"]
    if nodes.empty:
        return pd.DataFrame(columns=cols)
    _require(nodes, ["workload", "arm", "mode", "rep", "node_id", "node_type", "rows", "loops"],
             "compare_rows")
    base = nodes[nodes["arm"] == baseline]
    if base.empty:
        raise TimingAccuracyError(f"no rows for the baseline {baseline!r}; arms present: "
                                  f"{sorted(nodes['arm'].unique())}")
    references = dict(references or {})
    out: list[dict[str, Any]] = []
    for wl, sub in nodes.groupby("workload", sort=True):
        refs: dict[str, pd.DataFrame] = {}
        for (arm, mode, rep), ex in sub.groupby(["arm", "mode", "rep"], sort=True):
            ref_arm = references.get(arm, baseline)
            if ref_arm not in refs:
                refs[ref_arm] = _reference_plan(sub[sub["arm"] == ref_arm])
            ref = refs[ref_arm]
            got = ex.set_index("node_id")[["node_type", "rows", "loops"]]
            if list(got.index) != list(ref.index):
                out.append({"workload": wl, "arm": arm, "mode": mode, "rep": rep,
                            "node_id": -1, "field": "plan shape",
                            "expected": f"{len(ref)} nodes", "got": f"{len(got)} nodes"})
                continue
            for nid in ref.index:
                for f in ("node_type", "rows", "loops"):
                    e, g = ref.at[nid, f], got.at[nid, f]
                    if not _same(e, g):
                        out.append({"workload": wl, "arm": arm, "mode": mode, "rep": rep,
                                    "node_id": int(nid), "field": f, "expected": e, "got": g})
    return pd.DataFrame(out, columns=cols)


def _reference_plan(bw: pd.DataFrame) -> pd.DataFrame:
    """node_id -> node_type, rows, loops of an arm's first TIMING FALSE execution (else
    its first execution); empty when the arm has no rows."""
    if bw.empty:
        return pd.DataFrame(columns=["node_type", "rows", "loops"])
    pref = bw[bw["mode"] == NOTIMING_MODE]
    ref_src = pref if not pref.empty else bw
    first = ref_src.sort_values(["rep", "order"] if "order" in ref_src else ["rep"])
    k = first.iloc[0]
    ref = first[(first["mode"] == k["mode"]) & (first["rep"] == k["rep"])]
    return ref.set_index("node_id")[["node_type", "rows", "loops"]]


def node_paths(nodes: pd.DataFrame) -> pd.Series:
    """Each node's place in its plan, comparable between plans of different shapes.

    The node types from the root down, each below its parent with its position among
    the parent's children: ``"0:Aggregate/0:Nested Loop/1:Materialize"``.  Two plans
    of one query whose lower parts differ (PostgreSQL 18 picks a Hash Join where 19
    picks a Merge Join under the same Materialize) share the paths of the nodes above
    the difference, and only those.  One path per (workload, arm, mode, rep) and node.
    """
    _require(nodes, ["node_id", "parent_id", "node_type"], "node_paths")
    keys = [k for k in ("workload", "arm", "mode", "rep") if k in nodes.columns]
    out = pd.Series(index=nodes.index, dtype="object")
    groups = nodes.groupby(keys, sort=False) if keys else [((), nodes)]
    for _, ex in groups:
        ex = ex.sort_values("node_id")
        path: dict[int, str] = {}
        seen: dict[int, int] = {}
        for idx, nid, parent, ntype in zip(ex.index, ex["node_id"], ex["parent_id"],
                                           ex["node_type"], strict=True):
            if pd.isna(parent):
                p, prefix = -1, ""
            else:
                p = int(parent)
                prefix = path.get(p, "?") + "/"
            pos = seen.get(p, 0)
            seen[p] = pos + 1
            path[int(nid)] = f"{prefix}{pos}:{ntype}"
            out.at[idx] = path[int(nid)]
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            fa, fb = float(a), float(b)
        except (TypeError, ValueError):
            return False
        return (math.isnan(fa) and math.isnan(fb)) or fa == fb
    return a == b


def _require(df: pd.DataFrame, cols: Sequence[str], who: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise TimingAccuracyError(f"{who} needs columns {missing}; have {list(df.columns)} "
                                  "(pass the timing_nodes table the collector writes)")


# ---------------------------------------------------------------------------
# per-node accuracy


def _q(vals: np.ndarray, q: float) -> float:
    return float(np.quantile(vals, q)) if len(vals) else math.nan


def node_accuracy(nodes: pd.DataFrame, baseline: str, *, mode: str = TIMING_MODE
                  ) -> pd.DataFrame:
    """Per workload, arm, node and metric (inclusive / exclusive): the arm vs the baseline.

    Medians over repetitions, with their spread (25th/75th percentiles), the ratio of
    the medians and the spread of the per-repetition ratios (repetition *r* of the arm
    against repetition *r* of the baseline: they ran close together in the interleaved
    order).  ``rel_err_pct`` = (ratio − 1) × 100; ``abs_diff_ms`` = arm − baseline
    median.  ``arm_spread_pct``/``base_spread_pct``: interquartile range / median, the
    run-to-run noise of each (for the baseline, the noise floor of any comparison).
    Ratios are NaN where the baseline's median is 0.

    Nodes are matched by their place in the plan (:func:`node_paths`), which is the
    node id when both plans have the same shape; a node whose place the baseline's
    plan does not have (an arm of another PostgreSQL version whose planner chose
    another plan below some node) is left out.
    """
    _require(nodes, ["workload", "arm", "mode", "rep", "node_id", "node_type", "rows",
                     "loops", "depth", *METRICS], "node_accuracy")
    cols = ["workload", "arm", "node_id", "node_type", "depth", "rows", "loops", "metric",
            "n", "arm_median_ms", "arm_q25_ms", "arm_q75_ms", "base_median_ms",
            "base_q25_ms", "base_q75_ms", "abs_diff_ms", "ratio", "rel_err_pct",
            "ratio_q25", "ratio_q75", "arm_spread_pct", "base_spread_pct", "arm_zero_share",
            "run_err_p90_ms", "base_run_err_p90_ms", "run_err_p90_pct", "base_run_err_p90_pct",
            "scatter_p90_ms", "base_scatter_p90_ms", "scatter_p90_pct"]
    df = nodes[(nodes["mode"] == mode)]
    if df.empty:
        return pd.DataFrame(columns=cols)
    df = df.assign(_path=node_paths(df))
    rows: list[dict[str, Any]] = []
    for wl, w in df.groupby("workload", sort=True):
        base = w[w["arm"] == baseline]
        if base.empty:
            raise TimingAccuracyError(f"workload {wl}: no {mode} rows for the baseline "
                                      f"{baseline!r}")
        for arm, a in w.groupby("arm", sort=False):
            if arm == baseline:
                continue
            for nid, an in a.groupby("node_id", sort=True):
                bn = base[base["_path"].isin(set(an["_path"]))]
                if bn.empty:
                    continue
                first = an.iloc[0]
                for metric in METRICS:
                    av = an.set_index("rep")[metric].astype(float).dropna()
                    bv = bn.set_index("rep")[metric].astype(float).dropna()
                    am, bm = _q(av.to_numpy(), 0.5), _q(bv.to_numpy(), 0.5)
                    common = av.index.intersection(bv.index)
                    pr = (av[common] / bv[common])[bv[common] > 0].to_numpy()
                    ratio = am / bm if bm > 0 else math.nan
                    rows.append({
                        "workload": wl, "arm": arm, "node_id": int(nid),
                        "node_type": first["node_type"], "depth": int(first["depth"]),
                        "rows": float(first["rows"]), "loops": float(first["loops"]),
                        "metric": metric, "n": len(av),
                        "arm_median_ms": am, "arm_q25_ms": _q(av.to_numpy(), 0.25),
                        "arm_q75_ms": _q(av.to_numpy(), 0.75),
                        "base_median_ms": bm, "base_q25_ms": _q(bv.to_numpy(), 0.25),
                        "base_q75_ms": _q(bv.to_numpy(), 0.75),
                        "abs_diff_ms": am - bm, "ratio": ratio,
                        "rel_err_pct": (ratio - 1.0) * 100.0 if not math.isnan(ratio) else math.nan,
                        "ratio_q25": _q(pr, 0.25), "ratio_q75": _q(pr, 0.75),
                        "arm_spread_pct": _spread(av.to_numpy()),
                        "base_spread_pct": _spread(bv.to_numpy()),
                        "arm_zero_share": float((av == 0).mean()) if len(av) else math.nan,
                        **_run_errors(av.to_numpy(), bv.to_numpy(), bm),
                    })
    return pd.DataFrame(rows, columns=cols)


def _run_errors(av: np.ndarray, bv: np.ndarray, bm: float) -> dict[str, float]:
    """What one EXPLAIN ANALYZE run gets wrong: 90th percentile over repetitions of
    |run − baseline median| (ms and % of it), for the arm and, as the noise floor, for
    the baseline's own runs; and the scatter of each around its own median.  Medians
    over repetitions hide an estimator's scatter (a 4 ms tick, a 1-in-100 sample), but
    a user reads one run."""
    def p90(v: np.ndarray) -> float:
        return _q(np.abs(v - bm), 0.9) if len(v) and not math.isnan(bm) else math.nan

    def scatter(v: np.ndarray) -> float:
        return _q(np.abs(v - np.median(v)), 0.9) if len(v) else math.nan

    a, b = p90(av), p90(bv)
    sa = scatter(av)
    am = float(np.median(av)) if len(av) else math.nan
    return {"run_err_p90_ms": a, "base_run_err_p90_ms": b,
            "run_err_p90_pct": a / bm * 100.0 if bm > 0 else math.nan,
            "base_run_err_p90_pct": b / bm * 100.0 if bm > 0 else math.nan,
            # the estimator's own scatter: runs around the arm's median
            "scatter_p90_ms": sa, "base_scatter_p90_ms": scatter(bv),
            "scatter_p90_pct": sa / abs(am) * 100.0 if am else math.nan}


def _spread(v: np.ndarray) -> float:
    if len(v) == 0:
        return math.nan
    m = float(np.median(v))
    if m == 0:
        return math.nan
    return (_q(v, 0.75) - _q(v, 0.25)) / abs(m) * 100.0


# ---------------------------------------------------------------------------
# cost and truth


def cost_table(timings: pd.DataFrame, baseline: str, *, metric: str = "cpu_ms",
               n_resamples: int = 2999, seed: int = 20250801,
               pair: Literal["auto", "never", "common"] = "auto") -> pd.DataFrame:
    """Per workload and arm: median times of the three modes and the overheads vs plain.

    *timings*: the ``timings`` table (``build`` = arm label).  *metric*: ``cpu_ms`` (the
    backend's on-CPU time, see the module doc), ``server_ms`` (the wall-time bracket)
    or ``client_ms``.  The overheads are :func:`profkit.analyze.stats.summarize`'s
    (median of per-repetition overheads, paired bootstrap 95 % CI; *pair* ``"common"``
    pairs on the repetitions both modes kept, for timings the slow-vCPU rule thinned).
    ``timing_saved_pp``: the baseline's TIMING TRUE overhead minus the arm's, in
    percentage points.
    """

    _require(timings, ["workload", "build", "mode", "rep", metric], "cost_table")
    out: list[dict[str, Any]] = []
    for wl, w in timings.groupby("workload", sort=True):
        if metric not in ("server_ms", "client_ms"):
            # summarize() knows the bench's two metrics; the estimator is the same for
            # any per-execution time, so hand the chosen one over under a known name
            w = w.assign(server_ms=w[metric])
        s = summarize(w, "server_ms" if metric not in ("server_ms", "client_ms") else metric,
                      n_resamples=n_resamples, seed=seed, pair=pair)  # type: ignore[arg-type]
        for arm, sa in s.groupby("build", sort=False):
            by = sa.set_index("mode")
            row: dict[str, Any] = {"workload": wl, "arm": arm, "metric": metric}
            for mode, short in ((PLAIN_MODE, "plain"), (NOTIMING_MODE, "notiming"),
                                (TIMING_MODE, "timing")):
                if mode in by.index:
                    row[f"{short}_ms"] = float(by.at[mode, "median_ms"])
                    row[f"{short}_n"] = int(by.at[mode, "n"])
                    if mode != PLAIN_MODE:
                        row[f"overhead_{short}_pct"] = float(by.at[mode, "overhead_pct"])
                        row[f"overhead_{short}_ci_low"] = float(by.at[mode, "ci_low_pct"])
                        row[f"overhead_{short}_ci_high"] = float(by.at[mode, "ci_high_pct"])
            out.append(row)
    df = pd.DataFrame(out)
    if df.empty:
        return df
    if "overhead_timing_pct" in df:
        base = df[df["arm"] == baseline].set_index("workload")["overhead_timing_pct"]
        df["timing_saved_pp"] = df["workload"].map(base) - df["overhead_timing_pct"]
    return df


def plain_suspects(cost: pd.DataFrame) -> list[str]:
    """:func:`profkit.analyze.stats.plain_suspect`'s sentence for each workload and arm of
    a :func:`cost_table` whose TIMING FALSE or TRUE ran faster than its plain query beyond
    noise (its whole interval below -5 %)."""
    out = []
    for r in cost.to_dict("records"):
        for mode, short in ((NOTIMING_MODE, "notiming"), (TIMING_MODE, "timing")):
            odd = plain_suspect(f"{r['workload']} / {r['arm']}", mode,
                                r.get(f"overhead_{short}_pct"),
                                r.get(f"overhead_{short}_ci_low"),
                                r.get(f"overhead_{short}_ci_high"))
            if odd:
                out.append(odd)
    return out


def cost_vs_plain_of(timings: pd.DataFrame, plain_of: Mapping[str, str], *,
                     metric: str = "cpu_ms", n_resamples: int = 2999,
                     seed: int = 20250801,
                     pair: Literal["auto", "never", "common"] = "auto") -> pd.DataFrame:
    """Per workload and arm: TIMING FALSE / TRUE against *another* arm's plain query.

    *plain_of*: arm -> the arm whose plain query is the yardstick (vanilla of the
    arm's PostgreSQL version).  A patch that slows the plain query hides part of its
    cost in :func:`cost_table`'s own-plain overhead; this one does not.  Same estimator
    as :func:`cost_table` (median of per-repetition overheads, repetition *r* of the
    arm against repetition *r* of the yardstick's plain, paired bootstrap 95 % CI; *pair*
    as there). Columns: workload, arm, plain_of, metric, plain_of_ms, and
    ``notiming_vs_plain_of_pct``/``timing_vs_plain_of_pct`` with ``_ci_low``/``_ci_high``.
    """

    _require(timings, ["workload", "build", "mode", "rep", metric], "cost_vs_plain_of")
    cols = ["workload", "arm", "plain_of", "metric", "plain_of_ms"]
    out: list[dict[str, Any]] = []
    for wl, w in timings.groupby("workload", sort=True):
        for arm, ref in plain_of.items():
            a = w[(w["build"] == arm) & (w["mode"] != PLAIN_MODE)]
            p = w[(w["build"] == ref) & (w["mode"] == PLAIN_MODE)]
            if a.empty or p.empty:
                continue
            f = pd.concat([a, p.assign(build=arm)], ignore_index=True)
            f = f.assign(server_ms=f[metric])
            s = summarize(f, "server_ms", n_resamples=n_resamples, seed=seed,
                          pair=pair).set_index("mode")  # type: ignore[arg-type]
            row: dict[str, Any] = {"workload": wl, "arm": arm, "plain_of": ref,
                                   "metric": metric,
                                   "plain_of_ms": float(s.at[PLAIN_MODE, "median_ms"])}
            for mode, short in ((NOTIMING_MODE, "notiming"), (TIMING_MODE, "timing")):
                if mode in s.index:
                    row[f"{short}_vs_plain_of_pct"] = float(s.at[mode, "overhead_pct"])
                    row[f"{short}_vs_plain_of_ci_low"] = float(s.at[mode, "ci_low_pct"])
                    row[f"{short}_vs_plain_of_ci_high"] = float(s.at[mode, "ci_high_pct"])
            out.append(row)
    return pd.DataFrame(out, columns=None if out else cols)


def truth_table(timings: pd.DataFrame, nodes: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per workload and arm: EXPLAIN's totals against the plain query's wall time.

    Wall times are the backend's clock_timestamp() bracket (``server_ms``).  Columns
    (medians over repetitions, ms): ``plain_ms``; ``non_exec_ms`` (the baseline's
    bracket − Execution Time under TIMING FALSE: parse, plan, output); ``truth_ms`` =
    plain_ms − non_exec_ms; ``root_ms`` (root node's inclusive time, TIMING TRUE);
    ``exec_ms`` (Execution Time, TIMING TRUE); ``timing_wall_ms``;
    ``root_vs_truth_pct`` = (root_ms / truth_ms − 1) × 100 — what EXPLAIN ANALYZE
    reports against what the query takes without it; ``clock_gap_ms``: median of
    (bracket − Execution Time) under TIMING TRUE minus the baseline's, and
    ``clock_err_pct`` = −clock_gap_ms / exec_ms × 100: how much the arm's own clock
    over- (+) or under- (−) states its EXPLAIN execution against the independent wall
    clock (0 for the baseline by construction); ``wait_ms``: median run-queue wait of
    the backend around the TIMING TRUE executions (from the client's schedstat reads,
    so it also holds the backend's wake-up latency outside the bracket: a diagnostic
    of how disturbed the runs were, not subtracted from anything).
    """
    _require(timings, ["workload", "build", "mode", "rep", "server_ms", "explain_ms"],
             "truth_table")
    _require(nodes, ["workload", "arm", "mode", "rep", "parent_id", INCLUSIVE], "truth_table")
    out: list[dict[str, Any]] = []
    for wl, w in timings.groupby("workload", sort=True):
        b_no = w[(w["build"] == baseline) & (w["mode"] == NOTIMING_MODE)]
        non_exec = float((b_no["server_ms"] - b_no["explain_ms"]).median()) \
            if not b_no.empty else math.nan
        b_t = w[(w["build"] == baseline) & (w["mode"] == TIMING_MODE)]
        base_gap = float((b_t["server_ms"] - b_t["explain_ms"]).median()) \
            if not b_t.empty else math.nan
        roots = nodes[(nodes["workload"] == wl) & (nodes["mode"] == TIMING_MODE)
                      & nodes["parent_id"].isna()]
        for arm, a in w.groupby("build", sort=False):
            plain = float(a.loc[a["mode"] == PLAIN_MODE, "server_ms"].median())
            t = a[a["mode"] == TIMING_MODE]
            root = float(roots.loc[roots["arm"] == arm, INCLUSIVE].median())
            truth = plain - non_exec if not math.isnan(non_exec) else plain
            exec_ms = float(t["explain_ms"].median())
            gap = float((t["server_ms"] - t["explain_ms"]).median()) - base_gap
            out.append({
                "workload": wl, "arm": arm, "plain_ms": plain, "non_exec_ms": non_exec,
                "truth_ms": truth, "root_ms": root, "exec_ms": exec_ms,
                "timing_wall_ms": float(t["server_ms"].median()),
                "root_vs_truth_pct": (root / truth - 1.0) * 100.0 if truth > 0 else math.nan,
                "clock_gap_ms": gap,
                "clock_err_pct": -gap / exec_ms * 100.0 if exec_ms > 0 else math.nan,
                "wait_ms": float(t["wait_ms"].median()) if "wait_ms" in t else math.nan,
            })
    return pd.DataFrame(out)


# ---------------------------------------------------------------------------
# coarse clock: the tick grid


def tick_grid(nodes: pd.DataFrame, tick_ms: float, *, column: str = INCLUSIVE
              ) -> pd.DataFrame:
    """Whether each timed node's time is a whole number of clock ticks.

    A clock that advances in ticks (CLOCK_MONOTONIC_COARSE: 4 ms here, its
    ``clock_getres``) makes a measured interval a multiple of the tick, and so a node's
    summed time, unless the kernel shifted the grid between its two readings (rare: in
    one of ~5 test runs here, Linux 6.18, one execution whose every time was off by the
    same 0.967 ms); ``on_grid`` counts what is on it.  EXPLAIN prints per-loop averages
    rounded to 1 µs, hence the tolerance ``0.5 µs × loops`` (+ 1 ns per tick for the
    kernel's tick jitter).  Adds ``ticks`` (nearest whole number), ``off_grid_ms`` and
    ``on_grid``.
    """
    if tick_ms <= 0:
        raise TimingAccuracyError(f"tick must be > 0 ms, got {tick_ms}")
    _require(nodes, [column, "loops"], "tick_grid")
    df = nodes[nodes[column].notna()].copy()
    ticks = (df[column] / tick_ms).round()
    df["ticks"] = ticks.astype("int64")
    df["off_grid_ms"] = (df[column] - ticks * tick_ms).abs()
    tol = EXPLAIN_ROUNDING_MS * df["loops"].clip(lower=1) + 1e-6 * ticks + 1e-9
    df["grid_tol_ms"] = tol
    df["on_grid"] = df["off_grid_ms"] <= tol
    return df


# ---------------------------------------------------------------------------
# verdicts


WITHIN, OUTSIDE, SCATTER, UNCLEAR = "within", "outside", "scatter", "unclear"


def node_status(acc: pd.DataFrame, *, tol_pct: float = DEFAULT_TOL_PCT,
                min_node_ms: float = MIN_NODE_MS) -> pd.DataFrame:
    """Classify each row of :func:`node_accuracy` against the tolerance, noise-aware.

    The allowed error is *tol_pct* % of the baseline's median for long nodes (≥
    *min_node_ms*) and *tol_pct* % of *min_node_ms* for shorter ones (``allowed_ms``).

    - ``within``: the median is within the allowed error, and so are single runs
      (90th percentile of |run − baseline median|) beyond the baseline's own run-to-run
      noise (the same percentile of its runs).
    - ``outside``: systematically off — the interquartile range of the per-repetition
      ratios (long nodes) or of the values (short nodes) lies wholly beyond the
      allowed error on one side.
    - ``scatter`` (long nodes): not systematically off, but single runs scatter around
      the arm's own median (90th percentile) by more than the allowed error plus twice
      the baseline's own scatter: a coarse or sampled estimate that needs many runs to
      average out.  (Short nodes are judged on their medians only: a 0.1 ms band is
      within the scheduling noise of single runs.)
    - ``unclear``: anything else (the baseline's own noise covers the band).

    ``outside`` and ``scatter`` need ≥ :data:`MIN_REPS_OUTSIDE` repetitions.  Adds
    ``long``, ``allowed_ms``, ``status`` and ``direction`` (+1 above the baseline, −1
    below).
    """
    df = acc.copy()
    if df.empty:
        for c in ("long", "allowed_ms", "status", "direction", "scattered", "impossible"):
            df[c] = pd.Series(dtype="object")
        return df
    df["long"] = df["base_median_ms"] >= min_node_ms
    df["allowed_ms"] = np.where(df["long"], tol_pct / 100.0 * df["base_median_ms"],
                                tol_pct / 100.0 * min_node_ms)
    status = []
    for r in df.itertuples():
        d = r.abs_diff_ms
        if math.isnan(d):
            status.append(UNCLEAR)
            continue
        run_ok = (math.isnan(r.run_err_p90_ms)
                  or r.run_err_p90_ms <= r.allowed_ms + _nz(r.base_run_err_p90_ms))
        enough = r.n >= MIN_REPS_OUTSIDE
        if abs(d) <= r.allowed_ms and run_ok:
            status.append(WITHIN)
            continue
        if r.long:
            lo, hi = (r.ratio_q25 - 1.0) * 100.0, (r.ratio_q75 - 1.0) * 100.0
            systematic = not (math.isnan(lo) or math.isnan(hi)) and (lo > tol_pct
                                                                      or hi < -tol_pct)
        else:
            systematic = (r.arm_q25_ms - r.base_q75_ms > r.allowed_ms
                          or r.base_q25_ms - r.arm_q75_ms > r.allowed_ms)
        if enough and systematic:
            status.append(OUTSIDE)
        elif (enough and r.long
              and _nz(r.scatter_p90_ms) > r.allowed_ms + 2 * _nz(r.base_scatter_p90_ms)):
            status.append(SCATTER)
        else:
            status.append(UNCLEAR)
    df["status"] = status
    df["direction"] = np.sign(df["abs_diff_ms"].fillna(0.0)).astype(int)
    # scatter beyond the band whatever the status (an "outside" node can scatter too)
    df["scattered"] = (df["n"] >= MIN_REPS_OUTSIDE) & df["long"] & (
        df["scatter_p90_ms"].fillna(0.0) > df["allowed_ms"]
        + 2 * df["base_scatter_p90_ms"].fillna(0.0))
    # a node's own time below zero is impossible (its children took longer than it):
    # beyond EXPLAIN's per-loop rounding it marks an estimate that does not add up
    neg_tol = np.maximum(0.05, EXPLAIN_ROUNDING_MS * 2 * df["loops"].clip(lower=1))
    df["impossible"] = (df["metric"] == EXCLUSIVE) & (df["arm_median_ms"] < -neg_tol)
    return df


def _nz(x: float) -> float:
    return 0.0 if x is None or math.isnan(x) else float(x)


def verdicts(accuracy: pd.DataFrame, truth: pd.DataFrame, cost: pd.DataFrame, baseline: str,
             *, tol_pct: float = DEFAULT_TOL_PCT, min_node_ms: float = MIN_NODE_MS,
             tick_ms: Mapping[str, float] | None = None,
             reference: tuple[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """One honest verdict per workload and arm, from :func:`node_status` of every node
    (inclusive time, and exclusive time of the nodes whose own work is long enough).

    A node whose own (exclusive) time is negative beyond rounding makes the arm
    ``wrong`` whatever else holds: its children took longer than it did.

    - ``agrees``: every node ``within``: "agrees within X % with the baseline" (medians;
      single runs within the tolerance beyond the baseline's own noise).  Agreement with
      the baseline, not accuracy: the baseline's own times hold its clock reads.
    - ``lower``: some nodes ``outside``, all of them below the baseline, no node
      ``scatter``, none reading 0 where the baseline has time, the EXPLAIN total closer
      to the plain query's time than the baseline's, and the arm's clock agreeing with
      the wall clock (|clock_err_pct| ≤ *tol_pct* / 2): what a cheaper but correct
      clock shows.  Only lower: whether each node is closer to its true time needs a
      yardstick without clock reads (the run's ``bias.csv``: the baseline and the
      reference minus their own reads), which this verdict does not consult.
    - ``wrong``: any other ``outside`` or ``scatter`` node: the text says by how much
      (the worst systematic error, and what single runs get wrong).
    - ``inconclusive (noise)``: only ``unclear`` nodes besides ``within``: the
      baseline's own run-to-run noise covers the band (more repetitions or a quieter
      machine decide).

    *tick_ms*: arm -> clock tick, for arms whose clock advances in ticks (the text then
    names it where nodes read 0).  *reference*: (name, :func:`node_accuracy` against
    that arm) — a second yardstick, e.g. tsc_clock, whose times carry less clock
    overhead than the baseline's; the text then says how far each arm is from it.
    """
    cols = ["workload", "arm", "verdict", "max_err_pct", "worst_node", "max_excl_err_pct",
            "run_err_p90_pct", "short_max_abs_ms", "short_nodes", "short_read_zero",
            "nodes_outside", "nodes_scatter", "nodes_unclear", "base_noise_pct",
            "root_vs_truth_pct", "base_root_vs_truth_pct", "overhead_timing_pct",
            "base_overhead_timing_pct", "clock_err_pct", "negative_own", "ref_median_err_pct",
            "ref_worst_err_pct", "text"]
    if accuracy.empty:
        return pd.DataFrame(columns=cols)
    tick_ms = dict(tick_ms or {})
    st = node_status(accuracy, tol_pct=tol_pct, min_node_ms=min_node_ms)
    tr = truth.set_index(["workload", "arm"]) if not truth.empty else pd.DataFrame()
    co = cost.set_index(["workload", "arm"]) if not cost.empty else pd.DataFrame()

    def get(df: pd.DataFrame, key: tuple[str, str], col: str) -> float:
        if df.empty or key not in df.index or col not in df.columns:
            return math.nan
        return float(df.at[key, col])

    def where(r: Any) -> str:
        m = "" if r["metric"] == INCLUSIVE else " (own time)"
        return (f"node {int(r['node_id'])} {r['node_type']}{m}: "
                f"{r['arm_median_ms']:.3f} vs {r['base_median_ms']:.3f} ms")

    out: list[dict[str, Any]] = []
    for (wl, arm), g in st.groupby(["workload", "arm"], sort=False):
        inc = g[g["metric"] == INCLUSIVE]
        # own (exclusive) time is judged only where it is long: else it is a difference
        # of two nearly equal numbers and the inclusive check covers the node
        exc = g[(g["metric"] == EXCLUSIVE) & g["long"]]
        judged = pd.concat([inc, exc])
        big, small = inc[inc["long"]], inc[~inc["long"]]
        by = {k: judged[judged["status"] == k] for k in (OUTSIDE, SCATTER, UNCLEAR)}
        max_err = float(big["rel_err_pct"].abs().max()) if not big.empty else math.nan
        max_ex = float(exc["rel_err_pct"].abs().max()) if not exc.empty else math.nan
        run_p90 = float(big["run_err_p90_pct"].max()) if not big.empty else math.nan
        small_max = float(small["abs_diff_ms"].abs().max()) if not small.empty else math.nan
        read_zero = int(((inc["arm_median_ms"] == 0) & (inc["base_median_ms"] > 0)).sum())
        noise = float(big["base_run_err_p90_pct"].median()) if not big.empty else math.nan
        key = (wl, arm)
        rvt = get(tr, key, "root_vs_truth_pct")
        brvt = get(tr, (wl, baseline), "root_vs_truth_pct")
        cerr = get(tr, key, "clock_err_pct")
        ov = get(co, key, "overhead_timing_pct")
        bov = get(co, (wl, baseline), "overhead_timing_pct")
        off, scatter, unclear = by[OUTSIDE], by[SCATTER], by[UNCLEAR]
        neg = g[g["impossible"]]
        if not neg.empty:
            verdict = "wrong"
        elif off.empty and scatter.empty and unclear.empty:
            verdict = "agrees"
        elif not off.empty or not scatter.empty:
            lower = (scatter.empty and not judged["scattered"].any()
                     and (off["direction"] < 0).all() and read_zero == 0
                     and not (judged["rel_err_pct"] > tol_pct).any()
                     and not math.isnan(rvt) and not math.isnan(brvt) and abs(rvt) < abs(brvt)
                     and not math.isnan(cerr) and abs(cerr) <= tol_pct / 2)
            verdict = "lower" if lower else "wrong"
        else:
            verdict = "inconclusive (noise)"

        parts: list[str] = []
        if verdict == "agrees":
            parts.append(f"agrees within {_fmt_pct(max_err)} with {baseline} on nodes ≥ "
                         f"{min_node_ms:g} ms"
                         + (f" (own time within {_fmt_pct(max_ex)})" if not exc.empty else "")
                         + (f", within {small_max:.3f} ms on {len(small)} shorter node(s)"
                            if not small.empty else "")
                         + (f"; single runs within {run_p90:.0f}% (p90)"
                            if not math.isnan(run_p90) else ""))
        else:
            for label, sel in (("off", off), ("scattered", scatter), ("unclear", unclear)):
                if sel.empty:
                    continue
                lng, sht = sel[sel["long"]], sel[~sel["long"]]
                if not lng.empty:
                    if label == "scattered":
                        w = lng.loc[lng["run_err_p90_pct"].idxmax()]
                        parts.append(
                            f"single runs scattered on {len(lng)} long node time(s): 1 run in "
                            f"10 off by more than {w['run_err_p90_pct']:.0f}% "
                            f"({baseline}'s own runs: {w['base_run_err_p90_pct']:.0f}%), "
                            f"median {w['rel_err_pct']:+.0f}% ({where(w)})")
                    else:
                        w = lng.loc[lng["rel_err_pct"].abs().idxmax()]
                        how = ("in most repetitions" if label == "off"
                               else f"within {baseline}'s noise")
                        parts.append(f"{len(lng)} long node time(s) {label} (beyond "
                                     f"±{tol_pct:g}% {how}): worst {w['rel_err_pct']:+.0f}% "
                                     f"({where(w)})")
                if not sht.empty:
                    w = sht.loc[sht["run_err_p90_ms"].idxmax() if label == "scattered"
                                else sht["abs_diff_ms"].abs().idxmax()]
                    amount = (f"single runs by up to {w['run_err_p90_ms']:.3f} ms (p90)"
                              if label == "scattered"
                              else f"by {abs(w['abs_diff_ms']):.3f} ms")
                    parts.append(f"{len(sht)} short node(s) {label}, {amount} ({where(w)})")
            if read_zero:
                parts.append(f"{read_zero} node(s) read 0 ms where {baseline} has time"
                             + (f" (clock tick {tick_ms[arm]:g} ms)" if arm in tick_ms else ""))
            if not neg.empty:
                w = neg.loc[neg["arm_median_ms"].idxmin()]
                parts.append(f"{len(neg)} node(s) with a negative own time — children "
                             f"longer than their parent, impossible (node {int(w['node_id'])} "
                             f"{w['node_type']}: {w['arm_median_ms']:.3f} ms)")
            sc = judged[judged["scattered"] & judged["long"]]
            if not sc.empty and scatter.empty:
                # the spread in % of the arm's median; in ms where there is no % (a
                # median of 0 or none: a fresh-clone make test crashed here on idxmax)
                pct = sc["scatter_p90_pct"]
                w = sc.loc[pct.idxmax() if pct.notna().any()
                           else sc["scatter_p90_ms"].fillna(0.0).idxmax()]
                size = (f"{w['scatter_p90_pct']:.0f}%" if math.isfinite(w["scatter_p90_pct"])
                        else f"{w['scatter_p90_ms']:.3f} ms")
                parts.append(f"single runs scatter by ±{size} (p90) "
                             f"around their median on {len(sc)} long node time(s) ("
                             f"node {int(w['node_id'])} {w['node_type']})")
        if not math.isnan(noise):
            parts.append(f"{baseline}'s own single-run noise on long nodes: {noise:.0f}% (p90)")
        if not math.isnan(rvt):
            parts.append(f"EXPLAIN's total {rvt:+.0f}% vs the plain query ({baseline}: "
                         f"{brvt:+.0f}%)")
        if not math.isnan(ov):
            parts.append(f"TIMING TRUE costs {ov:+.0f}% ({baseline}: {bov:+.0f}%)")
        if not math.isnan(cerr) and abs(cerr) > tol_pct / 2:
            parts.append(f"its Execution Time is {cerr:+.0f}% off the wall clock (relative to "
                         f"{baseline})")
        ref_med = ref_worst = math.nan
        if reference is not None and arm != reference[0]:
            ra = reference[1]
            rb = ra[(ra["workload"] == wl) & (ra["arm"] == arm) & (ra["metric"] == INCLUSIVE)
                    & (ra["base_median_ms"] >= min_node_ms)]
            if not rb.empty:
                ref_med = float(rb["rel_err_pct"].median())
                w = rb.loc[rb["rel_err_pct"].abs().idxmax()]
                ref_worst = float(w["rel_err_pct"])
                parts.append(f"against {reference[0]} (the second yardstick): median "
                             f"{ref_med:+.0f}%, worst {ref_worst:+.0f}% ("
                             f"node {int(w['node_id'])} {w['node_type']}: "
                             f"{w['arm_median_ms']:.3f} vs {w['base_median_ms']:.3f} ms)")
        worst = big.loc[big["rel_err_pct"].abs().idxmax()] if not big.empty else None
        out.append({
            "workload": wl, "arm": arm, "verdict": verdict, "max_err_pct": max_err,
            "worst_node": (f"{int(worst['node_id'])} {worst['node_type']}"
                           if worst is not None else ""),
            "max_excl_err_pct": max_ex, "run_err_p90_pct": run_p90,
            "short_max_abs_ms": small_max, "short_nodes": len(small),
            "short_read_zero": read_zero, "nodes_outside": len(off),
            "nodes_scatter": len(scatter), "nodes_unclear": len(unclear),
            "base_noise_pct": noise, "root_vs_truth_pct": rvt, "base_root_vs_truth_pct": brvt,
            "overhead_timing_pct": ov, "base_overhead_timing_pct": bov,
            "clock_err_pct": cerr, "negative_own": len(neg), "ref_median_err_pct": ref_med,
            "ref_worst_err_pct": ref_worst, "text": "; ".join(parts),
        })
    return pd.DataFrame(out, columns=cols)


def _fmt_pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1f}%"


def _ci(x: float, lo: float, hi: float) -> str:
    if math.isnan(x):
        return "–"
    if math.isnan(lo) or math.isnan(hi):
        return f"{x:+.1f}%"
    return f"{x:+.1f}% [{lo:+.1f}, {hi:+.1f}]"


def summary_table(verdict_df: pd.DataFrame, cost: pd.DataFrame, truth: pd.DataFrame,
                  accuracy: pd.DataFrame, *, cost_wall: pd.DataFrame | None = None,
                  min_node_ms: float = MIN_NODE_MS, reference: str | None = None
                  ) -> pd.DataFrame:
    """The headline table: per workload and arm, cost and error side by side.

    *cost*: :func:`cost_table` on CPU time; *cost_wall* (optional): on wall time.
    """
    rows = []
    co = cost.set_index(["workload", "arm"]) if not cost.empty else pd.DataFrame()
    cw = (cost_wall.set_index(["workload", "arm"])
          if cost_wall is not None and not cost_wall.empty else pd.DataFrame())
    tr = truth.set_index(["workload", "arm"]) if not truth.empty else pd.DataFrame()
    arms = list(dict.fromkeys([*cost.get("arm", pd.Series(dtype=str)).tolist()]))
    keys = [(w, a) for w in sorted(set(cost.get("workload", []))) for a in arms] \
        if not cost.empty else [(v["workload"], v["arm"]) for _, v in verdict_df.iterrows()]
    ver = verdict_df.set_index(["workload", "arm"]) if not verdict_df.empty else pd.DataFrame()
    for key in keys:
        inc = accuracy[(accuracy["workload"] == key[0]) & (accuracy["arm"] == key[1])
                       & (accuracy["metric"] == INCLUSIVE)]
        big = inc[inc["base_median_ms"] >= min_node_ms]
        c = co.loc[key] if not co.empty and key in co.index else None
        w = cw.loc[key] if not cw.empty and key in cw.index else None
        t = tr.loc[key] if not tr.empty and key in tr.index else None
        v = ver.loc[key] if not ver.empty and key in ver.index else None
        rows.append({
            "workload": key[0], "arm": key[1],
            "plain CPU ms": c["plain_ms"] if c is not None else math.nan,
            "TIMING TRUE vs plain (CPU)": _ci(c["overhead_timing_pct"],
                                              c["overhead_timing_ci_low"],
                                              c["overhead_timing_ci_high"])
            if c is not None else "–",
            "TIMING FALSE vs plain (CPU)": _ci(c["overhead_notiming_pct"],
                                               c["overhead_notiming_ci_low"],
                                               c["overhead_notiming_ci_high"])
            if c is not None else "–",
            "TIMING TRUE vs plain (wall)": f"{w['overhead_timing_pct']:+.1f}%"
            if w is not None else "–",
            "EXPLAIN total vs plain": f"{t['root_vs_truth_pct']:+.1f}%" if t is not None
            and not math.isnan(t["root_vs_truth_pct"]) else "–",
            f"node err vs base (≥{min_node_ms:g} ms) median / worst":
                (f"{big['rel_err_pct'].median():+.1f}% / "
                 f"{big.loc[big['rel_err_pct'].abs().idxmax(), 'rel_err_pct']:+.1f}%")
                if not big.empty else "–",
            **({f"node err vs {reference} median / worst":
                (f"{v['ref_median_err_pct']:+.1f}% / {v['ref_worst_err_pct']:+.1f}%"
                 if v is not None and not math.isnan(v["ref_median_err_pct"]) else "–")}
               if reference else {}),
            "short nodes max |Δ| ms": v["short_max_abs_ms"] if v is not None else math.nan,
            "verdict": v["verdict"] if v is not None else "(baseline)",
        })
    return pd.DataFrame(rows)


def validate_nodes(df: pd.DataFrame) -> pd.DataFrame:
    """The collected per-node table, checked against ``tables.SCHEMAS['timing_nodes']``."""
    return tables.validate(df, "timing_nodes")


# ---------------------------------------------------------------------------
# bias of an estimator: signed mean error per node against several yardsticks


#: The yardstick "vanilla minus its own clock reads" (see :func:`bias_table`).
CORRECTED = "corrected"


def instr_calls_per_node(nodes: pd.DataFrame) -> pd.Series:
    """InstrStartNode calls per node of one execution, from its rows and loops.

    PostgreSQL 18's count (:mod:`profkit.analyze.predict`): a node pulled through
    ExecProcNode is called once per row plus once per loop (the NULL that ends it); a
    MultiExec node (Hash, Bitmap Index Scan, BitmapAnd/Or) once per loop; every node
    that ran once more at ExecShutdownNode.  ``rows`` is the total over loops, as in
    :func:`node_times`.  A loop a parent stops early (Limit, a merge join side, a semi
    join's inner) makes this an upper bound by one call per such loop.
    """

    _require(nodes, ["node_type", "rows", "loops"], "instr_calls_per_node")
    rows = nodes["rows"].fillna(0.0).astype(float)
    loops = nodes["loops"].fillna(0.0).astype(float)
    multi = nodes["node_type"].isin(MULTIEXEC_TYPES)
    return (rows + loops).where(~multi, loops) + (loops > 0).astype(float)


def in_situ_read_ns(timings: pd.DataFrame, nodes: pd.DataFrame, arm: str, *,
                    metric: str = "cpu_ms") -> dict[str, float]:
    """Per workload: what one clock read added to *arm*'s execution, in ns.

    (median TIMING TRUE − median TIMING FALSE time) / clock reads of the plan's nodes
    (2 per InstrStartNode call, :func:`instr_calls_per_node`, from the arm's first TIMING
    TRUE plan).  The same estimate as :func:`profkit.analyze.correction.in_situ_ns_per_read`
    (the correction experiment found it corrects vanilla's totals to within 3% of the plain
    query, where the tight-loop cost over-corrects).
    """
    _require(timings, ["workload", "build", "mode", metric], "in_situ_read_ns")
    out: dict[str, float] = {}
    for wl, w in timings[timings["build"] == arm].groupby("workload", sort=True):
        t = w.loc[w["mode"] == TIMING_MODE, metric].median()
        f = w.loc[w["mode"] == NOTIMING_MODE, metric].median()
        n = nodes[(nodes["workload"] == wl) & (nodes["arm"] == arm)
                  & (nodes["mode"] == TIMING_MODE)]
        if n.empty or math.isnan(t) or math.isnan(f):
            continue
        first = n[n["rep"] == n["rep"].min()]
        reads = 2.0 * float(instr_calls_per_node(first).sum())
        if reads > 0:
            out[str(wl)] = max(0.0, (float(t) - float(f)) * 1e6 / reads)
    return out


def corrected_times(nodes: pd.DataFrame, ns_per_read: float) -> pd.DataFrame:
    """One execution's node times minus its own clock reads (the observer effect).

    A node's timer window holds one read of its own per call (the end of the start
    read and the beginning of the stop read) and both reads of every call of its
    descendants: ``inclusive − (calls + 2 × descendants' calls) × ns_per_read``,
    floored at 0; ``exclusive`` again as inclusive minus the children's.  Input: the
    rows of one plan (node_id, parent_id, node_type, rows, loops, inclusive_ms).
    """

    if ns_per_read < 0 or math.isnan(ns_per_read):
        raise TimingAccuracyError(f"ns_per_read must be >= 0, got {ns_per_read}")
    _require(nodes, ["node_id", "parent_id", INCLUSIVE], "corrected_times")
    df = nodes.copy()
    calls = dict(zip(df["node_id"].astype(int), instr_calls_per_node(df), strict=True))
    desc = _descendants(df)
    reads = [calls[n] + 2.0 * sum(calls[d] for d in desc[n]) for n in df["node_id"].astype(int)]
    df["reads_in_window"] = reads
    df[INCLUSIVE] = (df[INCLUSIVE] - df["reads_in_window"] * ns_per_read / 1e6).clip(lower=0.0)
    df[EXCLUSIVE] = _exclusive(df)
    return df


def bias_table(nodes: pd.DataFrame, arms: Sequence[str], yardsticks: Sequence[str], *,
               ns_per_read: Mapping[str, float] | None = None,
               corrected_from: str = "vanilla", mode: str = TIMING_MODE,
               more_corrected: Mapping[str, tuple[str, Mapping[str, float]]] | None = None
               ) -> pd.DataFrame:
    """Signed mean error of each arm's node times against each yardstick, in %.

    For every workload, node, metric (inclusive / exclusive), arm and yardstick:
    ``bias_pct = (mean over repetitions of the arm − mean of the yardstick) / mean of
    the yardstick × 100``.  The mean, not the median: an unbiased estimator is right on
    average, and a median hides a rare heavy sample.  ``se_pct``: the standard error of
    that difference (both means' standard errors, in % of the yardstick's mean): a bias
    within ±2 se is not told apart from 0 by this many repetitions.  ``sd_run_pct``:
    the arm's run-to-run standard deviation in % (what one EXPLAIN run scatters by).

    A yardstick is an arm label, or :data:`CORRECTED`: *corrected_from*'s times minus
    its own clock reads (:func:`corrected_times`) with ``ns_per_read[workload]`` (e.g.
    :func:`in_situ_read_ns`); the corrected yardstick is skipped for a workload without
    a cost.  *more_corrected*: further corrected yardsticks, name -> (arm, ns per read
    by workload), e.g. ``{"corrected:n1": ("n1", ...)}`` for a same-cluster twin of the
    estimator timing every call: no cluster-to-cluster difference in the comparison.
    """
    _require(nodes, ["workload", "arm", "mode", "rep", "node_id", "node_type", *METRICS],
             "bias_table")
    cols = ["workload", "node_id", "node_type", "metric", "arm", "yardstick", "n",
            "arm_mean_ms", "yard_mean_ms", "bias_ms", "bias_pct", "se_pct", "sd_run_pct"]
    df = nodes[nodes["mode"] == mode]
    out: list[dict[str, Any]] = []
    for wl, w in df.groupby("workload", sort=True):
        series: dict[str, pd.DataFrame] = {a: g for a, g in w.groupby("arm", sort=False)}
        todo = dict(more_corrected or {})
        if ns_per_read:
            todo[CORRECTED] = (corrected_from, ns_per_read)
        for name, (src, ns) in todo.items():
            if name in yardsticks and src in series and str(wl) in ns:
                series[name] = pd.concat(
                    [corrected_times(g, ns[str(wl)])
                     for _, g in series[src].groupby("rep", sort=True)], ignore_index=True)
        for y in yardsticks:
            if y not in series:
                continue
            ys = series[y]
            for arm in arms:
                if arm not in series or arm == y:
                    continue
                a = series[arm]
                for nid, an in a.groupby("node_id", sort=True):
                    yn = ys[ys["node_id"] == nid]
                    for metric in METRICS:
                        av = an[metric].astype(float).dropna().to_numpy()
                        yv = yn[metric].astype(float).dropna().to_numpy()
                        if not len(av) or not len(yv):
                            continue
                        am, ym = float(av.mean()), float(yv.mean())
                        se = math.sqrt((av.var(ddof=1) / len(av) if len(av) > 1 else 0.0)
                                       + (yv.var(ddof=1) / len(yv) if len(yv) > 1 else 0.0))
                        sd = float(av.std(ddof=1)) if len(av) > 1 else math.nan
                        pos = ym > 0
                        out.append({
                            "workload": wl, "node_id": int(nid),
                            "node_type": an["node_type"].iloc[0], "metric": metric,
                            "arm": arm, "yardstick": y, "n": len(av),
                            "arm_mean_ms": am, "yard_mean_ms": ym, "bias_ms": am - ym,
                            "bias_pct": (am / ym - 1.0) * 100.0 if pos else math.nan,
                            "se_pct": se / ym * 100.0 if pos else math.nan,
                            "sd_run_pct": sd / ym * 100.0 if pos else math.nan,
                        })
    return pd.DataFrame(out, columns=cols)


def bias_markdown(bias: pd.DataFrame, *, metric: str = INCLUSIVE,
                  pairs: Sequence[tuple[str, str]] | None = None) -> str:
    """The bias table as markdown: a row per workload and node, a column per
    (arm, yardstick) (all, or *pairs*): ``signed error % ± se`` of *metric*."""
    b = bias[bias["metric"] == metric]
    if b.empty:
        return "(no timed nodes)\n"
    if pairs is None:
        pairs = list(dict.fromkeys(zip(b["arm"], b["yardstick"], strict=True)))
    yards = list(dict.fromkeys(y for _, y in pairs))
    head = ["workload", "node", f"{' / '.join(yards)} ms"] + [f"{a} vs {y}" for a, y in pairs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (wl, nid), g in b.groupby(["workload", "node_id"], sort=True):
        g = g.set_index(["arm", "yardstick"])
        first = g.iloc[0]
        ym = g.reset_index().drop_duplicates("yardstick").set_index("yardstick")["yard_mean_ms"]
        cells = [str(wl), f"{nid} {first['node_type']}",
                 " / ".join(f"{ym[y]:.3g}" if y in ym.index else "–" for y in yards)]
        for p in pairs:
            if p in g.index and not math.isnan(g.at[p, "bias_pct"]):
                cells.append(f"{g.at[p, 'bias_pct']:+.1f}% ±{g.at[p, 'se_pct']:.1f}")
            else:
                cells.append("–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
