"""count_star's Seq Scan under sampled timing, at several rates, against perf's share.

Why this script: the dominant-node test of tests/test_sampled_timing.py read the Seq Scan's
share of the Aggregate at 0.83-0.93 on this VM at rate 100, where exact timing minus its
clock reads gives 0.64-0.66. A yardstick that reads no clock at all settles which is
right: the share of perf's call-graph samples, by profkit's stack method.

For each build (a sampled_timing preset, a named build of a variant of its patch, or a
build without sampling such as vanilla or tsc_clock):

- ``perf``: one count_star cluster at scale 0.1; the plain query (no EXPLAIN, no
  instrumentation at all) profiled by the stack method
  (:func:`profkit.experiments.nodetime.nodetime_on_conn`, perf call stacks matched to the
  plan) for at least ``--perf-samples`` executor samples: the Seq Scan's inclusive share
  over the Aggregate's.
- ``rates``: ``--reps`` interleaved rounds; in each, EXPLAIN ANALYZE with TIMING TRUE at
  every rate of ``--rates`` (a build without the setting: once, at its own exact timing),
  then one TIMING FALSE run. Per rate: the medians of the Aggregate's and the Seq Scan's
  inclusive times, of the share, and of the Execution Time; and the TIMING FALSE
  Execution Time. Where every call reads the clock (rate 1, or no sampling), also the
  share after taking out each node's own clock reads at their in-situ cost
  (:func:`profkit.analyze.timing_accuracy.corrected_times` with
  :func:`profkit.analyze.correction.in_situ_ns_per_read`).

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
import tempfile

from profkit.analyze import timing_accuracy as ta
from profkit.analyze.correction import in_situ_ns_per_read
from profkit.experiments.nodetime import nodetime_on_conn
from profkit.pg.build import get_build
from profkit.pg.cluster import Cluster
from profkit.pg.workloads import get_workload

WL = get_workload("count_star")
SCALE = 0.1


def perf_share(conn, min_samples: int) -> tuple[float, float]:
    """(the Seq Scan's inclusive share over the Aggregate's, executor samples) by the
    stack method on the plain query; the run folder is thrown away."""
    with tempfile.TemporaryDirectory(prefix="sampled-rates-") as td:
        r = nodetime_on_conn(conn, WL.query("plain"), min_samples=min_samples, base=td)
    d = r.df.set_index("node_id")
    if list(d["node_type"].iloc[:2]) != ["Aggregate", "Seq Scan"]:
        raise SystemExit(f"count_star's plan is not Aggregate over Seq Scan: {list(d['node_type'])}")
    return float(d.loc[1, "inclusive_share"] / d.loc[0, "inclusive_share"]), r.executor_samples


def has_sampling(conn) -> bool:
    return conn.execute("SELECT count(*) FROM pg_settings "
                        "WHERE name = 'explain_timing_sample_rate'").fetchone()[0] == 1


def rates_scan(conn, rates: list[int | None], reps: int) -> None:
    got: dict[int | None, list[tuple[float, float, float, float | None]]] = {r: [] for r in rates}
    false_ms: list[float] = []
    for _ in range(2):  # warm the cache and the calibration
        conn.execute(WL.query("analyze_timing", fmt="json")).fetchone()
    for _ in range(reps):
        ts = []
        for r in rates:
            if r is not None:
                conn.execute(f"SET explain_timing_sample_rate = {r}")
            ts.append(ta.node_times(conn.execute(WL.query("analyze_timing", fmt="json"))
                                    .fetchone()[0]))
        f = ta.node_times(conn.execute(WL.query("analyze_notiming", fmt="json")).fetchone()[0])
        fe = f.attrs["execution_ms"]
        false_ms.append(fe)
        for r, t in zip(rates, ts, strict=True):
            corr = None
            if r in (None, 1):  # every call reads the clock: take its reads out
                reads = 2 * int(ta.instr_calls_per_node(t).sum())
                ns = max(0.0, in_situ_ns_per_read(t.attrs["execution_ms"], fe, reads))
                c = ta.corrected_times(t, ns)
                corr = c["inclusive_ms"].iloc[1] / c["inclusive_ms"].iloc[0]
            got[r].append((t["inclusive_ms"].iloc[0], t["inclusive_ms"].iloc[1],
                           t.attrs["execution_ms"], corr))
    if any(r is not None for r in rates):
        conn.execute("RESET explain_timing_sample_rate")
    fe = statistics.median(false_ms)
    print(f"  TIMING FALSE Execution Time {fe:.2f} ms (median of {reps})")
    print("  rate | Aggregate ms | Seq Scan ms | share | Execution ms | Aggregate / FALSE"
          " | share minus reads")
    for r in rates:
        agg = statistics.median(x[0] for x in got[r])
        seq = statistics.median(x[1] for x in got[r])
        share = statistics.median(x[1] / x[0] for x in got[r])
        ex = statistics.median(x[2] for x in got[r])
        corr = [x[3] for x in got[r] if x[3] is not None]
        cs = f"{statistics.median(corr):.3f}" if corr else "-"
        print(f"  {r or '-':>4} | {agg:12.2f} | {seq:11.2f} | {share:.3f} | {ex:12.2f} | "
              f"{agg / fe:.3f} | {cs}", flush=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="append", help="default: sampled_timing")
    ap.add_argument("--rates", type=int, nargs="+", default=[1, 2, 10, 100, 1000])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--perf-samples", type=int, default=10_000)
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
                share, n = perf_share(conn, a.perf_samples)
                print(f"  perf (stack method), plain query: Seq Scan share of the Aggregate "
                      f"{share:.3f} ({n:.0f} executor samples)", flush=True)
            rates_scan(conn, a.rates if has_sampling(conn) else [None], a.reps)
    print("# load average at the end " + "/".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
