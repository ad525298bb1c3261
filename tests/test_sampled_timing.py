"""sampled_timing's estimator on a real build: exact rows and loops, heavy calls caught.

One cluster of the sampled_timing build, join_sum at a small scale (i1 = 20,000 rows,
i2 = 20): the Hash Join's first 20 calls each return one of the first 20 outer rows and
its 21st call scans the other 19,980 (the rare heavy call the first version of the
patch almost never sampled: it reported the Hash Join at 0.09 ms against 12 ms).
The estimator's own properties are checked through a probe (tests/c/, compiled here
against the build's server headers) that drives the patched InstrStartNode/StopNode on
instrumentation of its own: a call's contribution is kept when it is negative, and the
sampler's bookkeeping in a child's calls is taken out of its parent's time.  The bias
per node is measured by `benchmarks/sampled_timing_bias.py` (a `profkit timing-accuracy`
run, committed in benchmarks/results/); a synthetic query holds the build to that
measured bound.
"""
from __future__ import annotations

import math
import shutil
import statistics
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import benchmark_module

from profkit.analyze import timing_accuracy as ta
from profkit.pg.build import get_build
from profkit.pg.cluster import Cluster
from profkit.pg.workloads import get_workload

pytestmark = [pytest.mark.pg, pytest.mark.builds("sampled_timing"), pytest.mark.alone]

SCALE = 0.02
RATES = (1, 2, 100)


@pytest.fixture(scope="module")
def plans():
    """rate -> list of node tables (3 runs each), plus 3 TIMING FALSE runs under key 0,
    in 3 interleaved rounds (a slow spell of this VM lands on every mode alike)."""
    wl = get_workload("join_sum")
    out: dict[int, list] = {rate: [] for rate in (*RATES, 0)}
    with Cluster(get_build("sampled_timing"), name="test-sampled-timing") as cl, \
            cl.connect() as conn:
        wl.load(conn, SCALE)
        for _ in range(3):
            for rate in RATES:
                conn.execute(f"SET explain_timing_sample_rate = {rate}")
                out[rate].append(ta.node_times(
                    conn.execute(wl.query("analyze_timing", fmt="json")).fetchone()[0]))
            conn.execute("RESET explain_timing_sample_rate")
            out[0].append(ta.node_times(conn.execute(wl.query("analyze_notiming", fmt="json"))
                                        .fetchone()[0]))
        assert conn.execute("SHOW explain_timing_sample_rate").fetchone()[0] == "100"
    return out


def test_rows_and_loops_exact_at_every_rate(plans):
    ref = plans[0][0][["node_type", "rows", "loops"]]
    assert list(ref["node_type"]) == ["Aggregate", "Hash Join", "Seq Scan", "Hash", "Seq Scan"]
    assert ref["rows"].tolist() == [1, 20, 20_000, 20, 20]
    for rate in RATES:
        for df in plans[rate]:
            assert df[["node_type", "rows", "loops"]].equals(ref), (rate, df)


def test_times_positive_finite_and_consistent(plans):
    # medians of 3: one TIMING FALSE run of this ~2.4 ms query read 13.1 ms in a module
    # run here (its medians of 8 runs: 2.4-2.5 ms, outliers to 8.6 ms), and one rate-1 run
    # put 2.2 ms of a 12.3 ms Execution Time outside its root node
    notiming_ms = statistics.median(df.attrs["execution_ms"] for df in plans[0])
    for rate in RATES:
        near = []
        for df in plans[rate]:
            t = df["inclusive_ms"]
            assert t.map(math.isfinite).all() and (t >= 0).all(), (rate, df)
            assert (df["startup_ms"] >= 0).all()
            root, exec_ms = t.iloc[0], df.attrs["execution_ms"]
            # the root (2 calls: exact) holds everything; at N > 1 minus the sampled
            # nodes' clock reads and bookkeeping inside it (calibrated and subtracted), so
            # it estimates the query without them: never more than EXPLAIN's own Execution
            # Time, and near the TIMING FALSE run's (measured here: 0.9-1.1 of it, while
            # 0.64-0.69 of the instrumented Execution Time)
            assert 0 < root <= exec_ms * 1.001, (rate, root, exec_ms)
            near.append(root / exec_ms if rate == 1 else root / notiming_ms)
        if rate == 1:
            assert statistics.median(near) >= 0.9, (rate, near)
        else:
            assert statistics.median(near) >= 0.5, (rate, near, notiming_ms)


