"""Which units should a test of the plain query across builds count: executions or backends?

The bench report's "plain query across builds" section compares every build's Query-1
time with the first build's.  Its rank test used to take each execution as a unit; but a
run with ``--backends K`` splits each build's executions over K fresh clusters and
backends, and what a backend's process brings (where its heap and its hot data land, the
code layout it sees) moves all its executions together.  A test on the executions then
counts one backend's luck as many observations.  This script reads bench runs and, for
every build against the first, prints both tests' p-values, how far apart the build's
backends are, and how often each test calls two builds different at 5 %.

On A/A runs (``benchmarks/aa_false_positive.py --designs after --out DIR``: vanilla
against vanilla on clusters of its own, 4 backends each) every "different" is a false
positive: a test that keeps its level does so in about 5 % of the runs (the rank test on
4 against 4 backend medians can only reach p = 2/70 = 0.029, so at most 2.9 % there).

Usage::

    .venv/bin/python benchmarks/plain_backends.py RUN_OR_FOLDER [...] [--metric M]

A folder is searched for runs (every ``timings.csv`` below it).  *--metric*: the time
measure (default: the report's, :func:`profkit.analyze.stats.default_metric`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from profkit.analyze import stats  # noqa: E402


def runs_under(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if (p / "timings.csv").is_file():
            out.append(p)
        else:
            out += sorted(f.parent for f in p.rglob("timings.csv"))
    return out


def read_run(run: Path, metric: str | None) -> list[dict]:
    t = pd.read_csv(run / "timings.csv")
    m = metric or stats.default_metric(t)
    x = stats.bench_extras(t, None, m)
    if x.plain_vs_base is None:
        return []
    frame, col = stats.metric_frame(t, m)
    rows = []
    for r in x.plain_vs_base.itertuples():
        c = stats.compare_builds(frame, x.plain_base, r.build, "plain", col)
        spread = {}
        for b in (x.plain_base, r.build):
            med = stats.backend_medians(frame, col, b)
            spread[b] = (med.max() / med.min() - 1) * 100 if len(med) >= 2 else float("nan")
        rows.append({"run": run.name, "metric": m, "a": x.plain_base, "b": r.build,
                     "time_pct": r.time_pct, "p_executions": c.time_p_value,
                     "n": f"{c.n_a}/{c.n_b}", "p_backends": r.p_value, "unit": r.p_unit,
                     "spread_a_pct": spread[x.plain_base], "spread_b_pct": spread[r.build]})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--metric", default=None)
    args = ap.parse_args(argv)
    runs = runs_under(args.paths)
    if not runs:
        print("no runs (no timings.csv) under " + ", ".join(map(str, args.paths)),
              file=sys.stderr)
        return 2
    rows = [r for run in runs for r in read_run(run, args.metric)]
    df = pd.DataFrame(rows)
    print("run | a -> b | plain time b vs a % | p on executions (n) | p on backends (unit) | "
          "spread of a's backend medians % | of b's %")
    for r in df.itertuples():
        print(f"{r.run} | {r.a} -> {r.b} | {r.time_pct:+.2f} | {r.p_executions:.3g} ({r.n}) | "
              f"{r.p_backends:.3g} ({r.unit}) | {r.spread_a_pct:.1f} | {r.spread_b_pct:.1f}")
    n = len(df)
    print()
    for col, label in (("p_executions", "executions"), ("p_backends", "the report's units")):
        k = int((df[col] < 0.05).sum())
        lo, hi = stats.wilson_interval(k, n)
        print(f"p < 0.05 on {label}: {k} of {n} comparisons, rate {k / n:.3f} "
              f"[Wilson 95 %: {lo:.3f}, {hi:.3f}]")
    print(f"largest spread of one build's backend medians: "
          f"{max(df['spread_a_pct'].max(), df['spread_b_pct'].max()):.1f} % "
          f"(median {pd.concat([df['spread_a_pct'], df['spread_b_pct']]).median():.1f} %)")
    print(f"metric: {', '.join(sorted(set(df['metric'])))}; {len(runs)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
