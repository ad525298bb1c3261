"""Row-counting overhead of the step variants, against vanilla's plain query.

One ``profkit bench`` run (callgrind instruction counts, one execution per build and
mode; CPU times with bootstrap CIs beside them in the run's summary.csv) of plain
Query-1 and EXPLAIN (ANALYZE, TIMING FALSE, BUFFERS FALSE) Query-2 on every build,
then, per build, from the run's ``instructions.csv``:

- ``Q1``, ``Q2``: instructions of the plain and the row-counting query;
- ``Q2 vs own Q1``: the seed's figure, (Q2 − Q1) / Q1 of the same build;
- ``Q1 vs vanilla Q1``: what the patch costs queries that run without EXPLAIN;
- ``Q2 vs vanilla Q1``: the cost of counting rows against the unpatched plain query.

Targets: Q2 vs vanilla Q1 <= 1.0 % and Q1 vs vanilla Q1 <= 0.3 %.  The
peer (vanilla, of the same major version) is measured in the same run.

Usage::

    .venv/bin/python benchmarks/bench_row_counting.py                      # PG18
    .venv/bin/python benchmarks/bench_row_counting.py --builds pg19/vanilla,pg19/step3,pg19/step5
    .venv/bin/python benchmarks/bench_row_counting.py --run profiles/<run_id>  # re-read a run
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

TARGET_Q2_VS_VANILLA = 1.0
TARGET_Q1_VS_VANILLA = 0.3


def overhead_table(instr: pd.DataFrame, vanilla: str) -> pd.DataFrame:
    """One row per build: Q1, Q2 and the three overheads (percent) against *vanilla*."""
    per = instr.groupby(["build", "mode"])["instructions"].median()
    if (vanilla, "plain") not in per.index:
        raise SystemExit(f"no plain-query count for the reference build {vanilla!r} in the run")
    v1 = float(per[(vanilla, "plain")])
    rows = []
    for build in dict.fromkeys(instr["build"]):
        q1 = per.get((build, "plain"))
        q2 = per.get((build, "analyze_notiming"))
        rows.append({
            "build": build,
            "Q1": None if q1 is None else int(q1),
            "Q2": None if q2 is None else int(q2),
            "Q2 vs own Q1 %": None if q1 is None or q2 is None else (q2 - q1) / q1 * 100,
            "Q1 vs vanilla Q1 %": None if q1 is None else (q1 - v1) / v1 * 100,
            "Q2 vs vanilla Q1 %": None if q2 is None else (q2 - v1) / v1 * 100,
        })
    out = pd.DataFrame(rows)
    out["meets targets"] = ((out["Q2 vs vanilla Q1 %"] <= TARGET_Q2_VS_VANILLA)
                            & (out["Q1 vs vanilla Q1 %"] <= TARGET_Q1_VS_VANILLA))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--builds", default="vanilla,step3,step4,step5",
                    help="comma-separated presets; the first is the vanilla reference")
    ap.add_argument("--workload", default="nested_loop")
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None, help="profiles folder for the run")
    ap.add_argument("--run", default=None, help="read an existing run directory instead")
    args = ap.parse_args(argv)

    if args.run:
        run_dir = Path(args.run)
    else:
        cmd = [str(Path(sys.executable).with_name("profkit")), "bench", "--builds", args.builds,
               "--workload", args.workload, "--scale", str(args.scale), "--reps", str(args.reps),
               "--modes", "plain,analyze_notiming", "--instructions", "callgrind"]
        if args.out:
            cmd += ["--out", args.out]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        base = Path(args.out) if args.out else None
        if base is None:
            from profkit.paths import profiles_dir

            base = profiles_dir()
        run_dir = (base / "latest").resolve()
    instr = pd.read_csv(run_dir / "instructions.csv")
    labels = list(dict.fromkeys(instr["build"]))
    vanilla = labels[0] if not args.run else next((b for b in labels if "vanilla" in b), labels[0])
    table = overhead_table(instr, vanilla)
    print(f"\nrun: {run_dir}  workload {instr['workload'].iloc[0]}  (callgrind instructions, "
          f"reference: {vanilla})")
    with pd.option_context("display.float_format", "{:.3f}".format, "display.width", 160):
        print(table.to_string(index=False))
    print(f"targets: Q2 vs vanilla Q1 <= {TARGET_Q2_VS_VANILLA}%, Q1 vs vanilla Q1 <= "
          f"{TARGET_Q1_VS_VANILLA}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
