"""The timing-accuracy report's text: its tables and ``report.md``.

The figures are :mod:`profkit.analyze.timing_accuracy`'s; the run is
:mod:`profkit.experiments.timing_accuracy`'s.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from profkit.analyze.timing_accuracy import (
    DEFAULT_TOL_PCT,
    MIN_NODE_MS,
    MIN_REPS_OUTSIDE,
    summary_table,
)
from profkit.render.markdown import frame


def _ta_cell(_col: str, v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return "–"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def ta_table(df: pd.DataFrame) -> str:
    """A timing-accuracy table (NaN as –, 3 significant digits below 10)."""
    return frame(df, cell=_ta_cell, empty="_(no rows)_\n")


def timing_accuracy_report(*, title: str, facts: Mapping[str, Any], verdict_df: pd.DataFrame,
                    cost: pd.DataFrame, truth: pd.DataFrame, accuracy: pd.DataFrame,
                    mismatches: pd.DataFrame, grid: Mapping[str, pd.DataFrame],
                    baseline: str, cost_wall: pd.DataFrame | None = None,
                    min_node_ms: float = MIN_NODE_MS, tol_pct: float = DEFAULT_TOL_PCT,
                    reference: str | None = None,
                    row_references: Mapping[str, str] | None = None) -> str:
    """The run's report.md: provenance facts, the headline table, verdicts, per-node tables.

    *row_references*: arm -> the arm whose rows it was checked against, where that is not
    *baseline* (arms of another PostgreSQL version)."""
    lines = [f"# {title}", ""]
    for k, v in facts.items():
        lines.append(f"- **{k}**: {v}")
    lines += ["", "## Cost and accuracy per workload and variant", "",
              "Overheads: the backend's CPU time per statement (/proc/PID/schedstat; "
              "independent of the clock under test and of run-queue waits), median of "
              "per-repetition (mode − plain) / plain with a paired bootstrap 95 % CI; the "
              "wall-time column brackets the statement with clock_timestamp() in the "
              "backend. *EXPLAIN total vs plain*: root node's inclusive time (TIMING TRUE) "
              "against the plain query's execution time (wall bracket − parse/plan/output). *node "
              f"err*: per-node inclusive time against {baseline}'s (ratio of medians − 1). "
              f"Verdict thresholds: {tol_pct:g} % on nodes ≥ {min_node_ms:g} ms, "
              f"{tol_pct / 100 * min_node_ms:g} ms below; a node is called *off* when the "
              f"interquartile range of its per-repetition ratios lies beyond the band, "
              f"*scattered* when 1 run in 10 misses by more than the band plus "
              f"{baseline}'s own run-to-run noise (≥ {MIN_REPS_OUTSIDE} repetitions).", "",
              ta_table(summary_table(verdict_df, cost, truth, accuracy, cost_wall=cost_wall,
                                      min_node_ms=min_node_ms, reference=reference)), "",
              "### EXPLAIN against the plain query (medians, ms)", "",
              ta_table(truth.round(3) if not truth.empty else truth), "",
              "## Verdicts", ""]
    for _, v in verdict_df.iterrows():
        lines.append(f"- **{v['workload']} / {v['arm']}: {v['verdict']}** — {v['text']}")
    lines += ["", "## Same answers (rows and loops per node)", ""]
    if mismatches.empty:
        others = {a: r for a, r in (row_references or {}).items() if r != baseline}
        by_ref: dict[str, list[str]] = {}
        for a, r in others.items():
            by_ref.setdefault(r, []).append(a)
        also = "".join(f"; {', '.join(sorted(arms))}: {r}'s (their PostgreSQL version)"
                       for r, arms in sorted(by_ref.items()))
        lines.append("Every node of every execution (TIMING TRUE and FALSE, every arm) "
                     f"reports exactly {baseline}'s node type, rows and loops{also}.")
    else:
        lines.append(f"**{len(mismatches)} mismatches** (first 20):")
        lines += ["", ta_table(mismatches.head(20))]
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
        lines += [ta_table(pd.DataFrame(tab)), ""]
    return "\n".join(lines) + "\n"
