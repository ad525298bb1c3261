"""How often does `profkit correction`'s 95 % interval of corrected / plain hold the truth?

:func:`profkit.analyze.observers.corrected_ratio_interval` is a percentile bootstrap over
whole repetitions of a statistic built from three medians and a median of paired
differences.  A percentile interval from a handful of repetitions covers less than its
level says; this script measures by how much, per number of repetitions *n*.

Each simulated run has *n* repetitions of plain, TIMING OFF and TIMING ON of a join_sum-like
query (plain 3.2 ms, row counting +0.5 ms, 100,230 clock reads at 20 ns = +2.0 ms with
TIMING ON), each execution's time its true time × a draw from a noise model
(``demo``: the committed demo runs' kept CPU times over their cell's median, this VM's
own spread; ``lognormal:S``), the micro-benchmark's price per read the true one.  The
truth is the statistic on 200,001 repetitions from the same model.  Prints, per *n*, the
share of runs whose interval holds it (with its 95 % Wilson interval) and the median
width.

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/correction_interval_coverage.py --sims 400 --noise demo
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from small_n_intervals import sampler  # noqa: E402

from profkit.analyze import observers as A  # noqa: E402
from profkit.analyze.stats import wilson_interval  # noqa: E402

PLAIN_MS, ROWS_MS, CLOCK_MS = 3.2, 0.5, 2.0
READS, CALLS = 100_230, 50_111
NS_PER_READ = CLOCK_MS * 1e6 / READS


def draw_run(rng: np.random.Generator, draw, n: int) -> pd.DataFrame:
    true = {"plain": PLAIN_MS, "analyze_notiming": PLAIN_MS + ROWS_MS,
            "analyze_timing": PLAIN_MS + ROWS_MS + CLOCK_MS}
    rows = [{"run_id": "sim", "rep": rep, "mode": m, "cpu_ms": ms * float(draw(rng, 1)[0])}
            for rep in range(1, n + 1) for m, ms in true.items()]
    return pd.DataFrame(rows)


def statistic(t: pd.DataFrame) -> float:
    """corrected_micro_ratio as :func:`profkit.analyze.observers.correction_summary`
    computes it (the medians of every execution, the paired OFF − plain gap)."""
    wide = t.pivot_table(index="rep", columns="mode", values="cpu_ms")
    row_cost = max(0.0, float((wide["analyze_notiming"] - wide["plain"]).median())) * 1e6 / CALLS
    corrected = float(wide["analyze_timing"].median()) - (READS * NS_PER_READ
                                                           + CALLS * row_cost) / 1e6
    return corrected / float(wide["plain"].median())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=400)
    ap.add_argument("--noise", default="demo")
    ap.add_argument("--n", type=int, nargs="+", default=[4, 5, 7, 11, 21])
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    draw, label = sampler(a.noise)
    rng = np.random.default_rng(a.seed)
    truth = statistic(draw_run(rng, draw, 200_001))
    print(f"# noise {label}; {a.sims} runs per n; truth (200,001 repetitions) {truth:.4f}")
    print("| n | runs holding the truth | 95 % Wilson | median width |")
    print("|---|---|---|---|")
    for n in a.n:
        hits, widths = 0, []
        for _ in range(a.sims):
            t = draw_run(rng, draw, n)
            lo, hi, _k, _m = A.corrected_ratio_interval(
                t, "cpu_ms", workload=f"sim{int(rng.integers(1 << 30))}", clock_reads=READS,
                instr_calls=CALLS, ns_per_read=NS_PER_READ)
            hits += lo <= truth <= hi
            widths.append(hi - lo)
        w_lo, w_hi = wilson_interval(hits, a.sims)
        print(f"| {n} | {hits / a.sims:.3f} ({hits} of {a.sims}) | [{w_lo:.3f}, {w_hi:.3f}] | "
              f"{float(np.median(widths)):.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
