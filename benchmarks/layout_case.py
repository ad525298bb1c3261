"""Is step2's plain Query-1 slower than vanilla's, or only linked differently?

step2 executes the same instructions as vanilla on the plain query (callgrind), yet
one-binary-per-arm runs here measured it 3.3-3.7 % slower (p < 1e-5): a code-layout
effect that an interval resampling one binary's backends cannot see. This runs the same
comparison twice, interleaved in one session of the machine's time:

- ``backends``: ``profkit bench --builds vanilla,step2 --modes plain --backends K --aa``:
  each arm one binary, K fresh clusters and backends (the hierarchical interval);
- ``layouts``: the same with ``--layouts K``: each arm K code layouts of its build
  (``BUILD@layout1..K``, the same code linked in K function orders), one backend each;

and prints, for each, step2's plain Query-1 against vanilla's (the ``vs_ref`` interval),
the A/A twin's interval (vanilla against vanilla, on other clusters — and, with layouts,
other layouts), and the instruction counts (callgrind) of both builds' plain query.
A difference whose interval excludes 0 at equal instructions is a false positive.

    .venv/bin/python benchmarks/layout_case.py [--reps 16] [--scale 0.05] [--layouts 4]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from profkit.analyze.stats import aa_check
from profkit.experiments import bench


def _instr(pct: float) -> str:
    return "not counted" if pct != pct else f"{pct:+.4f} %"  # NaN: no instructions counted


def one(design: str, args: argparse.Namespace, root: Path) -> str:
    t0 = time.monotonic()
    layouts = args.layouts if design == "layouts" else 0
    res = bench.run_bench("vanilla,step2", args.workload, args.scale, args.reps,
                          modes=["plain"], warmup=1, root=root / design, progress=None,
                          instructions="callgrind" if design == "backends" else "none",
                          order_seed=args.seed, aa=True, backends=args.layouts,
                          layouts=layouts)
    files = bench.write_report(res)
    import pandas as pd

    s = pd.read_csv(files.summary_csv)
    step2 = s[(s["build"] == "step2") & (s["mode"] == "plain")].iloc[0]
    aa = aa_check(s, bench.AA_LABEL)
    line = (f"| {design} | {int(step2['backends'])} | {step2['vs_ref_pct']:+.2f} % "
            f"[{step2['vs_ref_ci_low_pct']:+.2f}, {step2['vs_ref_ci_high_pct']:+.2f}] | "
            f"{'yes' if step2['vs_ref_ci_low_pct'] > 0 or step2['vs_ref_ci_high_pct'] < 0 else 'no'}"
            f" | {aa.diff_pct:+.2f} % [{aa.ci_low_pct:+.2f}, {aa.ci_high_pct:+.2f}]"
            f" | {_instr(step2['vs_ref_instr_pct'])} | {time.monotonic() - t0:.0f} s | "
            f"{res.out_dir} |") if aa is not None else f"| {design} | no A/A interval |"
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="nested_loop")
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=16)
    ap.add_argument("--layouts", type=int, default=4, help="K: layouts, and backends of "
                    "the 'backends' design")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("/var/tmp/layout-case"))
    args = ap.parse_args(argv)
    print(f"{args.workload} at scale {args.scale}, {args.reps} repetitions, plain Query-1; "
          f"load average at start {os.getloadavg()[0]:.1f}", flush=True)
    lines = ["| design | backends per arm | step2 vs vanilla (95 % interval) | excludes 0 | "
             "A/A twin vs vanilla | instructions step2 vs vanilla | wall | run |",
             "|---|---|---|---|---|---|---|---|"]
    for design in ("backends", "layouts"):
        lines.append(one(design, args, args.out))
        print(lines[-1], flush=True)
    print("\n".join(["", *lines, "", f"load average at the end {os.getloadavg()[0]:.1f}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