def test_heavy_last_call_is_always_timed(plans):
    # the Hash Join's 21st call holds most of the query: measured in every run, never
    # left to a 1-in-N chance (its 19,980 descendant calls exceed 8N = 800 at N = 100)
    for rate in RATES:
        for df in plans[rate]:
            agg, hj, outer = df["inclusive_ms"].iloc[:3]
            assert hj >= 0.7 * agg, (rate, df[["node_type", "inclusive_ms"]])
            assert outer > 0, (rate, df)


def test_corpus_at_rate_2_keeps_rows_and_loops():
    """The same-answers corpus (test_same_answers runs it at the default rate, where its
    small plans are mostly inside the exact first calls) with N = 2: half the calls
    sampled, heavy calls from 16 descendant calls, parallel workers, triggers, an async
    Foreign Scan.  TIMING modes must report the rows and loops of the build's own
    rows-only path (vanilla's code there, compared with vanilla by test_same_answers),
    and non-negative times."""
    from profkit.pg import corpus

    with Cluster(get_build("sampled_timing"), name="test-sampled-corpus") as cl, \
            cl.connect() as conn:
        corpus.load(conn)
        conn.execute("SET explain_timing_sample_rate = 2")
        rows = corpus.plan_rows(conn, modes=["rows", "timing", "timing_buffers"])
        times = corpus.all_times(conn)
    ref = rows[rows["mode"] == "rows"]
    assert corpus.missing_node_types(ref) == []
    for mode in ("timing", "timing_buffers"):
        got = rows[rows["mode"] == mode].assign(mode="rows")
        diff = corpus.compare(ref, got)
        assert diff.empty, f"{mode} at rate 2:\n{diff.to_string()}"
        nodes = rows[(rows["mode"] == mode) & (rows["loops"].fillna(0) > 0)
                     & ~rows["node_type"].str.startswith("Trigger ")]  # triggers: no node time
        t = nodes["total_time_ms"]
        assert t.notna().all() and (t >= 0).all()
    executed = times[times["loops"].fillna(0) > 0]
    assert executed["total_ms"].notna().all() and (executed["total_ms"] >= 0).all()
    assert (executed["startup_ms"] >= 0).all()
    # sampling at N = 2 still times the big nodes: the corpus's Seq Scan over 10,000 rows
    seq = rows[(rows["mode"] == "timing") & (rows["query"] == "seqscan")
               & (rows["node_type"] == "Seq Scan")]
    assert (seq["total_time_ms"] > 0).all()


# ---------------------------------------------------------------------------
# the estimator, through the probe

PROBE_C = Path(__file__).resolve().parent / "c" / "sampled_timing_probe.c"
BIAS_CSV = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / \
    "sampled_timing_bias.csv"


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """A connection to a sampled_timing cluster with sampled_timing_probe() created."""
    build = get_build("sampled_timing")
    # in a folder the server (its own user) can read: pytest's tmp folders are mode 700
    so = _calib_script().compile_probe(build)
    with Cluster(build, name="test-sampled-probe") as cl, cl.connect() as conn:
        _calib_script().create_probe(conn, so)
        conn.execute("SET client_min_messages = debug1")
        notices: list[str] = []
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        conn.execute("SELECT sampled_timing_probe('leaf', 1, 0, 0)")  # calibrates
        conn.execute("RESET client_min_messages")
        calib = [m for m in notices if m.startswith("sampled timing:")]
        assert len(calib) == 1, notices
        yield conn, calib[0]
    shutil.rmtree(so.parent, ignore_errors=True)


def _run(conn, mode: str, calls: int, inner: int, work: int) -> list[float]:
    return list(conn.execute("SELECT sampled_timing_probe(%s, %s, %s, %s)",
                             (mode, calls, inner, work)).fetchone()[0])


def _calib_script():
    """benchmarks/sampled_timing_calibration.py: the probe's compilation and the
    calibration line's parser, shared with the benchmark."""
    return benchmark_module("sampled_timing_calibration")


def _residual_script():
    """benchmarks/sampled_timing_residual.py: the rounds, the residual and its bounds,
    shared with the benchmark that measures how they read on this VM."""
    return benchmark_module("sampled_timing_residual")


