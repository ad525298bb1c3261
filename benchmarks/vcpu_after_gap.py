#!/usr/bin/env python3
"""Is the vCPU calibration just after an execution slower than the one just before it,
and does that depend on the query's mode?  Two versions of the calibration helper
(profkit/collect/vcpu_calib.c at a git revision, and the working tree's), each in its own
benchmark of vanilla against itself, the two alternated round by round.

    .venv/bin/python benchmarks/vcpu_after_gap.py [--before REV] [--rounds 2] [--scale 0.01]
                                                  [--reps 10]

--before defaults to the revision before the helper's untimed pass (80331f9~1), the
helper benchmarks/results/vcpu_after_gap-20261205.txt compares with.

Prints, per helper and mode, the median calibration before and after the executions
(ms), their median gap (after - before) and the executions the slow-vCPU rule
(stats.vcpu_adjust) rejected.  A gap that grows with the mode (TIMING on runs longest)
rejects one mode's executions more than another's.  Take it with the machine idle.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

import pandas as pd

from profkit.analyze import stats
from profkit.collect import vcpu
from profkit.experiments import bench

ROOT = Path(__file__).resolve().parent.parent


def one(src: Path, scale: float, reps: int, out: Path) -> pd.DataFrame:
    vcpu.HELPER_SRC = src  # build_helper() compiles it once per source hash
    res = bench.run_bench("vanilla,aa=vanilla", "nested_loop", scale, reps, out_dir=out,
                          progress=False, instructions="none")
    adj, _ = stats.vcpu_adjust(res.timings)
    return adj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="80331f9~1", help="git revision of the other helper")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vcpu-after-gap-"))
    try:
        old = work / "vcpu_calib.c"
        old.write_bytes(subprocess.run(
            ["git", "show", f"{a.before}:profkit/collect/vcpu_calib.c"], cwd=ROOT,
            capture_output=True, check=True).stdout)
        arms = {f"helper at {a.before}": old, "helper in the working tree": vcpu.HELPER_SRC}
        frames: dict[str, list[pd.DataFrame]] = {k: [] for k in arms}
        for r in range(a.rounds):
            order = list(arms) if r % 2 == 0 else list(arms)[::-1]
            for name in order:
                frames[name].append(one(arms[name], a.scale, a.reps,
                                        work / f"round{r}-arm{list(arms).index(name)}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the runs: only the table below is kept
    print(f"vanilla against itself, nested_loop at scale {a.scale}, {a.reps} repetitions, "
          f"{a.rounds} runs per helper (alternated)")
    for name in arms:
        df = pd.concat(frames[name], ignore_index=True)
        df["gap_ms"] = df["calib_after_ms"] - df["calib_before_ms"]
        g = df.groupby("mode").agg(n=("cpu_ms", "size"), before_ms=("calib_before_ms", "median"),
                                   after_ms=("calib_after_ms", "median"),
                                   gap_ms=("gap_ms", "median"), rejected=("calib_slow", "sum"),
                                   cpu_ms=("cpu_ms", "median"))
        print(f"\n{name}:")
        print(g.round(3).to_string())


if __name__ == "__main__":
    main()
