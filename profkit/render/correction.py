"""The correction report's text: EXPLAIN ANALYZE corrected for the clock vs the plain query.

The figures are :mod:`profkit.analyze.correction`'s; the run is
:mod:`profkit.experiments.correction`'s.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd

from profkit.analyze.stats import few_reps_text
from profkit.render.markdown import frame, loadavg_text

#: The columns the correction report (and command) shows (:func:`correction_shown`
#: adds the two text columns, ``micro_ratio_95ci`` and ``micro_vs_plain``).
CORRECTION_SHOW = ["workload", "scale", "left_out", "plain_ms", "timing_on_ms", "corrected_micro_ms",
                   "corrected_micro_ratio", "micro_ratio_95ci", "micro_vs_plain",
                   "corrected_in_situ_split_ms", "plain_split_ms",
                   "corrected_in_situ_split_ratio", "corrected_in_situ_xval_ms",
                   "corrected_in_situ_xval_ratio"]
COSTS_SHOW = ["workload", "notiming_ms", "clock_reads", "instr_calls", "ns_per_read_micro",
              "ns_per_read_in_situ", "ns_per_read_in_situ_xval", "row_cost_ns",
              "corrected_clock_only_micro_ms"]
NODES_SHOW = ["workload", "node_id", "node_type", "rows", "loops", "clock_reads", "total_ms",
              "self_ms", "corrected_self_micro_ms", "corrected_self_in_situ_ms",
              "corrected_total_micro_ms", "corrected_total_in_situ_ms"]


def _interval_text(low: float, high: float, method: str) -> str:
    few = few_reps_text(method)
    if few:
        return few
    if not (math.isfinite(low) and math.isfinite(high)):
        return ""
    return f"[{low:.2f}, {high:.2f}]"


def correction_shown(summary: pd.DataFrame) -> pd.DataFrame:
    """:data:`CORRECTION_SHOW` of a correction summary: ``corrected_micro_ratio``'s 95 %
    interval as text ("too few (n = N)" from fewer than 6 repetitions: no bracket) and
    what it says against plain."""
    out = summary.copy()
    out["micro_ratio_95ci"] = [
        _interval_text(float(lo), float(hi), str(m)) for lo, hi, m in zip(
            out["corrected_micro_ci_low"], out["corrected_micro_ci_high"], out["ci_method"],
            strict=True)]
    out["micro_vs_plain"] = out["corrected_micro_vs_plain"].fillna("")
    return out[CORRECTION_SHOW]


def correction_markdown(summary: pd.DataFrame, nodes: pd.DataFrame, *, run_id: str,
                        metric: str, la0: Sequence[float], la1: Sequence[float],
                        uptime: str, others: Mapping[str, pd.DataFrame] | None = None,
                        vcpu_note: str = "") -> str:
    fmt = {"scale": "{:g}", "clock_reads": "{:,.0f}", "instr_calls": "{:,.0f}",
           "ns_per_read_micro": "{:.1f}", "ns_per_read_in_situ": "{:.1f}",
           "ns_per_read_in_situ_xval": "{:.1f}", "row_cost_ns": "{:.1f}",
           "rows": "{:,.0f}", "loops": "{:,.0f}"}
    return "\n".join([
        "# EXPLAIN ANALYZE corrected for the clock vs the plain query", "",
        f"run `{run_id}`; metric {metric} (cpu_ms: the backend's CPU time from "
        "/proc/PID/schedstat; cpu_kept_ms: the same, the executions a slow vCPU disturbed "
        "left out (column left_out); server_ms: EXPLAIN's Execution Time / pg_stat_statements; "
        f"client_ms: wall time at the client); load average before {loadavg_text(la0)}, after "
        f"{loadavg_text(la1)} (`uptime`: {uptime})", "",
        *([vcpu_note, ""] if vcpu_note else []),
        "corrected = TIMING ON − clock reads × ns/read − Instr calls × row cost; ratios are "
        "corrected / plain. micro: ns/read from the CLOCK_MONOTONIC micro-benchmark, row cost "
        "from (TIMING OFF − plain) of the same workload. in_situ_split: in-situ costs from "
        "the odd repetitions applied to the even ones (compare with plain_split_ms). "
        "in_situ_xval: the other workloads' median in-situ costs. micro_ratio_95ci: the 95 % "
        "interval of corrected_micro_ratio, resampling whole repetitions (none from fewer "
        "than 6: it under-covers there); micro_vs_plain: whether it excludes 1.", "",
        frame(correction_shown(summary), fmt), "", "## Costs", "",
        frame(summary[COSTS_SHOW], fmt), "",
        *[part for m, df in (others or {}).items()
          for part in (f"## The same with {m}", "", frame(correction_shown(df), fmt),
                       "")],
        "## Top nodes (by measured self time; EXPLAIN's own node times)", "",
        frame(nodes[NODES_SHOW], fmt), ""])
