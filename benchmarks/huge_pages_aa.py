"""Do huge pages for shared memory narrow the A/A intervals? (huge_pages=off against on)

On this VM most of an A/A interval's variance lies between backends (each a fresh
cluster): 60-80 % in ``aa_false_positive.py``'s runs.  One candidate cause is where the
kernel places a cluster's shared buffers: with 4 kB pages every cluster gets other
physical pages, so other cache sets collide.  With 2 MB pages (``huge_pages=on``) the
low 21 bits of an address are the same virtually and physically (in the guest, at least).

Each run is one ``profkit bench`` of four arms, all vanilla, interleaved as usual:
``off1``/``off2`` with ``huge_pages=off`` and ``on1``/``on2`` with ``huge_pages=on``,
*--backends* K fresh clusters per arm, 5 repetitions per backend, plain Query-1 and
Query-2 (``analyze_notiming``).  For each pair the report's interval is drawn for arm 2
against arm 1's plain query (plain: the A/A interval, which should hold 0; Query-2: the
row-counting overhead, across two clusters), with the report's time measure and
estimator (:func:`profkit.analyze.stats.summarize`: paired by repetition, hierarchical
over backends, widened for few backends).  Printed per workload and mode: the median
width with huge pages off and on, their ratio run by run, and how many A/A intervals
excluded 0.

Also printed: the correlation across blocks of the off and on arms' per-backend median
plain times in each run.  Block k of every arm runs in the same time window (on
clusters of its own), so a high correlation says the "backend" level is mostly the
machine's speed over time, which no placement of memory changes.

``huge_pages=on`` needs reserved pages: run as root, the script raises
``vm.nr_hugepages`` to *--hugepages* for the run and puts the old value back after.

Usage::

    .venv/bin/python benchmarks/huge_pages_aa.py --runs 10 --out /tmp/hp
    .venv/bin/python benchmarks/huge_pages_aa.py --read /tmp/hp
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from profkit.analyze import stats
from profkit.analyze.stats import wilson_interval
from profkit.experiments import bench

ARMS = ("off1=vanilla:huge_pages=off,off2=vanilla:huge_pages=off,"
        "on1=vanilla:huge_pages=on,on2=vanilla:huge_pages=on")
PAIRS = {"off": ("off1", "off2"), "on": ("on1", "on2")}
MODES = ("plain", "analyze_notiming")
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")


def intervals(run_dir: Path) -> list[dict]:
    t = bench.load_timings(run_dir)
    metric = stats.default_metric(t)
    frame, col = stats.metric_frame(t, metric)
    rows = []
    for hp, (a, b) in PAIRS.items():
        for mode in MODES:
            # as the report's against-vanilla columns draw it (stats.attach_reference)
            r = stats.against_plain_of(frame, col, a, b, mode,
                                       pair="common" if metric == "cpu_kept_ms" else "auto")
            rows.append({"run": run_dir.name, "workload": t["workload"].iloc[0], "hp": hp,
                         "mode": mode, "pct": r["overhead_pct"], "low": r["ci_low_pct"],
                         "high": r["ci_high_pct"], "share": r["between_share_pct"],
                         "method": r["ci_method"]})
    return rows


def block_correlation(run_dir: Path) -> float:
    t = bench.load_timings(run_dir)
    m = (t[t["mode"] == "plain"].groupby(["backend", "build"])["cpu_ms"].median()
         .unstack())
    off = np.log(m[["off1", "off2"]].mean(axis=1))
    on = np.log(m[["on1", "on2"]].mean(axis=1))
    return float(np.corrcoef(off, on)[0, 1])


def summary(run_dirs: list[Path]) -> str:
    df = pd.DataFrame([r for d in run_dirs for r in intervals(d)])
    df["width"] = df["high"] - df["low"]
    lines = ["workload | mode | runs | median width off | on | median ratio on/off (run by "
             "run) | runs narrower with on (sign test p) | median between share off | on"]
    for (wl, mode), g in df.groupby(["workload", "mode"], sort=True):
        w = g.pivot_table(index="run", columns="hp", values="width")
        s = g.groupby("hp")["share"].median()
        ratio = (w["on"] / w["off"]).median()
        narrower = int((w["on"] < w["off"]).sum())
        p = binomtest(narrower, len(w)).pvalue
        lines.append(f"{wl} | {mode} | {len(w)} | {w['off'].median():.2f} | "
                     f"{w['on'].median():.2f} | {ratio:.2f} | {narrower} (p {p:.2f}) | "
                     f"{s['off']:.0f} % | {s['on']:.0f} %")
    lines += ["", "A/A (plain against plain): intervals that exclude 0"]
    pl = df[df["mode"] == "plain"]
    for (wl, hp), g in pl.groupby(["workload", "hp"], sort=True):
        hits = int(((g["low"] > 0) | (g["high"] < 0)).sum())
        lo, hi = wilson_interval(hits, len(g))
        lines.append(f"{wl} huge_pages={hp}: {hits} of {len(g)}, rate {hits / len(g):.3f} "
                     f"[Wilson 95 %: {lo:.3f}, {hi:.3f}]")
    corr = pd.Series({d.name: block_correlation(d) for d in run_dirs})
    wls = df.drop_duplicates("run").set_index("run")["workload"]
    lines += ["", "correlation across blocks of the off and on arms' per-backend median plain "
              "time (per run): median [min, max]"]
    for wl, c in corr.groupby(wls.reindex(corr.index)):
        lines.append(f"{wl}: {c.median():.2f} [{c.min():.2f}, {c.max():.2f}] over {len(c)} runs")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="runs per workload (default 10)")
    ap.add_argument("--workloads", default="nested_loop=0.02,join_sum=0.1",
                    help="WORKLOAD=SCALE,... (default nested_loop=0.02,join_sum=0.1)")
    ap.add_argument("--backends", type=int, default=4, help="backends per arm (default 4)")
    ap.add_argument("--seed-base", type=int, default=300,
                    help="order seed of run i is SEED_BASE + i")
    ap.add_argument("--hugepages", type=int, default=800,
                    help="vm.nr_hugepages during the runs (default 800: 1.6 GB; four "
                         "clusters of shared_buffers 256MB at once need about 560)")
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here")
    ap.add_argument("--read", type=Path, default=None, help="re-read the runs in this folder")
    args = ap.parse_args(argv)
    if args.read is not None:
        print(summary(sorted(p.parent for p in args.read.glob("*/provenance.json"))))
        return 0
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    root = args.out or Path(tempfile.mkdtemp(prefix="huge-pages-aa-"))
    before = int(NR_HUGEPAGES.read_text())
    if before < args.hugepages:
        try:
            NR_HUGEPAGES.write_text(str(args.hugepages))
        except PermissionError:
            raise SystemExit(f"huge_pages=on needs {args.hugepages} reserved huge pages "
                             f"(vm.nr_hugepages is {before}): run as root, or raise it "
                             "yourself (sysctl -w vm.nr_hugepages=N)") from None
    dirs = []
    try:
        for item in args.workloads.split(","):
            wl, scale = item.split("=")
            for i in range(args.runs):
                d = root / f"{wl}-{i:02d}"
                bench.run_bench(ARMS, wl, float(scale), reps=5 * args.backends, modes=MODES,
                                backends=args.backends, instructions="none", progress=None,
                                order_seed=args.seed_base + i, out_dir=d)
                dirs.append(d)
                print(f"{d}: done", flush=True)
    finally:
        if before < args.hugepages:
            NR_HUGEPAGES.write_text(str(before))
    print(summary(dirs))
    print(f"runs kept in {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
