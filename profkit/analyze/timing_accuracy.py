"""How far the clock-source variants' per-node times are from vanilla's, and what they cost.

Issue 3 asks, for ``coarse_clock``, ``tsc_clock`` and ``sampled_timing``: how far are
their per-node times (EXPLAIN ANALYZE, TIMING TRUE) from vanilla's, and what do they
cost?  The collector (:mod:`profkit.timing_variants`) runs each workload's plain query,
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
- **cost**: the client's wall time around each execution (``client_ms``: Python's
  ``perf_counter``, i.e. the machine's CLOCK_MONOTONIC, which none of the patches
  touch).  The bench uses pg_stat_statements' ``server_ms``; here that would be
  measured with the very clock under test (coarse_clock's pg_stat_statements times
  are 4 ms-quantised), so the independent client clock is used; the overhead formula
  is the bench's (:func:`profkit.analyze.stats.summarize`, median of per-repetition
  overheads with a paired bootstrap CI).
- **truth**: the plain query's client time minus what is not execution (round trip,
  parse, plan, result transfer), estimated per workload from the baseline's TIMING
  FALSE runs as ``median(client_ms − Execution Time)``.  EXPLAIN ANALYZE's root-node
  inclusive time approximates that truth; its excess over it is the observer effect
  (plus, for the clock variants, the clock's own error).

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
from typing import Any

import numpy as np
import pandas as pd

from profkit import tables
from profkit.analyze.predict import flatten_plan
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


def compare_rows(nodes: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Every plan node whose type, rows or loops differ from the baseline's.

    *nodes*: the collected ``timing_nodes`` table (all arms, modes and repetitions).  The
    reference per workload is the baseline's first TIMING FALSE execution (else its
    first execution); every row of every arm, the baseline's own included, is checked
    against it, and a node missing on either side is a "plan shape" mismatch.
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
    out: list[dict[str, Any]] = []
    for wl, bw in base.groupby("workload", sort=True):
        pref = bw[bw["mode"] == NOTIMING_MODE]
        ref_src = pref if not pref.empty else bw
        first = ref_src.sort_values(["rep", "order"] if "order" in ref_src else ["rep"])
        k = first.iloc[0]
        ref = first[(first["mode"] == k["mode"]) & (first["rep"] == k["rep"])]
        ref = ref.set_index("node_id")[["node_type", "rows", "loops"]]
        sub = nodes[nodes["workload"] == wl]
        for (arm, mode, rep), ex in sub.groupby(["arm", "mode", "rep"], sort=True):
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
    """
    _require(nodes, ["workload", "arm", "mode", "rep", "node_id", "node_type", "rows",
                     "loops", "depth", *METRICS], "node_accuracy")
    cols = ["workload", "arm", "node_id", "node_type", "depth", "rows", "loops", "metric",
            "n", "arm_median_ms", "arm_q25_ms", "arm_q75_ms", "base_median_ms",
            "base_q25_ms", "base_q75_ms", "abs_diff_ms", "ratio", "rel_err_pct",
            "ratio_q25", "ratio_q75", "arm_spread_pct", "base_spread_pct", "arm_zero_share"]
    df = nodes[(nodes["mode"] == mode)]
    if df.empty:
        return pd.DataFrame(columns=cols)
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
                bn = base[base["node_id"] == nid]
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
                    })
    return pd.DataFrame(rows, columns=cols)


def _spread(v: np.ndarray) -> float:
    if len(v) == 0:
        return math.nan
    m = float(np.median(v))
    if m == 0:
        return math.nan
    return (_q(v, 0.75) - _q(v, 0.25)) / abs(m) * 100.0


# ---------------------------------------------------------------------------
# cost and truth


def cost_table(timings: pd.DataFrame, baseline: str, *, n_resamples: int = 2999,
               seed: int = 20250801) -> pd.DataFrame:
    """Per workload and arm: median times of the three modes and the overheads vs plain.

    *timings*: the ``timings`` table (``build`` = arm label) with ``client_ms``.  The
    overheads are :func:`profkit.analyze.stats.summarize`'s (median of per-repetition
    overheads, paired bootstrap 95 % CI).  ``timing_saved_pp``: the baseline's TIMING
    TRUE overhead minus the arm's, in percentage points.
    """
    from profkit.analyze.stats import summarize

    _require(timings, ["workload", "build", "mode", "rep", "client_ms"], "cost_table")
    out: list[dict[str, Any]] = []
    for wl, w in timings.groupby("workload", sort=True):
        s = summarize(w, "client_ms", n_resamples=n_resamples, seed=seed)
        for arm, sa in s.groupby("build", sort=False):
            by = sa.set_index("mode")
            row: dict[str, Any] = {"workload": wl, "arm": arm}
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