def _calibrated(msg: str) -> dict[str, float]:
    # "sampled timing: subtracting R ns per clock read, U ns per sampled call,
    #  X ns more per timed call, O ns of a timed call's own (calibrated in T us)"
    c = _calib_script().parse_calibration(msg)
    assert c is not None and math.isfinite(c["took_us"]), msg
    return c


def test_calibration_is_logged_and_plausible(probe):
    _, msg = probe
    c = _calibrated(msg)
    # what a read, a sampled call and a timed call's own interval hold: a few ns to a
    # few tens of ns on any x86 machine; all non-negative by construction
    assert 0 < c["read"] < 200 and 0 <= c["call"] < 100 and 0 <= c["timed"] < 500, c
    assert 0 <= c["own"] < 200, c


def test_costs_are_calibrated_again_when_older_than_10_ms(probe):
    """The costs are measured in ns at one moment and this VM's speed drifts, so they are
    redone at a sampled node's set-up once they are older than 10 ms: every probe call
    after a pause calibrates once (its parent's set-up), and its child's set-up a few µs
    later does not; the calibration's duration is logged with it."""
    conn, _ = probe
    seen: list[str] = []
    conn.add_notice_handler(lambda d: seen.append(d.message_primary))
    conn.execute("SET client_min_messages = debug1")
    try:
        for _ in range(3):
            time.sleep(0.05)
            before = len(seen)
            conn.execute("SELECT sampled_timing_probe('timed', 1, 10, 0)")
            calib = [m for m in seen[before:] if m.startswith("sampled timing:")]
            assert len(calib) == 1, seen[before:]
            c = _calibrated(calib[0])
            # 9 blocks of 200 repetitions of 6 loops: 453-714 µs measured here
            assert 20 < c["took_us"] < 50_000, c
    finally:
        conn.execute("RESET client_min_messages")


def test_negative_contributions_are_kept(probe):
    """Calls with nothing between their start and their stop: the duration minus the
    calibrated cost of the instrumentation scatters around 0, and the negative ones are
    added as they are (a floor at 0 would make every contribution >= 0 and the sum
    biased upwards)."""
    conn, _ = probe
    # empty calls: what is subtracted is what such a call's interval holds, to a few ns
    # (measured here: medians of -6 to +13 ns over 30 runs, so they rarely go below 0 by
    # themselves; the shifted calls below are 1,000 ns off).  Each run calibrates anew
    # (the costs are older than 10 ms), and one calibration in ~15 lands in the other
    # speed state of this VM than its run (a median of +25 ns was seen): the median of
    # 3 runs, interleaved with the shifted ones
    empties, shifted = [], []
    for _ in range(3):
        empties.append(statistics.median(_run(conn, "leaf", 20_000, 0, 0)))
        time.sleep(0.02)
        # the same calls with their start moved 1,000 ns later: each contribution is the
        # empty call's minus 1,000 ns, negative, and added as it is (a floor would add 0)
        d = _run(conn, "shifted", 5_000, 0, 1000)
        # all but the calls a preemption or an interrupt lands in (tens of µs, a handful
        # of 5,000 on this VM) are negative, and none was raised to 0
        assert sum(x < 0 for x in d) >= 0.99 * len(d), sorted(d)[-20:]
        assert 0 not in d
        shifted.append(statistics.median(d))
        time.sleep(0.02)
    empty = statistics.median(empties)
    assert abs(empty) < 20, empties
    med = statistics.median(shifted)
    assert abs(med - (empty - 1000)) < 20, (shifted, empties)


