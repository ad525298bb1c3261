"""The observer effect of the observers, and how far subtracting the clock gets us.

Pure functions over tables (no processes, no database):

- :func:`slowdown_table` — from the ``observer_timings`` table (one row per
  execution of one query, unobserved or watched by ltrace, bcc, bpftrace, perf
  or callgrind; written by :mod:`profkit.experiments.observers`) to one row per method:
  median time, slowdown relative to the unobserved runs of the same mode,
  the probe's hit count and what one hit cost::

      slowdown_x = median(observed) / median(unobserved)
      ns_per_hit = (median(observed) − median(unobserved)) / hits

  plus the cost guard's estimate (:func:`profkit.collect.bpf.guard`) beside the
  measured extra time, so the guard's defaults can be checked (``guard_ratio``
  = measured ns/hit ÷ the guard's ns/hit, the measured one from the paired slowdown
  where there are pairs, as its interval in :func:`guard_verdict`; 1 means the guard is
  right).
- :func:`correction_summary` — observer-effect.txt's proposal checked on the seed
  workloads: EXPLAIN ANALYZE's total minus clock reads × cost per read (and
  minus the row-counting cost) against the plain query's time.  The cost per
  read comes from the clock micro-benchmark (:mod:`profkit.collect.clock`) or
  in situ, (TIMING ON − TIMING OFF) / reads.  An in-situ cost taken from the
  same runs it corrects reproduces plain by construction
  (T_on − (T_on − T_off) − (T_off − plain) = plain), so the in-situ columns are
  out of sample: costs from the odd repetitions applied to the even ones
  (``split``), and costs from the *other* workloads (``xval``: does one number
  per machine transfer between queries?).
- :func:`median_node_times` / :func:`node_correction` — the same per plan node.
"""
from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from profkit import tables
from profkit.analyze import correction, stats
from profkit.errors import ProfkitError

log = logging.getLogger("profkit.analyze.observers")

UNOBSERVED = "unobserved"
ANALYZE_MODES = ("analyze_notiming", "analyze_timing")
CORRECTION_MODES = ("plain", "analyze_notiming", "analyze_timing")

SLOWDOWN_COLUMNS: tuple[str, ...] = (
    "workload", "mode", "method", "variant", "reps", "median_ms", "unobserved_ms",
    "slowdown_x", "paired_slowdown_x", "server_median_ms", "server_unobserved_ms",
    "server_slowdown_x", "cpu_median_ms", "cpu_unobserved_ms", "cpu_slowdown_x",
    "runq_median_ms", "hits", "hits_kind", "extra_ms", "ns_per_hit", "extra_cpu_ms",
    "ns_per_hit_cpu", "guard_estimate_ms", "guard_ns_per_hit", "guard_basis", "guard_ratio",
    # the paired slowdown on the basis that sees the observer's cost (backend CPU for
    # in-process observers, wall time for ltrace) with its bootstrap interval, and what
    # it supports: see slowdown_verdict
    "basis", "basis_slowdown_x", "ci_low_x", "ci_high_x", "ci_method", "verdict",
)
#: The level of the slowdown intervals.
CONFIDENCE = 0.95
# Observers whose work runs in the observed backend's own context (uprobe handlers,
# perf's sampling interrupt): their cost shows in the backend's CPU time, which a
# loaded machine does not inflate.  ltrace works in its own process (ptrace stops,
# context switches): only the wall time shows its cost.
IN_PROCESS = frozenset({"bcc", "bpftrace", "perf"})
MIN_HITS_FOR_VERDICT = 1000


class ObserverError(ProfkitError):
    pass


def _median(s: pd.Series) -> float:
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.median()) if len(s) else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) and b > 0 else math.nan