def truth_table(timings: pd.DataFrame, nodes: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per workload and arm: EXPLAIN's totals against the plain query's time.

    Columns: ``plain_ms`` (median client time of the plain query), ``non_exec_ms`` (the
    baseline's median of client time − EXPLAIN's Execution Time under TIMING FALSE:
    round trip, parse, plan, output), ``truth_ms`` = plain_ms − non_exec_ms,
    ``root_ms`` (median root-node inclusive time, TIMING TRUE), ``exec_ms`` (median
    Execution Time, TIMING TRUE), ``timing_client_ms`` (median client time of the same
    executions), ``root_vs_truth_pct`` = (root_ms / truth_ms − 1) × 100,
    ``exec_vs_client_pct``: median over executions of (Execution Time / client time −
    1) × 100 under TIMING TRUE — a clock that reports wrong durations (bad TSC
    calibration, a coarse tick) moves this away from the baseline's value
    (``clock_gap_pp``: the arm's minus the baseline's, in points).
    """
    _require(timings, ["workload", "build", "mode", "rep", "client_ms", "explain_ms"],
             "truth_table")
    _require(nodes, ["workload", "arm", "mode", "rep", "parent_id", INCLUSIVE], "truth_table")
    out: list[dict[str, Any]] = []
    for wl, w in timings.groupby("workload", sort=True):
        b_no = w[(w["build"] == baseline) & (w["mode"] == NOTIMING_MODE)]
        non_exec = float((b_no["client_ms"] - b_no["explain_ms"]).median()) \
            if not b_no.empty else math.nan
        roots = nodes[(nodes["workload"] == wl) & (nodes["mode"] == TIMING_MODE)
                      & nodes["parent_id"].isna()]
        for arm, a in w.groupby("build", sort=False):
            plain = float(a.loc[a["mode"] == PLAIN_MODE, "client_ms"].median())
            t = a[a["mode"] == TIMING_MODE]
            root = float(roots.loc[roots["arm"] == arm, INCLUSIVE].median())
            truth = plain - non_exec if not math.isnan(non_exec) else plain
            gap = ((t["explain_ms"] / t["client_ms"] - 1.0) * 100.0).median()
            out.append({
                "workload": wl, "arm": arm, "plain_ms": plain, "non_exec_ms": non_exec,
                "truth_ms": truth, "root_ms": root,
                "exec_ms": float(t["explain_ms"].median()),
                "timing_client_ms": float(t["client_ms"].median()),
                "root_vs_truth_pct": (root / truth - 1.0) * 100.0 if truth > 0 else math.nan,
                "exec_vs_client_pct": float(gap),
            })
    df = pd.DataFrame(out)
    if not df.empty:
        base = df[df["arm"] == baseline].set_index("workload")["exec_vs_client_pct"]
        df["clock_gap_pp"] = df["exec_vs_client_pct"] - df["workload"].map(base)
    return df


# ---------------------------------------------------------------------------
# coarse clock: the tick grid


def tick_grid(nodes: pd.DataFrame, tick_ms: float, *, column: str = INCLUSIVE
              ) -> pd.DataFrame:
    """Whether each timed node's time is a whole number of clock ticks.

    A clock that advances in ticks (CLOCK_MONOTONIC_COARSE: 4 ms here, its
    ``clock_getres``) makes every measured interval a multiple of the tick, and so
    every node's summed time.  EXPLAIN prints per-loop averages rounded to 1 µs,
    hence the tolerance ``0.5 µs × loops`` (+ 1 ns per tick for the kernel's tick
    jitter).  Adds ``ticks`` (nearest whole number), ``off_grid_ms`` and ``on_grid``.
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


def verdicts(accuracy: pd.DataFrame, truth: pd.DataFrame, cost: pd.DataFrame, baseline: str,
             *, tol_pct: float = DEFAULT_TOL_PCT, min_node_ms: float = MIN_NODE_MS,
             tick_ms: Mapping[str, float] | None = None) -> pd.DataFrame:
    """One honest verdict per workload and arm.

    - ``accurate``: every node taking ≥ *min_node_ms* in the baseline is within
      *tol_pct* % of the baseline (inclusive time; exclusive time too where the
      baseline's exclusive time is ≥ *min_node_ms*), and every shorter node within
      *tol_pct* % of max(its time, *min_node_ms*) in absolute terms.
    - ``lower (less overhead)``: outside that, but every deviation of a long node is
      downwards, the EXPLAIN total is closer to the plain query's time than the
      baseline's, and the arm's clock agrees with the client's wall clock as well as
      the baseline's does (|clock_gap_pp| ≤ *tol_pct* / 2): what a cheaper, correct
      clock should show, since the baseline's own times include its clock reads.
    - ``wrong``: anything else; ``text`` says by how much and where.

    *tick_ms*: arm -> clock tick, for arms whose clock advances in ticks (the text
    then says how many short nodes read 0).
    """
    cols = ["workload", "arm", "verdict", "max_err_pct", "worst_node", "max_excl_err_pct",
            "short_max_abs_ms", "short_nodes", "short_read_zero", "base_noise_pct",
            "root_vs_truth_pct", "base_root_vs_truth_pct", "overhead_timing_pct",
            "base_overhead_timing_pct", "clock_gap_pp", "text"]
    if accuracy.empty:
        return pd.DataFrame(columns=cols)
    tick_ms = dict(tick_ms or {})
    tr = truth.set_index(["workload", "arm"]) if not truth.empty else pd.DataFrame()
    co = cost.set_index(["workload", "arm"]) if not cost.empty else pd.DataFrame()

    def get(df: pd.DataFrame, key: tuple[str, str], col: str) -> float:
        if df.empty or key not in df.index or col not in df.columns:
            return math.nan
        return float(df.at[key, col])

    out: list[dict[str, Any]] = []
    for (wl, arm), g in accuracy.groupby(["workload", "arm"], sort=False):
        inc = g[g["metric"] == INCLUSIVE]
        exc = g[g["metric"] == EXCLUSIVE]
        big = inc[inc["base_median_ms"] >= min_node_ms]
        small = inc[inc["base_median_ms"] < min_node_ms]
        big_ex = exc[exc["base_median_ms"] >= min_node_ms]
        max_err = float(big["rel_err_pct"].abs().max()) if not big.empty else math.nan
        worst = big.loc[big["rel_err_pct"].abs().idxmax()] if not big.empty else None
        max_ex = float(big_ex["rel_err_pct"].abs().max()) if not big_ex.empty else math.nan
        worst_ex = big_ex.loc[big_ex["rel_err_pct"].abs().idxmax()] if not big_ex.empty \
            else None
        allowed = tol_pct / 100.0 * np.maximum(small["base_median_ms"], min_node_ms)
        small_bad = small[small["abs_diff_ms"].abs() > allowed]
        small_max = float(small["abs_diff_ms"].abs().max()) if not small.empty else math.nan
        worst_small = small.loc[small["abs_diff_ms"].abs().idxmax()] if not small.empty \
            else None
        read_zero = int(((small["arm_median_ms"] == 0) & (small["base_median_ms"] > 0)).sum())
        noise = float(big["base_spread_pct"].median()) if not big.empty else math.nan
        key = (wl, arm)
        rvt, brvt = get(tr, key, "root_vs_truth_pct"), get(tr, (wl, baseline),
                                                           "root_vs_truth_pct")
        gap = get(tr, key, "clock_gap_pp")
        ov, bov = get(co, key, "overhead_timing_pct"), get(co, (wl, baseline),
                                                           "overhead_timing_pct")
        ok_big = big.empty or max_err <= tol_pct
        ok_ex = big_ex.empty or max_ex <= tol_pct
        ok_small = small_bad.empty
        if ok_big and ok_ex and ok_small:
            verdict = "accurate"
        elif (not big.empty and (big["rel_err_pct"] <= tol_pct).all() and ok_small
              and (big_ex.empty or (big_ex["rel_err_pct"] <= tol_pct).all())
              and not math.isnan(rvt) and not math.isnan(brvt) and abs(rvt) < abs(brvt)
              and not math.isnan(gap) and abs(gap) <= tol_pct / 2):
            verdict = "lower (less overhead)"
        else:
            verdict = "wrong"
        parts: list[str] = []
        if verdict == "accurate":
            parts.append(f"accurate within {_fmt_pct(max_err)} of {baseline} on nodes ≥ "
                         f"{min_node_ms:g} ms" + (f" (exclusive within {_fmt_pct(max_ex)})"
                                                  if not big_ex.empty else ""))
        else:
            if worst is not None:
                parts.append(
                    f"{'lower' if verdict.startswith('lower') else 'off'} by up to "
                    f"{worst['rel_err_pct']:+.0f}% on nodes ≥ {min_node_ms:g} ms (worst: node "
                    f"{int(worst['node_id'])} {worst['node_type']}: "
                    f"{worst['arm_median_ms']:.2f} vs {worst['base_median_ms']:.2f} ms)")
            if worst_ex is not None and not ok_ex:
                parts.append(
                    f"exclusive time off by up to {worst_ex['rel_err_pct']:+.0f}% (node "
                    f"{int(worst_ex['node_id'])} {worst_ex['node_type']}: "
                    f"{worst_ex['arm_median_ms']:.2f} vs {worst_ex['base_median_ms']:.2f} ms)")
        if not small.empty:
            if ok_small:
                parts.append(f"{len(small)} short node(s) within {small_max:.3f} ms")
            else:
                assert worst_small is not None
                parts.append(
                    f"wrong by up to {small_max:.2f} ms on {len(small_bad)} of {len(small)} "
                    f"node(s) < {min_node_ms:g} ms (node {int(worst_small['node_id'])} "
                    f"{worst_small['node_type']}: {worst_small['arm_median_ms']:.3f} vs "
                    f"{worst_small['base_median_ms']:.3f} ms)"
                    + (f"; {read_zero} read 0 (tick {tick_ms[arm]:g} ms)"
                       if arm in tick_ms else ""))
        if not math.isnan(noise):
            parts.append(f"{baseline}'s own run-to-run spread (IQR) on those nodes: "
                         f"{noise:.0f}%")
        if not math.isnan(rvt):
            parts.append(f"EXPLAIN's total is {rvt:+.0f}% vs the plain query ({baseline}: "
                         f"{brvt:+.0f}%)")
        if not math.isnan(ov):
            parts.append(f"TIMING TRUE costs {ov:+.0f}% ({baseline}: {bov:+.0f}%)")
        if not math.isnan(gap) and abs(gap) > tol_pct / 2:
            parts.append(f"its Execution Time disagrees with the wall clock by {gap:+.0f} "
                         f"points more than {baseline}'s")
        out.append({
            "workload": wl, "arm": arm, "verdict": verdict, "max_err_pct": max_err,
            "worst_node": (f"{int(worst['node_id'])} {worst['node_type']}"
                           if worst is not None else ""),
            "max_excl_err_pct": max_ex, "short_max_abs_ms": small_max,
            "short_nodes": len(small), "short_read_zero": read_zero, "base_noise_pct": noise,
            "root_vs_truth_pct": rvt, "base_root_vs_truth_pct": brvt,
            "overhead_timing_pct": ov, "base_overhead_timing_pct": bov,
            "clock_gap_pp": gap, "text": "; ".join(parts),
        })
    return pd.DataFrame(out, columns=cols)


def _fmt_pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1f}%"