def test_childrens_bookkeeping_is_not_in_the_parents_time(probe):
    """A parent timed exactly over 1,000 calls of a child: whether the child is sampled
    and never timed, sampled and timed on every call, or only counts rows (TIMING FALSE),
    the parent's estimate is the same within a few ns per child call — the sampler's
    per-call cost is taken out of its ancestors' windows (left in, it put the parent
    ~5 ns per child call high, +14 to +19 % on nodes above 1 ms).  A probe call
    calibrates anew when the costs are older than 10 ms, so what is left is held to the
    costs calibrated during these runs (their median), not to one calibration before.
    The child's work is the calibration's (4 dependent multiplies): the costs are
    calibrated around it.  With twice that work, 10 runs here left an untimed call -2.9
    to +0.5 ns (median -1.4), against -2.5 to +1.0 (median -0.4) in 10 runs with the
    calibration's work: what longer work hides of the sampler's cost is still subtracted.

    This VM switches between a fast speed and a slow one within milliseconds (the
    rows-only child 8.93 ns per call at the 5th percentile of 12,960 rounds, 13.60 at the
    median; a sampled call calibrated at 2.81 and 5.91 ns), so each round runs the three
    modes back to back and the residual is the median of the rounds' own differences,
    over 27 rounds (~8 calibrations).  The
    difference of the modes' medians over 9 rounds, as this test read it before, put a
    slow median against a fast one now and then: a whole-suite run failed on rows-only
    14.3 against untimed 9.0 ns.  benchmarks/sampled_timing_residual.py measures both
    readings against these bounds (results/sampled_timing_residual-20261206.txt).
    Below 0 an untimed call may also go by what the run's median calibration exceeds
    its lowest by: one calibrated in the slow speed is subtracted from fast calls for
    10 ms (a make test left -2.29 ns against a symmetric bound of 2.23; untimed_bounds)."""
    conn, _ = probe
    res = _residual_script()
    seen: list[str] = []

    def keep(d) -> None:
        seen.append(d.message_primary)

    conn.add_notice_handler(keep)
    conn.execute("SET client_min_messages = debug1")
    try:
        rounds = res.run_rounds(conn)
    finally:
        conn.execute("RESET client_min_messages")
        conn.remove_notice_handler(keep)
    calibs = [_calibrated(m) for m in seen if m.startswith("sampled timing:")]
    # the first sampled run calibrates (the probe fixture's costs are older than 10 ms);
    # a later one does when the last calibration is older than 10 ms
    assert len(calibs) >= 2, seen
    assert len(rounds) == res.ROUNDS
    c = res.costs(calibs)
    assert all(r["rows"] > 0 for r in rounds), rounds
    untimed = res.residual(rounds, "untimed")
    timed = res.residual(rounds, "timed")
    per_call = {m: statistics.median(r[m] for r in rounds) for m in res.MODES}
    calls = sorted(k["call"] for k in calibs)
    print(f"per child call, ns (medians): {per_call}; left: untimed {untimed:+.2f}, "
          f"timed {timed:+.2f}; calibrated (median of {len(calibs)}): {c}; a sampled "
          f"call calibrated {calls[0]:.2f} to {calls[-1]:.2f}")
    # what is left of the sampler's cost per child call, against what it was before
    # subtraction (c["call"] for an untimed call, c["call"] + 2 reads + c["timed"] timed);
    # below 0 also by what the calibrations of the VM's two speeds differ (untimed_bounds)
    lo, hi = res.untimed_bounds(calibs)
    assert lo < untimed < hi, (untimed, (lo, hi), per_call, c, calls)
    assert abs(timed) < res.timed_bound(c), (timed, per_call, c)


def test_the_untimed_bounds_separate_the_bug_from_the_two_speeds():
    """The rule the test above applies, on figures measured here: the make test run that
    left -2.29 ns (its calibrations' median 4.46 ns; the backend's first, before the
    rounds, 2.71 ns; the others, not logged, are made up around those two: it is
    within the rule if any was below 4.40 ns) is within it; an untimed call's cost left
    in its parent (the bug: +1 cost) and one taken out twice in a run of one speed are
    not."""
    res = _residual_script()

    def cal(call: float) -> dict[str, float]:
        return {"call": call, "read": 20.09, "timed": 15.66}

    two_speeds = [cal(x) for x in (2.71, 2.75, 4.46, 5.91, 6.02)]
    lo, hi = res.untimed_bounds(two_speeds)
    assert (lo, hi) == pytest.approx((-(2.23 + 4.46 - 2.71), 2.23))
    assert lo < -2.287 < hi
    assert not lo < 4.46 < hi           # the cost left in: too high at any speed
    # one speed, one calibration slowed by an interrupt: the bounds stay tight
    one_speed = [cal(x) for x in (2.20, 2.21, 2.21, 2.71, 6.60)]
    lo, hi = res.untimed_bounds(one_speed)
    assert (lo, hi) == pytest.approx((-1.51, 1.5))
    assert not lo < 2.21 < hi           # left in
    assert not lo < -2.21 < hi          # taken out twice
    assert lo < -1.2 < hi               # what 27 rounds left in most backends


