"""How often does the step table say "differs" when nothing differs, by repetitions kept?

The report's "Does each step change the overhead?" table
(:func:`profkit.analyze.stats.compare_chain`) called a step a change whenever the
bootstrap interval of the overhead difference excluded 0. A bootstrap interval from a handful of
values covers less than it claims (with 3 values the percentile interval of a median
is their range, which holds the true median 75 % of the time, not 95 %), and the
slow-vCPU rule and small ``--reps`` leave cells with 2-5 executions.

Here two builds are drawn from the same distribution (the same true overhead), so every
"differs" is a false positive: printed both for the interval alone (excludes 0) and for
the verdict the report shows (:attr:`~profkit.analyze.stats.BuildComparison.overhead_differs`,
none below :data:`~profkit.analyze.stats.MIN_VERDICT_REPS` repetitions). Each simulated
run has *n* repetitions of plain and Query-2 per build, drawn from a noise model, and
goes through :func:`profkit.analyze.stats.compare_builds` as a report's would, on two
paths:

- ``paired``: every execution kept (per-repetition overheads, resampled jointly);
- ``rejected``: one execution of each build left out at random, as the vCPU rule does
  (the samples no longer pair one to one: ratio of medians, four samples resampled).

Noise models: ``demo`` draws from the committed ``make demo`` runs of this VM
(``benchmarks/results/demo*/timings.csv``: each kept execution's CPU time over its
cell's median, all cells pooled), ``lognormal:S`` a log-normal with sigma S.

With ``--effect D`` build b's true overhead is D points higher: the rates are then how
often the real change is seen (the price of the verdict's stricter rule).

Usage::

    .venv/bin/python benchmarks/small_n_intervals.py --sims 400 --noise demo
    .venv/bin/python benchmarks/small_n_intervals.py --sims 400 --noise demo --effect 5
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from profkit.analyze.stats import compare_builds, vcpu_adjust, wilson_interval

ROOT = Path(__file__).resolve().parent.parent


def demo_noise() -> np.ndarray:
    """Every kept execution's cpu time / its cell's median, over the committed demo runs."""
    out = []
    for f in sorted((ROOT / "benchmarks" / "results").glob("demo*/timings.csv")):
        adj, _ = vcpu_adjust(pd.read_csv(f))
        kept = adj[adj["cpu_kept_ms"].notna()]
        rel = kept["cpu_kept_ms"] / kept.groupby(["build", "mode"])["cpu_kept_ms"].transform("median")
        out.append(rel.to_numpy())
    if not out:
        raise SystemExit("no benchmarks/results/demo*/timings.csv to draw the noise from")
    return np.concatenate(out)


def sampler(noise: str):
    if noise == "demo":
        pool = demo_noise()
        return (lambda rng, size: rng.choice(pool, size=size)), f"demo ({len(pool)} values)"
    if noise.startswith("lognormal:"):
        s = float(noise.split(":", 1)[1])
        return (lambda rng, size: rng.lognormal(0.0, s, size=size)), noise
    raise SystemExit(f"unknown noise model {noise!r}: demo or lognormal:SIGMA")


def one_run(rng: np.random.Generator, draw, n: int, path: str, effect: float = 0.0
            ) -> pd.DataFrame:
    rows = []
    order = 0
    for rep in range(1, n + 1):
        for build in ("a", "b"):
            for mode, base in (("plain", 100.0),
                               ("analyze_notiming", 130.0 + (effect if build == "b" else 0))):
                rows.append({"run_id": "sim", "build": build, "workload": "w", "query": mode,
                             "mode": mode, "rep": rep, "order": order,
                             "client_ms": np.nan, "server_ms": base * float(draw(rng, 1)[0])})
                order += 1
    df = pd.DataFrame(rows)
    if path == "rejected":
        for build in ("a", "b"):
            idx = df.index[df["build"] == build]
            df = df.drop(index=rng.choice(idx))
    return df


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=400, help="simulated runs per cell (400)")
    ap.add_argument("--noise", default="demo", help="demo | lognormal:SIGMA (default demo)")
    ap.add_argument("--n", default="2,3,4,5,6,8,10,12",
                    help="repetitions per build and mode to try (default 2,3,4,5,6,8,10,12)")
    ap.add_argument("--resamples", type=int, default=2000,
                    help="bootstrap resamples per interval (the report uses 9999; default 2000)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--effect", type=float, default=0.0,
                    help="build b's true Query-2 overhead above a's, in points (default 0: "
                    "every 'differs' is false; > 0: how often a real change is seen)")
    args = ap.parse_args(argv)
    draw, what = sampler(args.noise)
    ns = [int(x) for x in args.n.split(",")]
    rng = np.random.default_rng(args.seed)
    same = ("the same overhead" if not args.effect else
            f"overheads 30 % and {30 + args.effect:g} % (a real change of {args.effect:g} points)")
    print(f"noise {what}; {args.sims} simulated runs per cell; two builds with {same}; "
          f"compare_builds on Query-2, {args.resamples} resamples; 95 % intervals")
    print("\npath | n | interval excludes 0 | rate [Wilson 95 %] | verdict 'differs' "
          "(overhead_differs) | rate [Wilson 95 %] | ci methods")
    t0 = time.monotonic()
    for path in ("paired", "rejected"):
        for n in ns:
            if path == "rejected" and n < 3:
                continue
            hits = excl = 0
            methods: dict[str, int] = {}
            for i in range(args.sims):
                df = one_run(rng, draw, n, path, args.effect)
                c = compare_builds(df, "a", "b", "analyze_notiming", "server_ms",
                                   n_resamples=args.resamples, seed=args.seed * 100_000 + i)
                hits += bool(c.overhead_differs)
                excl += bool(c.diff_ci_low_pct > 0 or c.diff_ci_high_pct < 0)
                methods[c.ci_method] = methods.get(c.ci_method, 0) + 1
            elo, ehi = wilson_interval(excl, args.sims)
            lo, hi = wilson_interval(hits, args.sims)
            m = ", ".join(f"{k} {v}" for k, v in sorted(methods.items()))
            print(f"{path} | {n} | {excl}/{args.sims} | {excl / args.sims:.3f} "
                  f"[{elo:.3f}, {ehi:.3f}] | {hits}/{args.sims} | {hits / args.sims:.3f} "
                  f"[{lo:.3f}, {hi:.3f}] | {m}", flush=True)
    print(f"\n{time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