# ---------------------------------------------------------------------------
# markdown


def _md_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "_(no rows)_\n"
    head = "| " + " | ".join(str(c) for c in df.columns) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body]) + "\n"


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return "–"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v).replace("|", "\\|")


def _ci(x: float, lo: float, hi: float) -> str:
    if math.isnan(x):
        return "–"
    if math.isnan(lo) or math.isnan(hi):
        return f"{x:+.1f}%"
    return f"{x:+.1f}% [{lo:+.1f}, {hi:+.1f}]"


def summary_table(verdict_df: pd.DataFrame, cost: pd.DataFrame, truth: pd.DataFrame,
                  accuracy: pd.DataFrame, *, min_node_ms: float = MIN_NODE_MS
                  ) -> pd.DataFrame:
    """The headline table: per workload and arm, cost and error side by side."""
    rows = []
    co = cost.set_index(["workload", "arm"]) if not cost.empty else pd.DataFrame()
    tr = truth.set_index(["workload", "arm"]) if not truth.empty else pd.DataFrame()
    for _, v in verdict_df.iterrows():
        key = (v["workload"], v["arm"])
        inc = accuracy[(accuracy["workload"] == v["workload"]) & (accuracy["arm"] == v["arm"])
                       & (accuracy["metric"] == INCLUSIVE)]
        big = inc[inc["base_median_ms"] >= min_node_ms]
        c = co.loc[key] if not co.empty and key in co.index else None
        t = tr.loc[key] if not tr.empty and key in tr.index else None
        rows.append({
            "workload": v["workload"], "arm": v["arm"],
            "plain ms": c["plain_ms"] if c is not None else math.nan,
            "TIMING TRUE vs plain": _ci(c["overhead_timing_pct"], c["overhead_timing_ci_low"],
                                        c["overhead_timing_ci_high"]) if c is not None else "–",
            "TIMING FALSE vs plain": _ci(c["overhead_notiming_pct"],
                                         c["overhead_notiming_ci_low"],
                                         c["overhead_notiming_ci_high"])
            if c is not None else "–",
            "EXPLAIN total vs plain": f"{t['root_vs_truth_pct']:+.1f}%" if t is not None
            and not math.isnan(t["root_vs_truth_pct"]) else "–",
            f"node err vs base (≥{min_node_ms:g} ms) median / max":
                (f"{big['rel_err_pct'].median():+.1f}% / "
                 f"{big.loc[big['rel_err_pct'].abs().idxmax(), 'rel_err_pct']:+.1f}%")
                if not big.empty else "–",
            "short nodes max |Δ| ms": v["short_max_abs_ms"],
            "verdict": v["verdict"],
        })
    return pd.DataFrame(rows)