def _bias_rows(workload: str) -> pd.DataFrame:
    """sampled_timing's committed rows for *workload*'s nodes against the TSC yardstick
    minus its own clock reads (times inclusive: the CSV holds inclusive times)."""
    b = pd.read_csv(BIAS_CSV)
    b = b[(b["arm"] == "sampled_timing") & (b["yardstick"] == "corrected:tsc_clock")
          & (b["workload"] == workload)]
    assert not b.empty, f"{BIAS_CSV} has no sampled_timing row for {workload}"
    return b


def _measured_bound(b: pd.DataFrame) -> float:
    """The largest |95 % interval bound| of the committed rows *b*."""
    return float(max(b["ci_high_pct"].abs().max(), b["ci_low_pct"].abs().max()))


def test_dominant_node_within_the_measured_bound():
    """count_star: an Aggregate (2 calls, timed exactly) over a Seq Scan that is almost
    all of the query.  At rate 100 the root's estimate is the execution's time without
    TIMING's clock reads: against the same query under TIMING FALSE (Execution Time, no
    per-node clock at all) it must be within the committed bias bound of count_star's
    nodes, plus this run's own noise allowance (10 pp, a loaded 2-vCPU machine).  The Seq
    Scan's share of the root is held to the committed yardstick's share (TSC minus its
    clock reads: 53.7 of 82.0 ms, 0.655) within the same bound.  Not to a fixed floor:
    the Seq Scan's estimate moves from run to run (a ~55 ns row from which a calibrated
    ~30-50 ns cost is subtracted per sampled call), and floors of 0.6, then 0.5 failed on
    medians of 0.598 (beside a compile) and 0.49 (a whole-suite run, shares 0.46 to 0.63).
    Nor loosened when it failed the other way: with each sampled call timed alone, the
    share read 0.83-0.93 here, half the runs and CI above the bound, where perf's samples
    give 0.64-0.69; that was the cold timed path's cost multiplied by N, and bursts fixed
    it (benchmarks/sampled_timing_rates.py, docs/variants.md).

    With bursts one execution's share still ranges 0.54-1.00 here, and the estimate is
    high: 45 executions in 5 backends had a median of 0.756 (+15 % over the
    yardstick), backends' medians 0.705-0.809 (benchmarks/sampled_timing_spread.py,
    benchmarks/results/sampled_timing_spread.txt).  A median of 7 executions of one
    backend crossed the bound in a whole-suite run (0.846 against 0.845; that script's
    medians of 7 ranged 0.669-0.818).  So the median is taken over 21 executions in 3
    fresh backends (each calibrates its own costs), with the same bound; the bias itself
    is open (docs/variants.md)."""
    wl = get_workload("count_star")
    committed = _bias_rows("count_star")
    bound = _measured_bound(committed) + 10.0
    ratios, shares = [], []
    with Cluster(get_build("sampled_timing"), name="test-sampled-dominant") as cl:
        with cl.connect() as conn:
            wl.load(conn, 0.1)
        for _ in range(3):
            with cl.connect() as conn:
                for _ in range(2):  # warm the cache and the calibration
                    conn.execute(wl.query("analyze_timing", fmt="json")).fetchone()
                for _ in range(7):
                    t = ta.node_times(conn.execute(wl.query("analyze_timing", fmt="json"))
                                      .fetchone()[0])
                    f = ta.node_times(conn.execute(wl.query("analyze_notiming", fmt="json"))
                                      .fetchone()[0])
                    root, seq = t["inclusive_ms"].iloc[0], t["inclusive_ms"].iloc[1]
                    ratios.append(root / f.attrs["execution_ms"])
                    shares.append(seq / root)
    r = statistics.median(ratios)
    assert abs(r - 1.0) * 100 <= bound, (ratios, bound)
    yard = dict(zip(committed["node_id"].astype(int), committed["yard_mean_ms"], strict=True))
    share = statistics.median(shares)
    assert abs(share / (yard[1] / yard[0]) - 1.0) * 100 <= bound, (shares, yard, bound)
