"""Which slow-vCPU rule gives the tighter A/A comparison? (global vs local reference)

The report leaves out every execution with a calibration above one threshold for the
whole run (:func:`profkit.analyze.stats.vcpu_adjust`: the run's median calibration plus
3.5 robust standard deviations, at least 3 % above the median). When the host's speed
drifts within a run, the median absolute deviation grows with the drift and a short
burst can pass under the threshold. A *local* reference would judge each calibration
against its neighbours in time instead (the median of the ``--window`` calibrations on
each side), with the same z and floor applied to the ratios calibration / neighbours.

Both rules are applied to the same A/A runs (vanilla against vanilla on clusters of its
own: ``benchmarks/aa_false_positive.py --designs after --out DIR``), and each run's A/A
difference of plain Query-1 is estimated on the repetitions both arms kept (the median
of per-repetition ratios; its interval resamples backends, then repetitions, as the
report's does). The true difference is 0, so for each rule: how far the estimates are
from 0 (median |estimate|), how wide the intervals are, how often they exclude 0 and
how many executions the rule left out. Rules: ``none`` (every execution's cpu_ms),
``global`` (the report's), ``local``, ``both`` (an execution left out when either rule
flags it). The rules are compared on the same runs, run by run (paired: the share of
runs in which ``local`` or ``both`` gives a narrower interval than ``global``).

Usage::

    .venv/bin/python benchmarks/aa_false_positive.py --runs 30 --designs after --out /var/tmp/vcpu-aa
    .venv/bin/python benchmarks/vcpu_rule_aa.py /var/tmp/vcpu-aa/after
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from profkit.analyze.stats import (SLOW_MIN_EXCESS, SLOW_Z, paired_estimates, vcpu_adjust,
                                   wilson_interval)
from profkit.experiments import bench

RULES = ("none", "global", "local", "both")


def local_slow(t: pd.DataFrame, window: int, z: float = SLOW_Z,
               min_excess: float = SLOW_MIN_EXCESS) -> pd.Series:
    """Per execution of *t*: a calibration of it is slow against its neighbours in time
    (the median of *window* calibrations before and *window* after it)."""
    order = t.sort_values("t_start").index
    s = np.column_stack([t.loc[order, "calib_before_ms"], t.loc[order, "calib_after_ms"]]
                        ).astype("float64").ravel()
    n = len(s)
    ref = np.array([np.median(np.concatenate([s[max(0, i - window):i], s[i + 1:i + 1 + window]]))
                    for i in range(n)])
    r = s / ref - 1.0
    mid = float(np.median(r))
    mad = float(np.median(np.abs(r - mid)))
    thr = max(mid + z * 1.4826 * mad, min_excess)
    slow = (r > thr).reshape(-1, 2).any(axis=1)
    return pd.Series(slow, index=order).reindex(t.index)


def evaluate(run_dir: Path, window: int, seed: int) -> dict[str, dict[str, float]]:
    t = bench.load_timings(run_dir)
    adj, _speed = vcpu_adjust(t)
    flags = {"none": pd.Series(False, index=adj.index), "global": adj["calib_slow"].astype(bool)}
    flags["local"] = local_slow(adj, window)
    flags["both"] = flags["global"] | flags["local"]
    if "backend" not in adj.columns:
        adj = adj.assign(backend=1)
    out = {}
    for rule in RULES:
        kept = adj[(adj["mode"] == "plain") & ~flags[rule]]
        w = kept.pivot_table(index="rep", columns="build", values="cpu_ms", aggfunc="first")
        w = w.dropna()
        bk = adj.groupby("rep")["backend"].first().reindex(w.index)
        if len(w) < 3:
            out[rule] = {"est": np.nan, "lo": np.nan, "hi": np.nan, "pairs": len(w),
                         "left_out": int(flags[rule].sum())}
            continue
        est, lo, hi = paired_estimates(w["vanilla"].to_numpy(), w[bench.AA_LABEL].to_numpy(),
                                       bk.to_numpy(), rng=np.random.default_rng(seed))["median"]
        out[rule] = {"est": est, "lo": lo, "hi": hi, "pairs": len(w),
                     "left_out": int(flags[rule].sum()), "n": len(adj)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, help="a folder of A/A bench runs (aa_false_positive.py's "
                    "<out>/after)")
    ap.add_argument("--window", type=int, default=8,
                    help="calibrations on each side that make the local reference (default 8)")
    args = ap.parse_args(argv)
    dirs = [d for d in sorted(args.runs.glob("*-bench-*"))
            if json.loads((d / "provenance.json").read_text()).get("status") == "complete"]
    if not dirs:
        ap.error(f"no complete bench runs under {args.runs}")
    res = [evaluate(d, args.window, seed=11) for d in dirs]
    slow: list[float] = []
    for d in dirs:  # what the run-wide rule saw: its slow calibrations, x the reference
        t = bench.load_timings(d)
        _adj, speed = vcpu_adjust(t)
        c = np.concatenate([t["calib_before_ms"].to_numpy(float), t["calib_after_ms"].to_numpy(float)])
        slow += list(c[c > speed.threshold_ms] / speed.reference_ms)
    print(f"{len(dirs)} A/A runs under {args.runs}; local window ±{args.window} calibrations; "
          "plain Query-1, cpu_ms, median of per-repetition ratios, 95 % intervals")
    if slow:
        q = np.percentile(slow, [0, 25, 50, 75, 100])
        print(f"the run-wide rule's slow calibrations: {len(slow)}, at "
              + " / ".join(f"{x:.3f}" for x in q)
              + " x their run's median (min / quartile / median / quartile / max)")
    print("\nrule | runs | median |estimate| (points) | median width (points) | "
          "excludes 0 [Wilson 95 %] | executions left out")
    for rule in RULES:
        r = [x[rule] for x in res if np.isfinite(x[rule]["est"])]
        hits = sum(x["lo"] > 0 or x["hi"] < 0 for x in r)
        lo, hi = wilson_interval(hits, len(r))
        left = sum(x[rule]["left_out"] for x in res)
        total = sum(x[rule].get("n", 0) for x in res)
        print(f"{rule} | {len(r)} | {np.median([abs(x['est']) for x in r]):.2f} | "
              f"{np.median([x['hi'] - x['lo'] for x in r]):.2f} | {hits}/{len(r)} "
              f"[{lo:.3f}, {hi:.3f}] | {left} of {total}")
    print("\npaired, run by run, against global: narrower interval | smaller |estimate|")
    for rule in ("none", "local", "both"):
        pairs = [(x[rule], x["global"]) for x in res
                 if np.isfinite(x[rule]["est"]) and np.isfinite(x["global"]["est"])]
        narrower = sum((a["hi"] - a["lo"]) < (g["hi"] - g["lo"]) for a, g in pairs)
        same = sum((a["hi"] - a["lo"]) == (g["hi"] - g["lo"]) for a, g in pairs)
        closer = sum(abs(a["est"]) < abs(g["est"]) for a, g in pairs)
        print(f"{rule}: narrower in {narrower} of {len(pairs)} runs ({same} the same), "
              f"closer to 0 in {closer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