def markdown_report(*, title: str, facts: Mapping[str, Any], verdict_df: pd.DataFrame,
                    cost: pd.DataFrame, truth: pd.DataFrame, accuracy: pd.DataFrame,
                    mismatches: pd.DataFrame, grid: Mapping[str, pd.DataFrame],
                    baseline: str, min_node_ms: float = MIN_NODE_MS,
                    tol_pct: float = DEFAULT_TOL_PCT) -> str:
    """The run's report.md: provenance facts, the headline table, verdicts, per-node tables."""
    lines = [f"# {title}", ""]
    for k, v in facts.items():
        lines.append(f"- **{k}**: {v}")
    lines += ["", "## Cost and accuracy per workload and variant", "",
              f"Overheads: client wall time, median of per-repetition (mode − plain) / plain "
              f"with a paired bootstrap 95 % CI. *EXPLAIN total vs plain*: root node's "
              f"inclusive time (TIMING TRUE) against the plain query's execution time. "
              f"*node err*: per-node inclusive time against {baseline}'s (ratio of medians − "
              f"1). Verdict thresholds: {tol_pct:g} % on nodes ≥ {min_node_ms:g} ms, "
              f"{tol_pct / 100 * min_node_ms:g} ms below.", "",
              _md_table(summary_table(verdict_df, cost, truth, accuracy,
                                      min_node_ms=min_node_ms)), "",
              "## Verdicts", ""]
    for _, v in verdict_df.iterrows():
        lines.append(f"- **{v['workload']} / {v['arm']}: {v['verdict']}** — {v['text']}")
    lines += ["", "## Same answers (rows and loops per node)", ""]
    if mismatches.empty:
        lines.append("Every node of every execution (TIMING TRUE and FALSE, every arm) "
                     f"reports exactly {baseline}'s node type, rows and loops.")
    else:
        lines.append(f"**{len(mismatches)} mismatches** (first 20):")
        lines += ["", _md_table(mismatches.head(20))]
    if grid:
        lines += ["", "## Tick grid (clocks that advance in ticks)", ""]
        for arm, g in grid.items():
            on = int(g["on_grid"].sum()) if not g.empty else 0
            lines.append(f"- {arm}: {on} of {len(g)} node times (TIMING TRUE, all "
                         f"repetitions) are whole multiples of the tick; "
                         f"{int((g['ticks'] == 0).sum()) if not g.empty else 0} read 0.")
    lines += ["", "## Per-node times (TIMING TRUE), median over repetitions", ""]
    for wl, w in accuracy.groupby("workload", sort=True):
        lines += [f"### {wl}", ""]
        tab = []
        for (nid, metric), g in w.groupby(["node_id", "metric"], sort=True):
            first = g.iloc[0]
            row = {"node": f"{int(nid)} {'  ' * int(first['depth'])}{first['node_type']}",
                   "metric": metric.replace("_ms", ""), "rows": first["rows"],
                   "loops": first["loops"],
                   f"{baseline} ms [IQR]": f"{first['base_median_ms']:.3f} "
                   f"[{first['base_q25_ms']:.3f}–{first['base_q75_ms']:.3f}]"}
            for _, r in g.iterrows():
                rel = "" if math.isnan(r["rel_err_pct"]) else f" ({r['rel_err_pct']:+.0f}%)"
                row[r["arm"]] = (f"{r['arm_median_ms']:.3f} [{r['arm_q25_ms']:.3f}–"
                                 f"{r['arm_q75_ms']:.3f}]{rel}")
            tab.append(row)
        lines += [_md_table(pd.DataFrame(tab)), ""]
    return "\n".join(lines) + "\n"


def validate_nodes(df: pd.DataFrame) -> pd.DataFrame:
    """The collected per-node table, checked against ``tables.SCHEMAS['timing_nodes']``."""
    return tables.validate(df, "timing_nodes")
