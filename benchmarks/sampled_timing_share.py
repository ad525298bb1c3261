"""count_star's Seq Scan share of the root, per build, against exact timing minus its reads.

The check test_sampled_timing's dominant-node test makes, printed for several builds on
this machine: for each build, a count_star cluster at scale 0.1, 2 warm-up runs, then 7
pairs of EXPLAIN ANALYZE (TIMING TRUE, TIMING FALSE). Per pair: the Seq Scan's inclusive
time over the Aggregate's (``share``), and the same after taking out each node's own clock
reads (``corrected share``: :func:`profkit.analyze.timing_accuracy.corrected_times` with
the in-situ cost of one read, (TIMING TRUE - TIMING FALSE Execution Time) / reads).
sampled_timing runs at rate 100 (its estimator, which subtracts its own calibrated costs:
no corrected share, since not every call reads the clock) and at rate 1 (every call timed).

Usage::

    .venv/bin/python benchmarks/sampled_timing_share.py sampled_timing tsc_clock vanilla
"""
from __future__ import annotations

import statistics
import sys

from profkit.analyze import timing_accuracy as ta
from profkit.analyze.correction import in_situ_ns_per_read
from profkit.pg.build import get_build
from profkit.pg.cluster import Cluster
from profkit.pg.workloads import get_workload

WL = get_workload("count_star")


def run(build: str, rates: tuple[int | None, ...], reps: int = 7) -> None:
    with Cluster(get_build(build), name=f"share-{build}") as cl, cl.connect() as conn:
        WL.load(conn, 0.1)
        for rate in rates:
            if rate:
                conn.execute(f"SET explain_timing_sample_rate = {rate}")
            for _ in range(2):
                conn.execute(WL.query("analyze_timing", fmt="json")).fetchone()
            every_call = rate in (None, 1)  # at rate 100 not every call reads the clock
            shares, corr, ratios, nss = [], [], [], []
            for _ in range(reps):
                t = ta.node_times(conn.execute(WL.query("analyze_timing", fmt="json"))
                                  .fetchone()[0])
                f = ta.node_times(conn.execute(WL.query("analyze_notiming", fmt="json"))
                                  .fetchone()[0])
                root, seq = t["inclusive_ms"].iloc[0], t["inclusive_ms"].iloc[1]
                shares.append(seq / root)
                fe = f.attrs["execution_ms"]
                ratios.append(root / fe)
                if every_call:
                    reads = 2 * int(ta.instr_calls_per_node(t).sum())
                    ns = max(0.0, in_situ_ns_per_read(t.attrs["execution_ms"], fe, reads))
                    nss.append(ns)
                    c = ta.corrected_times(t, ns)
                    corr.append(c["inclusive_ms"].iloc[1] / c["inclusive_ms"].iloc[0])
            corrected = (f"corrected share {statistics.median(corr):.3f} "
                         f"[{min(corr):.3f}..{max(corr):.3f}], ns/read "
                         f"{statistics.median(nss):.1f}" if every_call
                         else "corrected share n/a (sampled)")
            print(f"{build} rate={rate or '-'}: share {statistics.median(shares):.3f} "
                  f"[{min(shares):.3f}..{max(shares):.3f}], {corrected}, "
                  f"root/TIMING FALSE {statistics.median(ratios):.3f}", flush=True)


def main(argv: list[str]) -> int:
    for b in argv or ["sampled_timing", "tsc_clock", "vanilla"]:
        run(b, (100, 1) if b == "sampled_timing" else (None,))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
