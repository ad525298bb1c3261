"""count_star's Seq Scan under sampled timing, at several rates, against perf's share.

Why this script: the dominant-node test of tests/test_sampled_timing.py read the Seq Scan's
share of the Aggregate at 0.83-0.93 on this VM at rate 100, where exact timing minus its
clock reads gives 0.64-0.66. A yardstick that reads no clock at all settles which is
right: perf's call-graph samples of the same query under TIMING FALSE.

For each build (a sampled_timing preset, or a named build of a variant of its patch):

- ``perf``: one count_star cluster at scale 0.1, the query under EXPLAIN (ANALYZE, TIMING
  FALSE) recorded with perf (frame pointers) for ``--perf-reps`` runs. Of the samples
  under ``ExecAgg``, the share with a second ``ExecProcNodeInstr`` above it (the Seq Scan
  node's call, its InstrStartNode/InstrStopNode included) and the same without the samples
  in those two functions (the part of the call a timed interval does not hold).
- ``rates``: ``--reps`` interleaved rounds; in each, EXPLAIN ANALYZE with TIMING TRUE at
  every rate of ``--rates``, then one TIMING FALSE run. Per rate: the medians of the
  Aggregate's and the Seq Scan's inclusive times, of the share, and of the Execution Time;
  and the TIMING FALSE Execution Time. Rate 1 is PostgreSQL's exact timing (clock reads
  left in).

Usage::

    .venv/bin/python benchmarks/sampled_timing_rates.py [--build NAME ...] \
        [--rates 1 2 10 100 1000] [--reps 5] [--no-perf]
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys

from profkit.analyze import timing_accuracy as ta
from profkit.collect.perf import fold_run, record_query
from profkit.pg.build import get_build
from profkit.pg.cluster import Cluster
from profkit.pg.workloads import get_workload
from profkit.rundir import open_run

WL = get_workload("count_star")
SCALE = 0.1


def perf_share(cl: Cluster, conn, reps: int) -> tuple[float, float, int]:
    """(share with the Seq Scan's Instr calls, share without them, samples under ExecAgg)."""
    sql = WL.query("analyze_notiming", fmt="json")
    conn.execute(sql).fetchone()  # warm
    with open_run("perf", build=cl.build, workload="count_star", mode="analyze_notiming",
                  tools=("gcc",)) as rd:
        record_query(cl, conn, sql, run=rd, reps=reps, scale=SCALE, freq=4999, stat=False)
        prof = fold_run(rd)
    agg = inner = inner_instr = 0
    for stack, n in prof.counts.items():
        frames = stack.split(";")
        if "ExecAgg" not in frames:
            continue
        agg += n
        below = frames[frames.index("ExecAgg") + 1:]
        if "ExecProcNodeInstr" in below:
            inner += n
            tail = below[below.index("ExecProcNodeInstr") + 1:]
            if tail and tail[0] in ("InstrStartNode", "InstrStopNode"):
                inner_instr += n
    if not agg:
        raise SystemExit(f"{cl.build.name}: no samples under ExecAgg: is perf recording "
                         "this backend with frame pointers?")
    return inner / agg, (inner - inner_instr) / agg, agg


def rates_scan(conn, rates: list[int], reps: int) -> None:
    got: dict[int, list[tuple[float, float, float]]] = {r: [] for r in rates}
    false_ms: list[float] = []
    for _ in range(2):  # warm the cache and the calibration
        conn.execute(WL.query("analyze_timing", fmt="json")).fetchone()
    for _ in range(reps):
        for r in rates:
            conn.execute(f"SET explain_timing_sample_rate = {r}")
            t = ta.node_times(conn.execute(WL.query("analyze_timing", fmt="json"))
                              .fetchone()[0])
            got[r].append((t["inclusive_ms"].iloc[0], t["inclusive_ms"].iloc[1],
                           t.attrs["execution_ms"]))
        f = ta.node_times(conn.execute(WL.query("analyze_notiming", fmt="json")).fetchone()[0])
        false_ms.append(f.attrs["execution_ms"])
    conn.execute("RESET explain_timing_sample_rate")
    fe = statistics.median(false_ms)
    print(f"  TIMING FALSE Execution Time {fe:.2f} ms (median of {reps})")
    print("  rate | Aggregate ms | Seq Scan ms | share | Execution ms | Aggregate / FALSE")
    for r in rates:
        agg = statistics.median(x[0] for x in got[r])
        seq = statistics.median(x[1] for x in got[r])
        share = statistics.median(x[1] / x[0] for x in got[r])
        ex = statistics.median(x[2] for x in got[r])
        print(f"  {r:>4} | {agg:12.2f} | {seq:11.2f} | {share:.3f} | {ex:12.2f} | "
              f"{agg / fe:.3f}", flush=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="append", help="default: sampled_timing")
    ap.add_argument("--rates", type=int, nargs="+", default=[1, 2, 10, 100, 1000])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--perf-reps", type=int, default=40)
    ap.add_argument("--no-perf", action="store_true")
    a = ap.parse_args(argv)
    print(f"# benchmarks/sampled_timing_rates.py {' '.join(argv)}")
    print(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%dT%H:%M:%SZ}, load average "
          + "/".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    for name in a.build or ["sampled_timing"]:
        b = get_build(name)
        print(f"{name} ({b.dir.name}): count_star at scale {SCALE}", flush=True)
        with Cluster(b, name=f"rates-{name}") as cl, cl.connect() as conn:
            WL.load(conn, SCALE)
            if not a.no_perf:
                with_instr, without, n = perf_share(cl, conn, a.perf_reps)
                print(f"  perf, TIMING FALSE: Seq Scan share of the Aggregate {with_instr:.3f}"
                      f" with its InstrStartNode/InstrStopNode, {without:.3f} without "
                      f"({n} samples under ExecAgg)", flush=True)
            rates_scan(conn, a.rates, a.reps)
    print("# load average at the end " + "/".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
