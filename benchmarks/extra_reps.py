#!/usr/bin/env python3
"""How often the vCPU rule leaves a cell short, and what the extra repetitions buy.

    .venv/bin/python benchmarks/extra_reps.py [--runs 20] [--reps 3] [--load none|memory]

Runs ``profkit bench`` (vanilla and step3, nested_loop at scale 0.01, the three modes,
*reps* repetitions, no instruction counts, the default --min-kept: half of *reps*
rounded up) *runs* times.  With ``--load memory`` a process pinned to another CPU than
the backends' copies 256 MB back and forth the whole time: what a neighbour's work (a
compile, another test) does to this VM's calibrations, as in make test's shared phase.

Per run, from the run's own timings: the fewest kept repetitions of any (build, mode)
among the planned repetitions alone (the rule applied to those rows only: what a run
without extra repetitions would have kept), the extra repetitions run, and the fewest
kept after them (the rule on every row, as the report applies it); then how many runs
had a cell with none kept, or fewer than --min-kept, before and after, and the run
times.  Take it with the machine otherwise idle.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from profkit.analyze import stats
from profkit.collect.vcpu import default_pin_cpu
from profkit.experiments.bench import run_bench

#: numpy copies of 256 MB, forever, on one CPU
_LOAD = ("import numpy as np\n"
         "a = np.ones(32 << 20); b = np.empty_like(a)\n"
         "while True:\n"
         "    np.copyto(b, a); np.copyto(a, b)\n")


def fewest_kept(timings: pd.DataFrame) -> int:
    """The fewest executions of any (build, mode) the rule keeps in *timings*."""
    adj = stats.vcpu_adjust(timings)[0]
    kept = adj["cpu_kept_ms"].notna().groupby([adj["build"], adj["mode"]]).sum()
    return int(kept.min())


def start_load(kind: str) -> subprocess.Popen[bytes] | None:
    if kind == "none":
        return None
    pin = default_pin_cpu()
    other = sorted(c for c in os.sched_getaffinity(0) if c != pin)
    if not other:
        raise SystemExit("--load memory needs a CPU besides the backends' one")
    p = subprocess.Popen([sys.executable, "-c", _LOAD])
    os.sched_setaffinity(p.pid, {other[0]})
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--load", choices=("none", "memory"), default="none")
    a = ap.parse_args()
    want = (a.reps + 1) // 2
    rows = []
    load = start_load(a.load)
    try:
        with tempfile.TemporaryDirectory(prefix="extra-reps-") as tmp:
            print(f"# {a.runs} runs of profkit bench vanilla,step3 nested_loop 0.01, "
                  f"{a.reps} reps (min_kept {want}), load {a.load}")
            print(f"{'run':>3} {'rejected':>9} {'fewest kept (planned)':>21} {'extra':>5} "
                  f"{'fewest kept (after)':>19} {'seconds':>7}")
            for i in range(1, a.runs + 1):
                t0 = time.monotonic()
                res = run_bench(["vanilla", "step3"], "nested_loop", 0.01, a.reps,
                                progress=None, instructions="none",
                                out_dir=Path(tmp) / f"run{i}", order_seed=i)
                secs = time.monotonic() - t0
                t = res.timings
                extra = json.loads((res.out_dir / "provenance.json").read_text())[
                    "extra_repetitions"]["extra_reps"]
                row = {"run": i, "rejected": int(stats.vcpu_adjust(t)[1].rejected),
                       "executions": len(t),
                       "planned": fewest_kept(t[t["rep"] <= a.reps]), "extra": extra,
                       "after": fewest_kept(t), "seconds": secs}
                rows.append(row)
                print(f"{i:>3} {row['rejected']:>4}/{len(t):<4} {row['planned']:>21} "
                      f"{extra:>5} {row['after']:>19} {secs:>7.1f}", flush=True)
    finally:
        if load is not None:
            load.kill()
            load.wait()
    df = pd.DataFrame(rows)
    print(f"\nruns with a cell of 0 kept: {int((df['planned'] == 0).sum())} of {len(df)} "
          f"among the planned repetitions, {int((df['after'] == 0).sum())} after the extra "
          f"ones; fewer than {want}: {int((df['planned'] < want).sum())} before, "
          f"{int((df['after'] < want).sum())} after")
    print(f"extra repetitions: {int(df['extra'].sum())} in {int((df['extra'] > 0).sum())} "
          f"runs; run time median {df['seconds'].median():.1f} s, with extra repetitions "
          f"{df.loc[df['extra'] > 0, 'seconds'].median():.1f} s, without "
          f"{df.loc[df['extra'] == 0, 'seconds'].median():.1f} s")


if __name__ == "__main__":
    main()
