#!/usr/bin/env python3
"""Does the slow-vCPU rule catch the executions that make the correction check lie?

    .venv/bin/python benchmarks/correction_vcpu.py [--runs 20] [--reps 7] [--scale 0.05]

Runs profkit's correction check (profkit.experiments.correction.measure_correction, the
backend pinned and the vCPU calibrated around every execution) *runs* times on vanilla,
join_sum at *scale*, one cluster for all of them.  Per run, from the same timings: the
summary with cpu_ms (every execution) and with cpu_kept_ms (the executions the rule
rejects left out); an execution whose cpu_ms is 1.5x its mode's median in that run or
more counts as an outlier.  Prints per run: executions left out, outliers and how many
of them were left out, and |corrected (split) - plain| in ms with each metric; then the
totals and how often each metric left the corrected time further from plain than
TIMING ON itself (the check's own assertion).  Take it with the machine idle.
"""
from __future__ import annotations

import argparse
import tempfile

import numpy as np

from profkit.analyze import stats
from profkit.experiments.correction import measure_correction
from profkit.pg.build import get_build
from profkit.pg.cluster import Cluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--scale", type=float, default=0.05)
    a = ap.parse_args()
    totals = {"left_out": 0, "outliers": 0, "outliers_left_out": 0, "executions": 0,
              "worse_cpu_ms": 0, "worse_cpu_kept_ms": 0}
    gaps: dict[str, list[float]] = {"cpu_ms": [], "cpu_kept_ms": []}
    with tempfile.TemporaryDirectory(prefix="correction-vcpu-") as tmp, \
            Cluster(get_build("vanilla"), name="correction-vcpu") as cl:
        print(f"{'run':>3} {'left out':>8} {'outliers':>8} {'of them left out':>16} "
              f"{'|split-plain| cpu_ms':>20} {'cpu_kept_ms':>11}  rejection rule")
        for i in range(1, a.runs + 1):
            res = measure_correction(cl, workloads={"join_sum": a.scale}, reps=a.reps,
                                     base=tmp, clock_loops=100_000, clock_repeats=3, seed=i)
            adj = stats.vcpu_adjust(res.timings)[0]
            med = adj.groupby("mode")["cpu_ms"].transform("median")
            out = adj["cpu_ms"] >= 1.5 * med
            row = {"left_out": int(adj["calib_slow"].sum()), "outliers": int(out.sum()),
                   "outliers_left_out": int((out & adj["calib_slow"]).sum()),
                   "executions": len(adj)}
            for k, v in row.items():
                totals[k] += v
            cols = []
            # the run's own summaries: cpu_kept_ms its default, cpu_ms among the others
            for m, summary in (("cpu_ms", res.other_metrics["cpu_ms"]),
                               ("cpu_kept_ms", res.summary)):
                s = summary.iloc[0]
                assert s["metric"] == m
                gap = abs(s["corrected_in_situ_split_ms"] - s["plain_split_ms"])
                gaps[m].append(gap)
                totals[f"worse_{m}"] += int(gap >= abs(s["timing_on_ms"] - s["plain_ms"]))
                cols.append(gap)
            print(f"{i:>3} {row['left_out']:>8} {row['outliers']:>8} "
                  f"{row['outliers_left_out']:>16} {cols[0]:>20.3f} {cols[1]:>11.3f}  "
                  f"{res.vcpu_note}", flush=True)
    print(f"\n{a.runs} runs of {a.reps} repetitions (join_sum {a.scale}): "
          f"{totals['executions']} executions, {totals['left_out']} left out by the rule; "
          f"{totals['outliers']} outliers (>= 1.5x their mode's median), "
          f"{totals['outliers_left_out']} of them left out")
    for m in ("cpu_ms", "cpu_kept_ms"):
        g = np.array(gaps[m])
        print(f"{m:>11}: |corrected split - plain| median {np.median(g):.3f} ms, max "
              f"{g.max():.3f} ms; further from plain than TIMING ON in "
              f"{totals[f'worse_{m}']} of {a.runs} runs")


if __name__ == "__main__":
    main()
