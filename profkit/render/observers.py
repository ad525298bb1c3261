"""The observers report's text: how much each profiler slows the query down.

The figures are :mod:`profkit.analyze.observers`'; the run is
:mod:`profkit.experiments.observers`'.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from profkit.analyze.stats import too_few_count
from profkit.render.markdown import frame, loadavg_text

#: The columns the observers report (and command) shows.
SLOWDOWN_SHOW = ["mode", "method", "variant", "reps", "median_ms", "slowdown_x",
                 "paired_slowdown_x", "server_slowdown_x", "cpu_slowdown_x", "hits",
                 "ns_per_hit", "ns_per_hit_cpu", "paired [95% CI]", "verdict"]


def slowdown_shown(slow: pd.DataFrame) -> pd.DataFrame:
    """The columns :data:`SLOWDOWN_SHOW` of :func:`profkit.analyze.observers.slowdown_table`
    *slow*: "paired [95% CI]" is the paired slowdown on its basis (cpu or wall) with its
    interval; an interval from too few pairs is left out (the verdict says "too few")."""

    def text(r: pd.Series) -> str:
        v = r.get("basis_slowdown_x")
        if not r.get("basis") or v is None or pd.isna(v):
            return ""
        lo, hi = r.get("ci_low_x"), r.get("ci_high_x")
        shown = (too_few_count(r.get("ci_method")) is None and pd.notna(lo) and pd.notna(hi))
        return f"{r['basis']} {v:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if shown else "")

    out = slow.copy()
    out["paired [95% CI]"] = [text(r) for _i, r in slow.iterrows()] if len(slow) else []
    return out[SLOWDOWN_SHOW]


def observers_markdown(slow: pd.DataFrame, guard: pd.DataFrame, costs: pd.DataFrame, *,
                       workload: str, scale: float,
                       run_id: str, la0: Sequence[float], la1: Sequence[float], uptime: str,
                       predicted: Mapping[str, Mapping[str, int]],
                       notes: Sequence[str] = ()) -> str:
    fmt = {"median_ms": "{:.1f}", "slowdown_x": "{:.2f}", "paired_slowdown_x": "{:.2f}",
           "server_slowdown_x": "{:.2f}", "hits": "{:,.0f}", "ns_per_hit": "{:,.0f}",
           "guard_ns_per_hit": "{:,.0f}", "guard_ratio": "{:.2f}", "guard_ratio_low": "{:.2f}",
           "guard_ratio_high": "{:.2f}", "cpu_slowdown_x": "{:.2f}",
           "ns_per_hit_cpu": "{:,.0f}"}
    lines = [f"# Observer effect of the observers: {workload} at scale {scale}", "",
             f"run `{run_id}`; load average before {loadavg_text(la0)}, after "
             f"{loadavg_text(la1)} (`uptime`: {uptime})", "",
             "slowdown_x = median observed / median unobserved client time; paired = median "
             "of per-pair ratios (each observed run follows an unobserved one); paired [95% "
             "CI] = the same on the time that sees the observer's cost (cpu: the backend's "
             "CPU time, for observers working inside it; wall: ltrace), with its bootstrap "
             "interval; verdict: slower (the interval is above 1), no slowdown measured (it "
             "holds 1: not told apart from this machine's noise), or too few (n = N) pairs "
             "for an interval (none is shown); ns_per_hit = "
             "(observed − unobserved) / hits (perf: per sample), from the client's wall time; "
             "cpu_* from the backend's CPU time (/proc/PID/schedstat: robust to the load of "
             "other processes, but blind to ltrace's own work); guard_ns_per_hit = what "
             "profkit.collect.bpf's cost guard assumes for that probe mix.", "",
             frame(slowdown_shown(slow), fmt), "",
             "## Cost guard check", "",
             "guard_ratio = measured ns/hit ÷ the guard's (from the paired slowdown, in ns "
             "per hit; from the medians where a run has no pairs), with its 95 % interval "
             "(guard_ratio_low/_high: the paired slowdown's interval in ns per hit); the "
             "verdict comes from the interval: guard too low / too high (all of it beyond 3× "
             "either way), ok (all of it within), unclear (it crosses a bound), too few "
             "(n = N) pairs, too few hits.", "", frame(guard, fmt), "",
             "Per probe kind (profkit.collect.bpf.DEFAULT_COST_NS keys; uprobe = a function of "
             "the postgres binary, derived from the per-node probe minus its clock hits): "
             "ratio = measured ns/hit ÷ the default, ratio_low/_high its 95 % interval from "
             "the pairs (for uprobe, the per-node and clock probes' pairs resampled each on "
             "its own); the verdict from the interval, in the guard check's words (default "
             "too low / too high beyond 3×).", "",
             frame(costs, {**fmt, "ns_per_hit_wall": "{:,.0f}", "default_ns": "{:,.0f}",
                           "ratio": "{:.2f}", "ratio_low": "{:.2f}",
                           "ratio_high": "{:.2f}"}), "",
             "## Predicted clock reads per execution", ""]
    for mode, t in predicted.items():
        lines.append(f"- {mode}: clock_reads {t.get('clock_reads', 0):,} (ltrace-visible "
                     f"{t.get('clock_reads_ltrace', 0):,}), ExecProcNodeInstr "
                     f"{t.get('exec_proc_node_instr', 0):,}")
    lines += ["", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"
