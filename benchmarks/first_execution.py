#!/usr/bin/env python3
r"""Does each EXPLAIN mode need a warm-up execution of its own in every backend?

``profkit bench`` runs, in each fresh backend, one warm-up execution of every (build,
mode) before the measured ones: plain first, then each EXPLAIN mode. With one backend
per repetition (the default from 8 repetitions on) the warm-ups are about half of the
benchmark's executions. This script measures what they guard against: per (build,
mode), the time of the warm-up execution (for an EXPLAIN mode: its first in a backend
that has run the plain query once) against the measured execution of the same cell in
the same backend, as the ratio first / measured, per backend; and pooled over the builds
("all builds": every backend of every build a unit).

    .venv/bin/python benchmarks/first_execution.py [--builds vanilla,step5]
        [--workload nested_loop] [--scale 0.05] [--reps 12] [--seed 1] [--out DIR]
    .venv/bin/python benchmarks/first_execution.py --read DIR [DIR ...]

Prints per (build, mode) and metric (cpu_ms: the backend's CPU time for the statement,
the report's metric before the vCPU rule; client_ms: the wall time the client saw; a
first execution has no server_ms, as pg_stat_statements has no entry to subtract yet)
the median of the per-backend ratios in % above 1,
a 95 % bootstrap interval of that median over backends, and how many backends had
the ratio above 1. A mode whose interval lies within what an A/A pair shows on this VM
(a few %, docs/benchmark.md) does not need its own warm-up; one whose first execution is
slower does. The warm-up executions and the run's timings are kept in DIR
(warmups.csv beside the run). Take it with the machine idle.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profkit.experiments import bench  # noqa: E402

METRICS = ("cpu_ms", "client_ms")


def run(args: argparse.Namespace) -> Path:
    out = Path(args.out or tempfile.mkdtemp(prefix="first-execution-"))
    warmups: list[dict] = []
    warm, execute = bench._Bench.warm, bench._Bench.execute
    warming: list[bool] = [False]

    def warm_noted(self, t, mode):  # profkit's warm-up, as it is
        warming[0] = True
        try:
            warm(self, t, mode)
        finally:
            warming[0] = False

    def execute_kept(self, t, mode):  # each execution; a warm-up's is kept
        m = execute(self, t, mode)
        if warming[0]:
            warmups.append({"build": t.label, "mode": mode, "backend_pid": t.backend_pid,
                            "block": t.block, **{k: m[k] for k in METRICS}})
        return m

    bench._Bench.warm, bench._Bench.execute = warm_noted, execute_kept
    try:
        res = bench.run_bench(args.builds, args.workload, args.scale, args.reps,
                              instructions="none", order_seed=args.seed, root=out,
                              progress=True)
    finally:
        bench._Bench.warm, bench._Bench.execute = warm, execute
    pd.DataFrame(warmups).to_csv(out / "warmups.csv", index=False)
    res.timings.to_csv(out / "timings.csv", index=False)
    print(f"# run {res.run_id}: {len(res.timings)} measured executions, {len(warmups)} "
          f"warm-ups, in {out}")
    return out


def report(folders: list[Path], n_boot: int = 4000, seed: int = 0) -> None:
    """The table of one or several folders this script wrote (pooled: a backend is a
    (folder, pid))."""
    warm = pd.concat([pd.read_csv(f / "warmups.csv").assign(folder=str(f)) for f in folders])
    timed = pd.concat([pd.read_csv(f / "timings.csv").assign(folder=str(f)) for f in folders])
    keys = ["folder", "build", "mode", "backend_pid"]
    # the measured execution of each cell in each backend (one per backend by default;
    # the median where a backend ran more, e.g. an extra repetition)
    measured = timed.groupby(keys, sort=False)[list(METRICS)].median().reset_index()
    both = warm.merge(measured, on=keys, suffixes=("_first", "_measured"))
    rng = np.random.default_rng(seed)
    order = {m: i for i, m in enumerate(bench.DEFAULT_MODES)}
    units = len(both.drop_duplicates(["folder", "build", "backend_pid"]))
    print(f"# {', '.join(map(str, folders))}: {units} backends; ratio = warm-up "
          "(first) execution / measured one, same backend; median over backends in % "
          "above 1, 95 % bootstrap interval of the median (resampling backends)")
    print(f"{'build':<14} {'mode':<18} {'metric':<10} {'n':>3} {'median %':>9} "
          f"{'95 % interval':>18} {'above 1':>8}")
    pooled = [(("all builds", mode), g) for mode, g in both.groupby("mode")]
    for (b, mode), g in sorted(list(both.groupby(["build", "mode"])) + pooled,
                               key=lambda kv: (kv[0][0] == "all builds", kv[0][0],
                                               order.get(kv[0][1], 99))):
        for metric in METRICS:
            r = (g[f"{metric}_first"] / g[f"{metric}_measured"]).to_numpy()
            r = r[np.isfinite(r)]
            if len(r) == 0:
                continue
            boots = np.median(rng.choice(r, size=(n_boot, len(r)), replace=True), axis=1)
            lo, hi = np.percentile(boots, [2.5, 97.5])
            print(f"{b:<14} {mode:<18} {metric:<10} {len(r):>3} "
                  f"{(np.median(r) - 1) * 100:>+9.2f} "
                  f"{f'[{(lo - 1) * 100:+.2f}, {(hi - 1) * 100:+.2f}]':>18} "
                  f"{int((r > 1).sum()):>4}/{len(r)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--builds", default="vanilla,step5")
    ap.add_argument("--workload", default="nested_loop")
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--read", type=Path, nargs="+", default=None,
                    help="print the table of folders this script wrote (pooled)")
    args = ap.parse_args()
    report(args.read if args.read else [run(args)])


if __name__ == "__main__":
    main()
