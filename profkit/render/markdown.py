"""Markdown: ONE table helper (:func:`table`) and the experiments' markdown reports.

:func:`table` lays out every markdown table profkit writes; :func:`frame` formats a
DataFrame's cells for it (NaN as an empty cell or a dash, floats by column format).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from profkit.analyze import timing_accuracy as ta


def table(header: Sequence[Any], rows: Sequence[Sequence[Any]],
          align: Sequence[str] | None = None) -> str:
    """A GitHub markdown table (no trailing newline). *align*: "l"/"r" per column
    (``| :--- | ---: |``); None: ``|---|---|``. Pipes in cells are escaped."""
    def esc(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(esc(h) for h in header) + " |"
    if align is None:
        sep = "|" + "|".join("---" for _ in header) + "|"
    else:
        sep = "| " + " | ".join("---:" if a == "r" else ":---" for a in align) + " |"
    return "\n".join([head, sep, *("| " + " | ".join(esc(c) for c in r) + " |" for r in rows)])


def frame(df: pd.DataFrame, floatfmt: Mapping[str, str] | None = None,
          default_fmt: str = "{:.2f}", *, cell: Callable[[str, Any], str] | None = None,
          empty: str | None = None) -> str:
    """*df* as a markdown table with a trailing newline. Floats by *floatfmt* per column
    (else *default_fmt*), ints with thousands separators, NaN as an empty cell — or
    every cell through *cell*. *empty*: the text for a table without rows (default: the
    header alone)."""
    if empty is not None and df.empty:
        return empty
    fmts = dict(floatfmt or {})

    def default_cell(col: str, v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
            return ""
        if isinstance(v, (float, np.floating)):
            return fmts.get(col, default_fmt).format(float(v))
        if isinstance(v, (int, np.integer)):
            return f"{int(v):,}"
        return str(v)

    fn = cell or default_cell
    cols = [str(c) for c in df.columns]
    rows = [[fn(c, v) for c, v in zip(cols, rec, strict=True)]
            for rec in df.itertuples(index=False)]
    return table(cols, rows) + "\n"


#: The columns the observers / correction reports (and commands) show.
SLOWDOWN_SHOW = ["mode", "method", "variant", "reps", "median_ms", "slowdown_x",
                 "paired_slowdown_x", "server_slowdown_x", "cpu_slowdown_x", "hits",
                 "ns_per_hit", "ns_per_hit_cpu"]
CORRECTION_SHOW = ["workload", "scale", "plain_ms", "timing_on_ms", "corrected_micro_ms",
                   "corrected_micro_ratio", "corrected_in_situ_split_ms", "plain_split_ms",
                   "corrected_in_situ_split_ratio", "corrected_in_situ_xval_ms",
                   "corrected_in_situ_xval_ratio"]
COSTS_SHOW = ["workload", "notiming_ms", "clock_reads", "instr_calls", "ns_per_read_micro",
              "ns_per_read_in_situ", "ns_per_read_in_situ_xval", "row_cost_ns",
              "corrected_clock_only_micro_ms"]
NODES_SHOW = ["workload", "node_id", "node_type", "rows", "loops", "clock_reads", "total_ms",
              "self_ms", "corrected_self_micro_ms", "corrected_self_in_situ_ms",
              "corrected_total_micro_ms", "corrected_total_in_situ_ms"]


def loadavg_text(la: Sequence[float]) -> str:
    return " ".join(f"{x:.2f}" for x in la)


# --------------------------------------------------------------------------- timing accuracy

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
                    min_node_ms: float = ta.MIN_NODE_MS, tol_pct: float = ta.DEFAULT_TOL_PCT,
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
              f"{baseline}'s own run-to-run noise (≥ {ta.MIN_REPS_OUTSIDE} repetitions).", "",
              ta_table(ta.summary_table(verdict_df, cost, truth, accuracy, cost_wall=cost_wall,
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




# --------------------------------------------------------------------------- observers

def observers_markdown(slow: pd.DataFrame, guard: pd.DataFrame, costs: pd.DataFrame, *,
                       workload: str, scale: float,
                       run_id: str, la0: Sequence[float], la1: Sequence[float], uptime: str,
                       predicted: Mapping[str, Mapping[str, int]],
                       notes: Sequence[str] = ()) -> str:
    fmt = {"median_ms": "{:.1f}", "slowdown_x": "{:.2f}", "paired_slowdown_x": "{:.2f}",
           "server_slowdown_x": "{:.2f}", "hits": "{:,.0f}", "ns_per_hit": "{:,.0f}",
           "guard_ns_per_hit": "{:,.0f}", "guard_ratio": "{:.2f}", "cpu_slowdown_x": "{:.2f}",
           "ns_per_hit_cpu": "{:,.0f}"}
    lines = [f"# Observer effect of the observers: {workload} at scale {scale}", "",
             f"run `{run_id}`; load average before {loadavg_text(la0)}, after "
             f"{loadavg_text(la1)} (`uptime`: {uptime})", "",
             "slowdown_x = median observed / median unobserved client time; paired = median "
             "of per-pair ratios (each observed run follows an unobserved one); ns_per_hit = "
             "(observed − unobserved) / hits (perf: per sample), from the client's wall time; "
             "cpu_* from the backend's CPU time (/proc/PID/schedstat: robust to the load of "
             "other processes, but blind to ltrace's own work); guard_ns_per_hit = what "
             "profkit.collect.bpf's cost guard assumes for that probe mix.", "",
             frame(slow[SLOWDOWN_SHOW], fmt), "",
             "## Cost guard check", "", frame(guard, fmt), "",
             "Per probe kind (profkit.collect.bpf.DEFAULT_COST_NS keys; uprobe = a function of "
             "the postgres binary, derived from the per-node probe minus its clock hits):", "",
             frame(costs, {**fmt, "ns_per_hit_wall": "{:,.0f}",
                                      "default_ns": "{:,.0f}", "ratio": "{:.2f}"}), "",
             "## Predicted clock reads per execution", ""]
    for mode, t in predicted.items():
        lines.append(f"- {mode}: clock_reads {t.get('clock_reads', 0):,} (ltrace-visible "
                     f"{t.get('clock_reads_ltrace', 0):,}), ExecProcNodeInstr "
                     f"{t.get('exec_proc_node_instr', 0):,}")
    lines += ["", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"



# --------------------------------------------------------------------------- correction

def correction_markdown(summary: pd.DataFrame, nodes: pd.DataFrame, *, run_id: str,
                        metric: str, la0: Sequence[float], la1: Sequence[float],
                        uptime: str, others: Mapping[str, pd.DataFrame] | None = None) -> str:
    fmt = {"scale": "{:g}", "clock_reads": "{:,.0f}", "instr_calls": "{:,.0f}",
           "ns_per_read_micro": "{:.1f}", "ns_per_read_in_situ": "{:.1f}",
           "ns_per_read_in_situ_xval": "{:.1f}", "row_cost_ns": "{:.1f}",
           "rows": "{:,.0f}", "loops": "{:,.0f}"}
    return "\n".join([
        "# EXPLAIN ANALYZE corrected for the clock vs the plain query", "",
        f"run `{run_id}`; metric {metric} (cpu_ms: the backend's CPU time from "
        "/proc/PID/schedstat; server_ms: EXPLAIN's Execution Time / pg_stat_statements; "
        f"client_ms: wall time at the client); load average before {loadavg_text(la0)}, after "
        f"{loadavg_text(la1)} (`uptime`: {uptime})", "",
        "corrected = TIMING ON − clock reads × ns/read − Instr calls × row cost; ratios are "
        "corrected / plain. micro: ns/read from the CLOCK_MONOTONIC micro-benchmark, row cost "
        "from (TIMING OFF − plain) of the same workload. in_situ_split: in-situ costs from "
        "the odd repetitions applied to the even ones (compare with plain_split_ms). "
        "in_situ_xval: the other workloads' median in-situ costs.", "",
        frame(summary[CORRECTION_SHOW], fmt), "", "## Costs", "",
        frame(summary[COSTS_SHOW], fmt), "",
        *[part for m, df in (others or {}).items()
          for part in (f"## The same with {m}", "", frame(df[CORRECTION_SHOW], fmt),
                       "")],
        "## Top nodes (by measured self time; EXPLAIN's own node times)", "",
        frame(nodes[NODES_SHOW], fmt), ""])