def slowdown_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (workload, mode, method, variant): the slowdown the observer causes.

    *runs* is the ``observer_timings`` table.  Unobserved rows have method
    ``"unobserved"``; every observed row may name, in ``baseline_order``, the
    unobserved execution run just before it (``paired_slowdown_x`` is the
    median of those per-pair ratios: robust to slow drift of a loaded machine).
    ``hits`` is the median hit count (clock_gettime calls for ltrace and the
    clock probes, all uprobe hits for per-node probes, samples for perf);
    ``ns_per_hit`` is NaN where hits are unknown (callgrind) or zero.
    """
    df = tables.validate(runs, "observer_timings")
    # "" (unobserved) comes back from a CSV as NaN; groupby would drop those rows
    df["variant"] = df["variant"].fillna("")
    if df.empty:
        raise ObserverError("no observer timings to summarise: run profkit observers first")
    base_rows = df[df["method"] == UNOBSERVED]
    if base_rows.empty:
        raise ObserverError("the timings hold no unobserved executions: nothing to compare with")
    by_order = df.set_index("order")["client_ms"].astype(float)
    cpu_by_order = df.set_index("order")["cpu_ms"].astype(float)
    out = []
    for (wl, mode), part in df.groupby(["workload", "mode"], sort=False):
        base = part[part["method"] == UNOBSERVED]
        if base.empty:
            raise ObserverError(f"no unobserved executions of {wl} {mode}")
        b_client, b_server = _median(base["client_ms"]), _median(base["server_ms"])
        b_cpu = _median(base["cpu_ms"])
        for (method, variant), g in part.groupby(["method", "variant"], sort=False):
            med, smed, cmed = (_median(g["client_ms"]), _median(g["server_ms"]),
                               _median(g["cpu_ms"]))
            pairs = [float(c) / by_order[int(o)] for c, o in
                     zip(g["client_ms"], g["baseline_order"], strict=True)
                     if not pd.isna(o) and int(o) in by_order.index and by_order[int(o)] > 0]
            hits = _median(g["hits"]) if g["hits"].notna().any() else math.nan
            observed = method != UNOBSERVED
            extra = med - b_client if observed else 0.0
            extra_cpu = cmed - b_cpu if observed else 0.0
            counted = observed and bool(hits) and hits > 0
            est = _median(g["guard_estimate_ms"])
            est_hits = _median(g["guard_hits"])
            row: dict[str, Any] = {
                "workload": wl, "mode": mode, "method": method, "variant": variant,
                "reps": int(len(g)), "median_ms": med, "unobserved_ms": b_client,
                "slowdown_x": _ratio(med, b_client),
                "paired_slowdown_x": float(np.median(pairs)) if pairs else math.nan,
                "server_median_ms": smed, "server_unobserved_ms": b_server,
                "server_slowdown_x": _ratio(smed, b_server),
                "cpu_median_ms": cmed, "cpu_unobserved_ms": b_cpu,
                "cpu_slowdown_x": _ratio(cmed, b_cpu), "runq_median_ms": _median(g["runq_ms"]),
                "hits": hits, "hits_kind": str(g["hits_kind"].dropna().iloc[0])
                if g["hits_kind"].notna().any() else "",
                "extra_ms": extra,
                "ns_per_hit": extra * 1e6 / hits if counted else math.nan,
                "extra_cpu_ms": extra_cpu,
                "ns_per_hit_cpu": extra_cpu * 1e6 / hits if counted else math.nan,
                "guard_estimate_ms": est,
                "guard_ns_per_hit": est * 1e6 / est_hits if est_hits and est_hits > 0
                else math.nan,
            }
            basis = "cpu" if method in IN_PROCESS and math.isfinite(row["ns_per_hit_cpu"]) \
                else "wall"
            row["guard_basis"] = basis if math.isfinite(row["guard_ns_per_hit"]) else ""
            row.update(_paired_interval(
                g, method, cpu_by_order if method in IN_PROCESS else by_order))
            # the guard's ratio from the paired slowdown, as its interval (guard_verdict),
            # so the point lies inside it; from the medians when there are no pairs
            paired = _ns_per_hit(SimpleNamespace(**row), basis, row["basis_slowdown_x"])
            measured = row["ns_per_hit_cpu"] if basis == "cpu" else row["ns_per_hit"]
            row["guard_ratio"] = _ratio(paired if math.isfinite(paired) else measured,
                                        row["guard_ns_per_hit"])
            out.append(row)
    res = pd.DataFrame(out, columns=list(SLOWDOWN_COLUMNS))
    order = {UNOBSERVED: 0, "perf": 1, "bcc": 2, "bpftrace": 3, "ltrace": 4, "callgrind": 5}
    res["_k"] = res["method"].map(lambda m: order.get(m, 9))
    res["_f"] = res["variant"].map(_variant_key)
    res = res.sort_values(["workload", "mode", "_k", "_f"], kind="stable")
    return res.drop(columns=["_k", "_f"]).reset_index(drop=True)


def _paired_interval(g: pd.DataFrame, method: str, by_order: pd.Series) -> dict[str, Any]:
    """The slowdown of the observed executions *g* against the unobserved execution each
    one follows (*by_order*: every execution's time on the basis, by its ``order``), as
    the median of the per-pair ratios with its bootstrap interval
    (:func:`profkit.analyze.stats.summarize`, the engine of the bench's overheads: the
    same resampling, the same "too few" below
    :data:`~profkit.analyze.stats.MIN_VERDICT_REPS` pairs). In-process observers (their
    work runs in the backend) on the backend's CPU time, which the load of other processes
    does not inflate; ltrace on wall time (its work is in its own process)."""
    none = {"basis": "", "basis_slowdown_x": math.nan, "ci_low_x": math.nan,
            "ci_high_x": math.nan, "ci_method": "none", "verdict": ""}
    if method == UNOBSERVED:
        return none
    basis = _basis_column(method)
    rows = []
    for i, (b, v) in enumerate(_pairs(g, basis, by_order)):
        for mode, ms in (("plain", b), ("observed", v)):
            rows.append({"run_id": "observers", "build": method, "workload": "w", "query": "q",
                         "mode": mode, "rep": i, "order": 2 * i + (mode == "observed"),
                         "client_ms": ms, "server_ms": ms})
    if not rows:
        return none
    r = stats.summarize(pd.DataFrame(rows), "client_ms", confidence=CONFIDENCE,
                        n_resamples=4000)
    r = r[r["mode"] == "observed"].iloc[0]
    method_ci = str(r["ci_method"])
    if method_ci == "none":  # one pair: a ratio, no interval
        method_ci = stats.too_few_reps("no interval", len(rows) // 2)
    x = lambda pct: 1.0 + float(pct) / 100.0  # noqa: E731
    return {"basis": "cpu" if basis == "cpu_ms" else "wall",
            "basis_slowdown_x": x(r["overhead_pct"]),
            "ci_low_x": x(r["ci_low_pct"]), "ci_high_x": x(r["ci_high_pct"]),
            "ci_method": method_ci,
            "verdict": slowdown_verdict(x(r["ci_low_pct"]), x(r["ci_high_pct"]), method_ci)}


def _basis_column(method: str) -> str:
    """The time that sees *method*'s cost: the backend's CPU for in-process observers,
    the client's wall time for ltrace (its work is in its own process)."""
    return "cpu_ms" if method in IN_PROCESS else "client_ms"


def _pairs(g: pd.DataFrame, basis: str, by_order: pd.Series) -> list[tuple[float, float]]:
    """(unobserved, observed) times on *basis* of the observed executions *g* that name,
    in ``baseline_order``, the unobserved execution run just before them (*by_order*: every
    execution's time on the basis, by its ``order``)."""
    out = []
    for v, o in zip(g[basis].astype(float), g["baseline_order"], strict=True):
        if pd.isna(o) or int(o) not in by_order.index:
            continue
        b = float(by_order[int(o)])
        if math.isfinite(v) and math.isfinite(b) and b > 0:
            out.append((b, float(v)))
    return out


def slowdown_verdict(low_x: float, high_x: float, method: str) -> str:
    """What a slowdown interval [*low_x*, *high_x*] supports: "slower" (it excludes 1
    from above), "no slowdown measured" (it holds 1: the runs cannot tell the observer's
    cost from this machine's noise), "faster?" (it excludes 1 from below: an observer
    does not speed a query up, so something else moved between the pairs), or
    "too few (n = N)" when fewer than :data:`~profkit.analyze.stats.MIN_VERDICT_REPS`
    pairs stand behind it."""
    return _against_one(low_x, high_x, method, "slower", "faster?", "no slowdown measured")


def _against_one(low: float, high: float, method: str, above: str, below: str,
                 holds: str) -> str:
    """*above* / *below* when the interval [*low*, *high*] excludes 1 from that side,
    *holds* when it holds 1; "too few (n = N)" for an interval from too few repetitions
    (:func:`profkit.analyze.stats.few_reps_text`), "" for none."""
    few = stats.few_reps_text(method)
    if few:
        return few
    if not (math.isfinite(low) and math.isfinite(high)):
        return ""
    if low > 1.0:
        return above
    if high < 1.0:
        return below
    return holds


def _variant_key(v: str) -> float:
    """perf's "99Hz" < "999Hz" < "4999Hz"; other variants keep their order."""
    v = str(v)
    if v.endswith("Hz") and v[:-2].isdigit():
        return float(v[:-2])
    return {"clock_gettime": 0.0, "per_node": 1.0}.get(v, 0.0)


def guard_verdict(table: pd.DataFrame, tolerance: float = 3.0,
                  min_hits: int = MIN_HITS_FOR_VERDICT) -> pd.DataFrame:
    """Per probe with a guard estimate: is the guard's cost per hit within *tolerance*×?

    Compares the measured ns/hit (backend CPU time for in-process probes, wall
    time for ltrace: ``guard_basis``) with what ``bpf.DEFAULT_COST_NS`` gives for
    that mix of probes: ``guard_ratio`` (measured ÷ guard, from the medians) and its
    95 % interval ``guard_ratio_low``/``_high`` (the paired slowdown's interval of
    :func:`slowdown_table` on the same basis, as ns per hit: (slowdown − 1) × the
    unobserved median / hits).  Verdicts, from the interval: "guard too low" (all of it
    above *tolerance*: the guard lets through probes that cost more than it thinks),
    "guard too high" (all of it below 1/*tolerance*: it refuses affordable probes), "ok"
    (all of it within), "unclear" (it crosses a bound); "too few (n = N)" below
    :data:`~profkit.analyze.stats.MIN_VERDICT_REPS` pairs; "too few hits" (< *min_hits*:
    one-off costs such as the first hit mapping uprobes' out-of-line page dominate).
    A run without pairs (no interval) is judged on ``guard_ratio`` alone and says so.
    """
    t = table[table["guard_ns_per_hit"].notna() & (table["method"] != UNOBSERVED)].copy()
    lows, highs, verdicts = [], [], []
    for r in t.itertuples(index=False):
        lo, hi = (ns / r.guard_ns_per_hit for ns in _ns_per_hit_interval(r, r.guard_basis))
        lows.append(lo)
        highs.append(hi)
        if not (r.hits and r.hits >= min_hits) or not math.isfinite(r.guard_ratio):
            verdicts.append("too few hits")
        else:
            verdicts.append(_ratio_verdict(r.guard_ratio, lo, hi, r.ci_method, tolerance,
                                           "guard"))
    t["guard_ratio_low"] = lows
    t["guard_ratio_high"] = highs
    t["verdict"] = verdicts
    return t[["workload", "mode", "method", "variant", "hits", "ns_per_hit", "ns_per_hit_cpu",
              "guard_ns_per_hit", "guard_basis", "guard_ratio", "guard_ratio_low",
              "guard_ratio_high", "verdict"]].reset_index(drop=True)


def _ns_per_hit(r: Any, basis: str, x: float) -> float:
    """A paired slowdown *x* of slowdown row *r* (read by attribute: a row tuple, a
    Series or a namespace) as ns per hit on *basis* ("cpu" or "wall"): (x − 1) × the unobserved
    median × 1e6 / hits; NaN when the row's paired slowdown is on the other basis or the
    row has no hits."""
    if r.basis != basis or not (r.hits and r.hits > 0 and math.isfinite(x)):
        return math.nan
    base = r.cpu_unobserved_ms if basis == "cpu" else r.unobserved_ms
    return (x - 1.0) * base * 1e6 / r.hits


def _ns_per_hit_interval(r: Any, basis: str) -> tuple[float, float]:
    """The paired slowdown's interval of slowdown row *r* in ns per hit (:func:`_ns_per_hit`)."""
    return _ns_per_hit(r, basis, r.ci_low_x), _ns_per_hit(r, basis, r.ci_high_x)


def _ratio_verdict(point: float, low: float, high: float, method: str, tolerance: float,
                   noun: str) -> str:
    """A measured ÷ assumed ratio judged by :func:`_guard_word`: from its interval
    [*low*, *high*]; "too few (n = N)" for an interval from too few pairs; from the point,
    marked "(no interval)", without one; "" without a point."""
    few = stats.few_reps_text(method)
    if few:
        return few
    if not math.isfinite(point):
        return ""
    if math.isfinite(low) and math.isfinite(high):
        return _guard_word(low, high, tolerance, noun)
    return _guard_word(point, point, tolerance, noun) + " (no interval)"


def _guard_word(low: float, high: float, tolerance: float, noun: str) -> str:
    if low > tolerance:
        return f"{noun} too low"
    if high < 1.0 / tolerance:
        return f"{noun} too high"
    if low >= 1.0 / tolerance and high <= tolerance:
        return "ok"
    return "unclear"


#: Columns of :func:`hit_costs`.
HIT_COST_COLUMNS: tuple[str, ...] = (
    "workload", "mode", "method", "kind", "hits", "ns_per_hit_cpu", "ns_per_hit_wall",
    "ns_per_hit_paired", "default_ns", "ratio", "ratio_low", "ratio_high", "ci_method",
    "verdict")
_HIT_COST_SEED = 20261207


def hit_costs(table: pd.DataFrame, defaults: Mapping[str, float],
              min_hits: int = MIN_HITS_FOR_VERDICT, *, runs: pd.DataFrame | None = None,
              tolerance: float = 3.0, confidence: float = CONFIDENCE,
              n_resamples: int = 4000) -> pd.DataFrame:
    """Cost per hit by probe kind, in the guard's own terms (``bpf.DEFAULT_COST_NS`` keys).

    - ``uprobe_libc``: the clock_gettime-only probe's ns/hit;
    - ``uprobe``: from the per-node probe of the same tool and mode, once the
      clock_gettime hits (priced as above) are taken out::

          (extra_per_node − clock_hits × ns_libc) / (hits_per_node − clock_hits)

    - ``ltrace``: ltrace's ns per counted call (wall time).

    ``ns_per_hit_cpu``/``_wall`` come from the medians (observed − unobserved);
    ``ns_per_hit_paired`` from the pairs (each observed execution against the unobserved
    one just before it; CPU time for uprobes, wall for ltrace): for ``uprobe_libc`` and
    ``ltrace`` the probe's paired slowdown of :func:`slowdown_table` in ns per hit (as
    :func:`guard_verdict` reads it), for the derived ``uprobe`` the per-node probe's
    median paired slowdown minus the clock probe's (that needs *runs*, the
    ``observer_timings`` table).  ``ratio`` is ``ns_per_hit_paired`` ÷ the default (the
    medians' ns/hit ÷ the default where there are no pairs), ``ratio_low``/``_high`` its
    95 % interval: the paired slowdown's interval, and for ``uprobe`` a bootstrap of that
    difference with each probe's pairs resampled on their own (they are different
    executions), so the clock probe's uncertainty is in it.  ``verdict`` from the
    interval, as the guard's check words it: "default too low" / "default too high" (all
    of it beyond *tolerance*× either way), "ok" (all within), "unclear" (it crosses a
    bound), "too few (n = N)" below :data:`~profkit.analyze.stats.MIN_VERDICT_REPS` pairs,
    the point's word and "(no interval)" without one.  Columns: :data:`HIT_COST_COLUMNS`.
    """
    cpu_by_order = (None if runs is None
                    else runs.set_index("order")["cpu_ms"].astype(float))
    rows = []
    t = table[table["method"] != UNOBSERVED]
    for (wl, mode, method), g in t.groupby(["workload", "mode", "method"], sort=False):
        by = g.set_index("variant")
        if method == "ltrace" and "clock_gettime" in by.index:
            r = by.loc["clock_gettime"]
            if r["hits"] >= min_hits:
                lo, hi = _ns_per_hit_interval(r, "wall")
                rows.append((wl, mode, method, "ltrace", r["hits"], r["ns_per_hit_cpu"],
                             r["ns_per_hit"], _ns_per_hit(r, "wall", r["basis_slowdown_x"]),
                             lo, hi, r["ci_method"]))
            continue
        if method not in ("bcc", "bpftrace") or "clock_gettime" not in by.index:
            continue
        c = by.loc["clock_gettime"]
        if not c["hits"] >= min_hits:
            continue
        lo, hi = _ns_per_hit_interval(c, "cpu")
        rows.append((wl, mode, method, "uprobe_libc", c["hits"], c["ns_per_hit_cpu"],
                     c["ns_per_hit"], _ns_per_hit(c, "cpu", c["basis_slowdown_x"]), lo, hi,
                     c["ci_method"]))
        if "per_node" in by.index:
            n = by.loc["per_node"]
            other = n["hits"] - c["hits"]
            if other >= min_hits:
                cpu = (n["extra_cpu_ms"] * 1e6 - c["hits"] * c["ns_per_hit_cpu"]) / other
                wall = (n["extra_ms"] * 1e6 - c["hits"] * c["ns_per_hit"]) / other
                point, lo, hi, how = math.nan, math.nan, math.nan, "none"
                if cpu_by_order is not None:
                    point, lo, hi, how = _derived_interval(
                        runs, cpu_by_order, (wl, mode, method), c["cpu_unobserved_ms"], other,
                        confidence=confidence, n_resamples=n_resamples)
                rows.append((wl, mode, method, "uprobe", other, cpu, wall, point, lo, hi, how))
    out = pd.DataFrame(rows, columns=["workload", "mode", "method", "kind", "hits",
                                      "ns_per_hit_cpu", "ns_per_hit_wall", "ns_per_hit_paired",
                                      "ns_low", "ns_high", "ci_method"])
    out["default_ns"] = out["kind"].map(lambda k: float(defaults.get(k, math.nan)))
    measured = out["ns_per_hit_wall"].where(out["kind"] == "ltrace", out["ns_per_hit_cpu"])
    out["ratio"] = out["ns_per_hit_paired"].fillna(measured) / out["default_ns"]
    out["ratio_low"] = out["ns_low"] / out["default_ns"]
    out["ratio_high"] = out["ns_high"] / out["default_ns"]
    out["verdict"] = [_ratio_verdict(r.ratio, r.ratio_low, r.ratio_high, r.ci_method,
                                     tolerance, "default")
                      for r in out.itertuples(index=False)]
    return out[list(HIT_COST_COLUMNS)]


def _derived_interval(runs: pd.DataFrame, cpu_by_order: pd.Series,
                      key: tuple[str, str, str], cpu_unobserved_ms: float, other_hits: float,
                      *, confidence: float, n_resamples: int
                      ) -> tuple[float, float, float, str]:
    """(estimate, low, high, method) in ns per hit of the derived ``uprobe`` kind: the
    per-node probe's median paired CPU slowdown minus the clock probe's, × the unobserved
    median, over the hits that are not clock_gettime's."""
    wl, mode, method = key
    part = runs[(runs["workload"] == wl) & (runs["mode"] == mode) & (runs["method"] == method)]
    variant = part["variant"].fillna("")
    samples = []
    for v in ("per_node", "clock_gettime"):
        pairs = _pairs(part[variant == v], "cpu_ms", cpu_by_order)
        samples.append(np.array([o / b for b, o in pairs], dtype="float64"))
    n = min(len(x) for x in samples)
    if n < 1 or not (math.isfinite(cpu_unobserved_ms) and other_hits > 0):
        return math.nan, math.nan, math.nan, "none"
    scale = cpu_unobserved_ms * 1e6 / other_hits

    def stat(pn: np.ndarray, ck: np.ndarray, axis: int = -1) -> np.ndarray:
        return (np.median(pn, axis=axis) - np.median(ck, axis=axis)) * scale

    point = float(stat(*(x[np.newaxis, :] for x in samples))[0])
    ci = stats.bootstrap(samples, stat, paired=False,
                         rng=stats.cell_rng(_HIT_COST_SEED, wl, mode, method, "uprobe"),
                         confidence=confidence, n_resamples=n_resamples)
    if ci.method == "none":  # one pair of either probe: an estimate, no interval
        return point, ci.low, ci.high, stats.too_few_reps("no interval", n)
    return point, ci.low, ci.high, stats.too_few_reps(ci.method, n)


# ---------------------------------------------------------------------------
# Correction vs plain


# cpu_ms: the backend's CPU time for the statement (/proc/PID/schedstat), an extra
# column of the timings table; on a loaded machine a long statement waits for a CPU
# more often than a short one, which inflates TIMING ON's wall time beyond its cost.
# cpu_kept_ms: cpu_ms with the executions a slow vCPU disturbed left out (the rule of
# profkit.analyze.stats.vcpu_adjust, from the calibrations just before and after each
# execution, as profkit bench has them): the default of measure_correction.
CORRECTION_METRICS: tuple[str, ...] = ("cpu_kept_ms", "cpu_ms", "server_ms", "client_ms")
CORRECTION_COLUMNS: tuple[str, ...] = (
    "workload", "metric", "scale", "reps", "left_out", "plain_ms", "notiming_ms", "timing_on_ms",
    "timing_on_x",
    "clock_reads", "instr_calls", "ns_per_read_micro", "ns_per_read_in_situ",
    "ns_per_read_in_situ_xval", "row_cost_ns", "row_cost_ns_xval",
    "corrected_clock_only_micro_ms", "corrected_micro_ms", "corrected_micro_ratio",
    "corrected_in_situ_split_ms", "plain_split_ms", "corrected_in_situ_split_ratio",
    "corrected_in_situ_xval_ms", "corrected_in_situ_xval_ratio",
    "corrected_micro_ci_low", "corrected_micro_ci_high", "ci_reps", "ci_method",
    "corrected_micro_vs_plain",
)
#: The level of ``corrected_micro_ratio``'s interval and the resamples behind it.
CORRECTION_CONFIDENCE = 0.95
CORRECTION_RESAMPLES = 4999
#: Below this many repetitions the interval is marked too few: in simulation it held the
#: truth in 88 % of runs at 4 repetitions, 92-96 % at 5, 95 % from 6 on (this VM's own
#: spread and a log-normal one: benchmarks/correction_interval_coverage.py,
#: benchmarks/results/correction_interval_coverage-20261206.txt).
CORRECTION_MIN_REPS = 6
_CORRECTION_SEED = 20261206


def _medians(t: pd.DataFrame, metric: str) -> dict[str, float]:
    return {m: _median(t.loc[t["mode"] == m, metric]) for m in CORRECTION_MODES}


def corrected_ratio_interval(timings: pd.DataFrame, metric: str, *, workload: str,
                             clock_reads: int, instr_calls: int, ns_per_read: float,
                             confidence: float = CORRECTION_CONFIDENCE,
                             n_resamples: int = CORRECTION_RESAMPLES
                             ) -> tuple[float, float, int, str]:
    """(low, high, repetitions, method) of ``corrected_micro_ratio``: a percentile bootstrap
    that resamples whole repetitions (plain, TIMING OFF and ON of one repetition together,
    as they ran) and recomputes in each resample what :func:`correction_summary` computes
    from the same executions: each mode's median over the executions it has, the row cost
    from the paired OFF - plain gaps of the repetitions that hold both, corrected / plain.
    A repetition that lost an execution (the vCPU rule) stays in with what it kept, as it
    does in the point, so the point is this statistic of the sample itself and not of a
    subset.  *repetitions*: the fewest any of the three parts rests on (ON's, plain's, the
    pairs'); no interval below two, below :data:`CORRECTION_MIN_REPS` marked too few."""
    wide = correction.per_repetition(timings, metric, CORRECTION_MODES)
    if not set(CORRECTION_MODES) <= set(wide.columns) or instr_calls <= 0:
        return math.nan, math.nan, 0, "none"
    wide = wide[list(CORRECTION_MODES)].dropna(how="all")
    plain, off, on = (wide[m].to_numpy(dtype="float64") for m in CORRECTION_MODES)
    gap = off - plain  # NaN where a repetition lacks either
    n = int(min(np.isfinite(plain).sum(), np.isfinite(gap).sum(), np.isfinite(on).sum()))
    if n < 2:
        return math.nan, math.nan, n, "none"
    rng = stats.cell_rng(_CORRECTION_SEED, workload)
    idx = rng.integers(0, len(wide), size=(n_resamples, len(wide)))
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        # a resample that drew no execution of a mode has no ratio (NaN, left out below)
        warnings.simplefilter("ignore", RuntimeWarning)
        row_cost = np.maximum(0.0, np.nanmedian(gap[idx], axis=1)) * 1e6 / instr_calls
        corrected = np.nanmedian(on[idx], axis=1) - (clock_reads * ns_per_read
                                                    + instr_calls * row_cost) / 1e6
        ratio = corrected / np.nanmedian(plain[idx], axis=1)
    alpha = (1.0 - confidence) / 2
    lo, hi = (float(x) for x in np.nanquantile(ratio, [alpha, 1 - alpha]))
    return lo, hi, n, stats.too_few_reps("percentile", n, CORRECTION_MIN_REPS)


def corrected_vs_plain(low: float, high: float, method: str) -> str:
    """Whether the corrected time differs from plain: "above plain" / "below plain" (the
    interval of corrected / plain excludes 1), "not distinguishable from plain", or "too
    few (n = N)" and "" (no interval)."""
    return _against_one(low, high, method, "above plain", "below plain",
                        "not distinguishable from plain")


def correction_summary(timings: pd.DataFrame, facts: pd.DataFrame, *,
                       metric: str = "cpu_ms") -> pd.DataFrame:
    """One row per workload: plain, TIMING ON, and TIMING ON corrected three ways.

    *timings*: the ``timings`` table (modes plain / analyze_notiming /
    analyze_timing, interleaved repetitions).  *facts*: one row per workload
    with ``workload``, ``scale``, ``clock_reads`` and ``instr_calls`` (per
    TIMING ON execution, from :func:`profkit.analyze.predict.predict`) and
    ``ns_per_read_micro`` (CLOCK_MONOTONIC from the clock micro-benchmark).

    - ``corrected_micro_ms`` = T_on − reads × micro − Instr calls × row cost,
      row cost = (T_off − plain) / Instr calls of the same workload (its
      ``_clock_only_`` sibling leaves row counting in);
    - ``corrected_in_situ_split_ms``: in-situ cost per read and row cost from
      the odd repetitions, applied to the even repetitions' T_on; compare with
      ``plain_split_ms`` (the even repetitions' plain median);
    - ``corrected_in_situ_xval_ms``: the median in-situ cost per read and row
      cost per call of the *other* workloads, applied to this one.
    Ratios are corrected / plain (1.0 = the correction recovers plain).
    ``corrected_micro_ci_low``/``_high``: the 95 % interval of ``corrected_micro_ratio``
    over ``ci_reps`` repetitions (:func:`corrected_ratio_interval`; ``ci_method`` says
    "too few" below :data:`CORRECTION_MIN_REPS`), and ``corrected_micro_vs_plain`` what it says
    (:func:`corrected_vs_plain`).
    ``left_out``: the workload's executions without the metric (with ``cpu_kept_ms``,
    those the slow-vCPU rule rejected: their pairs drop out of the paired gaps).
    """
    if metric not in CORRECTION_METRICS:
        raise ObserverError(f"metric must be one of {', '.join(CORRECTION_METRICS)}, "
                            f"not {metric!r}")
    t = tables.validate(timings, "timings")
    if metric == "cpu_kept_ms" and metric not in t.columns:
        if not stats.has_calibration(t):
            raise ObserverError("cpu_kept_ms needs the vCPU calibration columns "
                                f"({', '.join(stats.CALIB_COLUMNS)}); use cpu_ms for timings "
                                "measured without them")
        t = stats.vcpu_adjust(t)[0]
    if metric not in t.columns:
        raise ObserverError(f"the timings have no {metric!r} column")
    need = {"workload", "clock_reads", "instr_calls", "ns_per_read_micro"}
    if not need <= set(facts.columns):
        raise ObserverError(f"facts need columns {sorted(need)}; have {list(facts.columns)}")
    per: dict[str, dict[str, Any]] = {}
    for f in facts.itertuples(index=False):
        wl = str(f.workload)
        tw = t[t["workload"] == wl]
        med = _medians(tw, metric)
        missing = [m for m, v in med.items() if not math.isfinite(v)]
        if missing:
            raise ObserverError(f"{wl}: no {metric} for modes {missing}")
        reads, calls = int(f.clock_reads), int(f.instr_calls)
        # the costs from each repetition's own pairs (correction.paired_gap), not the medians
        in_situ = correction.in_situ_ns_per_read(
            correction.paired_gap(tw, metric, "analyze_timing", "analyze_notiming"), 0.0, reads)
        row_cost = correction.row_counting_cost_ns(
            correction.paired_gap(tw, metric, "analyze_notiming", "plain"), 0.0, calls)
        odd, even = tw[tw["rep"] % 2 == 1], tw[tw["rep"] % 2 == 0]
        mo, me = _medians(odd, metric), _medians(even, metric)
        if all(math.isfinite(v) for v in (*mo.values(), *me.values())):
            s_read = correction.in_situ_ns_per_read(
                correction.paired_gap(odd, metric, "analyze_timing", "analyze_notiming"), 0.0, reads)
            s_row = correction.row_counting_cost_ns(
                correction.paired_gap(odd, metric, "analyze_notiming", "plain"), 0.0, calls)
            split = correction.corrected_total_ms(me["analyze_timing"], reads, s_read, calls, s_row)
            plain_even = me["plain"]
        else:  # fewer than two repetitions
            split = plain_even = math.nan
        per[wl] = {
            "workload": wl, "metric": metric, "scale": float(getattr(f, "scale", math.nan)),
            "reps": int(tw.loc[tw["mode"] == "analyze_timing", "rep"].nunique()),
            # executions whose metric is missing (cpu_kept_ms: rejected for a slow vCPU)
            "left_out": int(pd.to_numeric(tw[metric], errors="coerce").isna().sum()),
            "plain_ms": med["plain"], "notiming_ms": med["analyze_notiming"],
            "timing_on_ms": med["analyze_timing"],
            "timing_on_x": _ratio(med["analyze_timing"], med["plain"]),
            "clock_reads": reads, "instr_calls": calls,
            "ns_per_read_micro": float(f.ns_per_read_micro),
            "ns_per_read_in_situ": in_situ, "row_cost_ns": row_cost,
            "corrected_clock_only_micro_ms": correction.corrected_total_ms(
                med["analyze_timing"], reads, float(f.ns_per_read_micro)),
            "corrected_micro_ms": correction.corrected_total_ms(
                med["analyze_timing"], reads, float(f.ns_per_read_micro), calls, row_cost),
            "corrected_in_situ_split_ms": split, "plain_split_ms": plain_even,
        }
        lo, hi, n_ci, method = corrected_ratio_interval(
            tw, metric, workload=wl, clock_reads=reads, instr_calls=calls,
            ns_per_read=float(f.ns_per_read_micro))
        per[wl].update(corrected_micro_ci_low=lo, corrected_micro_ci_high=hi, ci_reps=n_ci,
                       ci_method=method,
                       corrected_micro_vs_plain=corrected_vs_plain(lo, hi, method))
    for wl, r in per.items():
        others = [o for o in per if o != wl]
        if others:
            x_read = float(np.median([per[o]["ns_per_read_in_situ"] for o in others]))
            x_row = float(np.median([per[o]["row_cost_ns"] for o in others]))
            xval = correction.corrected_total_ms(r["timing_on_ms"], r["clock_reads"], x_read,
                                        r["instr_calls"], x_row)
        else:
            x_read = x_row = xval = math.nan
        r.update(ns_per_read_in_situ_xval=x_read, row_cost_ns_xval=x_row,
                 corrected_in_situ_xval_ms=xval)
        r["corrected_micro_ratio"] = _ratio(r["corrected_micro_ms"], r["plain_ms"])
        r["corrected_in_situ_split_ratio"] = _ratio(r["corrected_in_situ_split_ms"],
                                                    r["plain_split_ms"])
        r["corrected_in_situ_xval_ratio"] = _ratio(xval, r["plain_ms"])
    return pd.DataFrame(list(per.values()), columns=list(CORRECTION_COLUMNS))


def median_node_times(plans: Sequence[Any]) -> pd.DataFrame:
    """Per node, the median over executions of EXPLAIN's inclusive time (all loops).

    *plans*: several ``EXPLAIN (ANALYZE, TIMING TRUE, FORMAT JSON)`` results of
    one query (same plan shape).  Returns :func:`profkit.analyze.correction.node_times`'
    columns with total_ms the median and self_ms recomputed from it.
    """
    if not plans:
        raise ObserverError("no EXPLAIN (ANALYZE, TIMING TRUE, FORMAT JSON) plans given")
    frames = [correction.node_times(p) for p in plans]
    shape = [tuple(f["node_type"]) for f in frames]
    if len(set(shape)) != 1:
        raise ObserverError("the plans differ in shape between executions: the planner chose "
                            "another plan; node times cannot be pooled")
    first = frames[0].drop(columns=["total_ms", "self_ms"])
    totals = pd.concat([f.set_index("node_id")["total_ms"] for f in frames], axis=1)
    first["total_ms"] = first["node_id"].map(totals.median(axis=1))
    first["executions"] = len(frames)
    return correction._add_self(first, "total_ms", "self_ms")


def node_correction(nodes: pd.DataFrame, predicted: pd.DataFrame, *,
                    costs: Mapping[str, tuple[float, float]], top: int | None = None
                    ) -> pd.DataFrame:
    """Corrected inclusive and self time per node, for each named (ns/read, row ns) cost.

    *nodes*: :func:`median_node_times`; *predicted*: :func:`profkit.analyze.predict.predict`'s
    ``nodes`` for TIMING ON (clock_calls_predicted, instr_start_predicted).
    *costs*: e.g. ``{"micro": (25.1, 3.0), "in_situ": (41.0, 3.0)}`` → columns
    ``corrected_total_micro_ms``, ``corrected_self_micro_ms``, ... *top*: keep
    the nodes with the largest measured self time.
    """
    cols = ["node_id", "clock_calls_predicted", "instr_start_predicted"]
    missing = [c for c in cols if c not in predicted.columns]
    if missing:
        raise ObserverError(f"predicted nodes lack {missing}")
    df = nodes.merge(predicted[cols], on="node_id", how="left", validate="one_to_one")
    out = df[["node_id", "node_type", "parent_id", "rows", "loops", "total_ms", "self_ms",
              "clock_calls_predicted"]].copy()
    out = out.rename(columns={"clock_calls_predicted": "clock_reads"})
    for name, (ns_read, row_ns) in costs.items():
        if not (ns_read >= 0 and row_ns >= 0):
            # a cost the run measured below 0 (noise larger than the cost at this size)
            # corrects nothing: its columns stay empty, the other costs' are kept
            log.warning("%s correction left out: cost per read %.2f ns, per row %.2f ns "
                        "(negative: more repetitions or a larger scale)", name, ns_read, row_ns)
            for col in ("corrected_total", "corrected_self", "overhead_share"):
                out[f"{col}_{name}{'_ms' if col != 'overhead_share' else ''}"] = math.nan
            continue
        c = correction.corrected_node_times(df, ns_read, row_ns)
        out[f"corrected_total_{name}_ms"] = c["corrected_total_ms"].to_numpy()
        out[f"corrected_self_{name}_ms"] = c["corrected_self_ms"].to_numpy()
        out[f"overhead_share_{name}"] = c["overhead_share"].to_numpy()
    if top is not None:
        out = out.sort_values("self_ms", ascending=False, kind="stable").head(top)
    return out.reset_index(drop=True)
