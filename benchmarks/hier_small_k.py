"""How well does the report's hierarchical interval cover with few backends?

A/A runs on this VM (``benchmarks/results/aa_false_positive-20261206.txt``) found the
4-backend design's bare 95 % percentile interval excluding 0 in 11 of 110 runs.  This
simulates the question on a two-level model (each backend's effect ~ N(0, between), each
repetition's ~ N(0, 1) around it; the true median is known) with
:func:`profkit.analyze.stats.hierarchical_bootstrap`: the coverage of its bare percentile
interval (``widen=False``, what the report printed before 2026-12-06), of that interval
widened by sqrt(K / (K − 1)) alone and by t(K − 1) / z as well (about the point), and of
the report's interval (``widen=True``: :func:`profkit.analyze.stats.small_sample_factor`,
Satterthwaite's degrees of freedom from the interval's between share).

Usage::

    .venv/bin/python benchmarks/hier_small_k.py [--experiments 400] [--reps 12]
    .venv/bin/python benchmarks/hier_small_k.py --reps 10 --ks 4,5,10 --level 0.9971

With *--ks* up to *--reps* it also compares designs of one size: the same repetitions on
more backends, fewer each (the last column: the report's interval's median width).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from scipy import stats as sps  # noqa: E402

from profkit.analyze.stats import (  # noqa: E402
    hierarchical_bootstrap,
    small_sample_factor,
    wilson_interval,
)

TRUE = 100.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", type=int, default=400)
    ap.add_argument("--reps", type=int, default=12, help="repetitions per arm, split over K")
    ap.add_argument("--between", default="0.5,2.0", help="between-backend sd(s), within sd 1")
    ap.add_argument("--ks", default="3,4,5,6,8")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--level", type=float, default=0.95,
                    help="the intervals' level (the demo's 17 simultaneous intervals: 0.9971)")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    level = args.level
    # 1,000 resamples at 95 % (as hier_small_k-20261206.txt was drawn); at a higher level
    # as stats.summarize draws them: 4000, or ~20 in each tail
    resamples = max(1000 if level == 0.95 else 4000, int(40 / (1 - level)))
    print(f"{args.experiments} experiments per cell; {args.reps} repetitions split over K "
          f"backends; within-backend sd 1; median; {resamples:,} resamples; level {level:g}")
    print("between sd | K | coverage: bare percentile [Wilson 95 %] | × sqrt(K/(K-1)) | "
          "× t(K-1)/z too | the report's [Wilson 95 %] | median widening: t(K-1) | "
          "the report's | the report's median width (within sd = 1)")
    for between in (float(x) for x in args.between.split(",")):
        for k in (int(x) for x in args.ks.split(",")):
            sizes = [len(a) for a in np.array_split(np.arange(args.reps), k)]
            hits = np.zeros(4, dtype=int)
            sat = []
            f1 = np.sqrt(k / (k - 1))
            q = 1 - (1 - level) / 2
            f2 = f1 * sps.t.ppf(q, k - 1) / sps.norm.ppf(q)
            full = []
            for _ in range(args.experiments):
                eff = rng.normal(0, between, k)
                groups = [TRUE + eff[i] + rng.normal(0, 1.0, n) for i, n in enumerate(sizes)]
                seed = int(rng.integers(2**32))
                ci, share = hierarchical_bootstrap(groups, np.median,
                                                   rng=np.random.default_rng(seed),
                                                   confidence=level,
                                                   n_resamples=resamples, widen=False)
                rep, _ = hierarchical_bootstrap(groups, np.median,
                                                rng=np.random.default_rng(seed),
                                                confidence=level, n_resamples=resamples)
                point = float(np.median(np.concatenate(groups)))
                sat.append(small_sample_factor(k, args.reps, share, level))
                full.append(rep.high - rep.low)
                for j, f in enumerate((1.0, f1, f2)):
                    lo = point - (point - ci.low) * f
                    hi = point + (ci.high - point) * f
                    hits[j] += lo <= TRUE <= hi
                hits[3] += rep.low <= TRUE <= rep.high
            cov = hits / args.experiments
            lo, hi = wilson_interval(int(hits[0]), args.experiments)
            lo3, hi3 = wilson_interval(int(hits[3]), args.experiments)
            print(f"{between:g} | {k} | {cov[0]:.3f} [{lo:.3f}, {hi:.3f}] | {cov[1]:.3f} | "
                  f"{cov[2]:.3f} | {cov[3]:.3f} [{lo3:.3f}, {hi3:.3f}] | "
                  f"{f2:.2f} | {np.median(sat):.2f} | {np.median(full):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
