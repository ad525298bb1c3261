"""How well does the report's hierarchical interval cover with few backends, and what would
a small-sample widening do?

A/A runs on this VM (``benchmarks/results/aa_false_positive-20261206.txt``) found the
4-backend design's 95 % interval excluding 0 in 11 of 110 runs.  This simulates the
same question on a two-level model (each backend's effect ~ N(0, between), each
repetition's ~ N(0, within) around it; the true median is known): the coverage of
:func:`profkit.analyze.stats.hierarchical_bootstrap` at K backends, and of the same
interval widened about its point estimate by sqrt(K / (K − 1)) (the bootstrap's
variance of a mean over K resampled clusters is (K − 1) / K of the unbiased one), by
t(K − 1) / z as well (Student's quantile at the backends' degrees of freedom), and by
:func:`small_k_factor` (the between part of the variance corrected by K / (K − 1),
Student's quantile at Satterthwaite's degrees of freedom from the interval's own
between-backend share: K − 1 when the backends hold all the variance, N − K when they
hold none).

Usage::

    .venv/bin/python benchmarks/hier_small_k.py [--experiments 400] [--reps 12]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from scipy import stats as sps  # noqa: E402

from profkit.analyze.stats import hierarchical_bootstrap, wilson_interval  # noqa: E402

TRUE = 100.0


def small_k_factor(k: int, n: int, share_pct: float, confidence: float = 0.95) -> float:
    """Widening of a hierarchical percentile interval from *k* backends and *n*
    repetitions whose variance is *share_pct* % between backends."""
    s = min(max(share_pct / 100.0, 0.0), 1.0) if np.isfinite(share_pct) else 1.0
    var = s * k / (k - 1) + (1 - s)
    df = 1.0 / (s * s / (k - 1) + ((1 - s) ** 2 / (n - k) if n > k else 0.0))
    q = 1 - (1 - confidence) / 2
    return float(np.sqrt(var) * sps.t.ppf(q, df) / sps.norm.ppf(q))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", type=int, default=400)
    ap.add_argument("--reps", type=int, default=12, help="repetitions per arm, split over K")
    ap.add_argument("--between", default="0.5,2.0", help="between-backend sd(s), within sd 1")
    ap.add_argument("--ks", default="3,4,5,6,8")
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"{args.experiments} experiments per cell; {args.reps} repetitions split over K "
          "backends; within-backend sd 1; median; 1,000 resamples")
    print("between sd | K | coverage: percentile [Wilson 95 %] | × sqrt(K/(K-1)) | "
          "× t(K-1)/z too | Satterthwaite | median widening: t(K-1) | Satterthwaite")
    for between in (float(x) for x in args.between.split(",")):
        for k in (int(x) for x in args.ks.split(",")):
            sizes = [len(a) for a in np.array_split(np.arange(args.reps), k)]
            hits = np.zeros(4, dtype=int)
            widths, sat = [], []
            f1 = np.sqrt(k / (k - 1))
            f2 = f1 * sps.t.ppf(0.975, k - 1) / sps.norm.ppf(0.975)
            for _ in range(args.experiments):
                eff = rng.normal(0, between, k)
                groups = [TRUE + eff[i] + rng.normal(0, 1.0, n) for i, n in enumerate(sizes)]
                ci, share = hierarchical_bootstrap(groups, np.median, rng=rng,
                                                   n_resamples=1000)
                point = float(np.median(np.concatenate(groups)))
                f3 = small_k_factor(k, args.reps, share)
                sat.append(f3)
                for j, f in enumerate((1.0, f1, f2, f3)):
                    lo = point - (point - ci.low) * f
                    hi = point + (ci.high - point) * f
                    hits[j] += lo <= TRUE <= hi
                widths.append(f2)
            cov = hits / args.experiments
            lo, hi = wilson_interval(int(hits[0]), args.experiments)
            print(f"{between:g} | {k} | {cov[0]:.3f} [{lo:.3f}, {hi:.3f}] | {cov[1]:.3f} | "
                  f"{cov[2]:.3f} | {cov[3]:.3f} | {np.median(widths):.2f} | "
                  f"{np.median(sat):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
