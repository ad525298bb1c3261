"""The vCPU's speed around each execution (issue 13, item 5): the rejection rule and the
normalisation on synthetic timings whose answer is known, and the real helper and /proc
counters on this machine."""
from __future__ import annotations

import mmap
import os
import time

import numpy as np
import pandas as pd
import pytest
from conftest import benchmark_module
from proc_helpers import alive

from profkit.analyze import stats
from profkit.collect import vcpu
from profkit.errors import ComparisonError

pytestmark = pytest.mark.alone  # asserts times measured here: make test runs it alone

TRUE_Q2 = 10.0  # % overhead of Query-2 in the synthetic runs
SLOW = 1.8      # how much slower the vCPU runs in a burst (the bimodal plain times)


def slow_vcpu_timings(reps: int = 30, seed: int = 3, slow_rows: int = 12) -> pd.DataFrame:
    """Interleaved plain / Query-2 executions of one build; *slow_rows* random executions
    ran on a vCPU 1.8x slower (CPU time and both calibrations 1.8x longer).

    Noise: 0.5 % on the CPU time, 1 % on each calibration (this VM's calibration jitter).
    """
    rng = np.random.default_rng(seed)
    rows = []
    slow = set(rng.choice(reps * 2, size=slow_rows, replace=False).tolist())
    order = 0
    for rep in range(reps):
        for mode, ov in (("plain", 0.0), ("analyze_notiming", TRUE_Q2)):
            f = SLOW if order in slow else 1.0
            cpu = 300.0 * (1 + ov / 100) * (1 + rng.normal(0, 0.005)) * f
            rows.append({"run_id": "r", "build": "vanilla", "workload": "nested_loop",
                         "query": mode, "mode": mode, "rep": rep, "order": order,
                         "client_ms": cpu + 1, "server_ms": cpu, "cpu_ms": cpu,
                         "calib_before_ms": 3.0 * f * (1 + rng.normal(0, 0.01)),
                         "calib_after_ms": 3.0 * f * (1 + rng.normal(0, 0.01))})
            order += 1
    return pd.DataFrame(rows)


def test_rejection_rule_finds_exactly_the_slow_executions():
    t = slow_vcpu_timings()
    adj, info = stats.vcpu_adjust(t)
    truly_slow = t["calib_before_ms"] > 4.0  # 1.8x vs 1 % noise: no overlap
    assert truly_slow.sum() == 12
    assert (adj["calib_slow"] == truly_slow).all()
    assert info.rejected == 12 and info.n == 60 and info.n_calibrations == 120
    assert info.slow_calibrations == 24
    # the threshold comes from the run's own calibrations: median + 3.5 x 1.4826 x MAD
    allc = np.concatenate([t["calib_before_ms"], t["calib_after_ms"]])
    med = np.median(allc)
    mad = np.median(np.abs(allc - med))
    assert info.reference_ms == pytest.approx(med)
    assert info.threshold_ms == pytest.approx(max(med + 3.5 * 1.4826 * mad, med * 1.03))
    assert 3.0 < info.reference_ms < 3.1 and info.threshold_ms < 3.5
    assert info.slow_factor_median == pytest.approx(SLOW, rel=0.03)
    assert adj["cpu_kept_ms"].isna().sum() == 12
    assert "12 of 60 executions rejected" in info.describe()


def test_robust_estimates_recover_the_true_overhead_where_cpu_time_does_not():
    # 18 of 60 executions slow (the issue saw 4 of 15 plain ones), seeded
    t = slow_vcpu_timings(slow_rows=18, seed=3)
    raw = stats.summarize_metric(t, "cpu_ms").set_index("mode").loc["analyze_notiming"]
    kept = stats.summarize_metric(t, "cpu_kept_ms").set_index("mode").loc["analyze_notiming"]
    norm = stats.summarize_metric(t, "cpu_norm_ms").set_index("mode").loc["analyze_notiming"]
    # the slow bursts hit plain and Query-2 of a repetition separately: per-repetition
    # overheads swing by -44 / +98 %: the CI is ~25 pp wide, the mean far off
    assert raw.ci_high_pct - raw.ci_low_pct > 20.0
    assert abs(raw.overhead_mean_pct - TRUE_Q2) > 10.0
    # rejected: pairs on the repetitions where neither ran slow
    assert kept.paired and kept.n == 30 - int(
        stats.vcpu_adjust(t)[0].query("mode == 'analyze_notiming'")["calib_slow"].sum())
    assert kept.n == 24
    assert kept.overhead_pct == pytest.approx(TRUE_Q2, abs=0.75)
    assert kept.ci_low_pct < TRUE_Q2 < kept.ci_high_pct
    assert kept.ci_high_pct - kept.ci_low_pct < 1.5
    assert abs(kept.overhead_mean_pct - TRUE_Q2) < 0.5
    # normalised: every execution kept, the 1.8x taken out (calibration noise remains)
    assert norm.n == 30
    assert norm.overhead_pct == pytest.approx(TRUE_Q2, abs=1.0)
    assert norm.ci_high_pct - norm.ci_low_pct < raw.ci_high_pct - raw.ci_low_pct
    # the lower quartile beside the median: slow bursts only add time
    assert kept.overhead_q25_pct == pytest.approx(TRUE_Q2, abs=1.0)


def test_normalisation_divides_by_the_speed_factor():
    t = slow_vcpu_timings()
    adj, info = stats.vcpu_adjust(t)
    f = (t["calib_before_ms"] + t["calib_after_ms"]) / 2 / info.reference_ms
    assert np.allclose(adj["cpu_norm_ms"], t["cpu_ms"] / f)
    slow = adj[adj["calib_slow"]]
    assert slow["speed_factor"].between(1.7, 1.9).all()
    # slow executions come back to the usual speed's CPU time (±3 %)
    plain = slow[slow["mode"] == "plain"]["cpu_norm_ms"]
    assert ((plain / 300.0 - 1).abs() < 0.03).all()


def test_threshold_floor_when_calibrations_do_not_vary():
    t = slow_vcpu_timings(reps=4, slow_rows=0)
    t["calib_before_ms"] = 3.0
    t["calib_after_ms"] = 3.0
    t.loc[0, "calib_after_ms"] = 3.06    # +2 %: the same speed
    t.loc[1, "calib_before_ms"] = 3.15   # +5 %: slow
    adj, info = stats.vcpu_adjust(t)
    assert info.mad_ms == 0 and info.threshold_ms == pytest.approx(3.09)
    assert adj["calib_slow"].tolist() == [False, True] + [False] * 6


def test_runs_without_calibration_keep_cpu_ms():
    t = slow_vcpu_timings().drop(columns=["calib_before_ms", "calib_after_ms"])
    assert not stats.has_calibration(t)
    assert stats.default_metric(t) == "cpu_ms"
    assert stats.default_metric(slow_vcpu_timings()) == "cpu_kept_ms"
    with pytest.raises(ComparisonError, match="needs the vCPU calibration columns"):
        stats.summarize_metric(t, "cpu_kept_ms")
    adj, info = stats.vcpu_adjust(t)
    assert info.n == 0 and adj["cpu_norm_ms"].isna().all()
    assert info.describe() == "no vCPU calibrations recorded"


def test_pair_common_drops_unpaired_repetitions_only():
    t = slow_vcpu_timings(slow_rows=0)
    t = t[~((t["rep"] == 3) & (t["mode"] == "plain"))]
    auto = stats.summarize(t, "server_ms").set_index("mode").loc["analyze_notiming"]
    common = stats.summarize(t, "server_ms", pair="common").set_index("mode").loc[
        "analyze_notiming"]
    assert not auto.paired and common.paired
    assert common.overhead_pct == pytest.approx(TRUE_Q2, abs=0.5)


# --------------------------------------------------------------------------- real


def test_probe_measures_on_the_pinned_cpu_and_stops():
    cpu = max(os.sched_getaffinity(0))
    with vcpu.VcpuProbe(cpu) as p:
        pid = p.proc.pid
        cs = [p.calibrate() for _ in range(5)]
        assert alive(pid)
    assert not alive(pid), "the helper is stopped by pid when the block ends"
    assert all(c.cpu == cpu for c in cs)
    for c in cs:
        # ~3 ms here; a 20x slower vCPU would still be under 100 ms
        assert 0.2 < c.cpu_ms < 100 and c.cpu_ms <= c.wall_ms + 0.05
    with pytest.raises(vcpu.VcpuError, match="not running"):
        p.calibrate()


def test_a_calibration_after_the_caches_were_filled_is_not_slower():
    """The measured backend runs on the calibration's CPU between the two calibrations and
    fills its caches, and the CPU idles while the client reads the result; the calibration
    must not pay for reloading its table (it did: 3-6 % slower after a TIMING-on execution,
    which then counted as a slow vCPU).  Here this process, pinned to that CPU, streams
    16 MB and sleeps 20 ms between the two: the median ratio was 1.07-1.09 with the helper
    before its untimed pass, 0.996-1.008 with it (four rounds of 21 each).  On an AMD EPYC
    host it was 1.041 and 1.053 in two make test runs while the pass held one unit of the
    walk; it holds half the timed walk now (profkit/collect/vcpu_calib.c).

    101 rounds, not 21: there a median of 21 ranged 0.961-1.024 over 8 repeats with the
    helper as it is, and 1.036 failed one make test; a median of 101 ranged 1.004-1.011
    (one unit: 1.028-1.045; benchmarks/results/vcpu_idle_gap-20261206.txt).  1.03 is the
    slow-vCPU rule's floor: a gap that large would reject executions for the gap alone."""
    cpu = max(os.sched_getaffinity(0))
    keep = os.sched_getaffinity(0)
    gap_round = benchmark_module("vcpu_idle_gap").gap_round  # the benchmark's procedure
    big = np.ones(2 * 1024 * 1024)  # 16 MB
    try:
        os.sched_setaffinity(0, {cpu})
        with vcpu.VcpuProbe(cpu) as p:
            ratios = [gap_round(p, big) for _ in range(101)]
    finally:
        os.sched_setaffinity(0, keep)
    r = sorted(round(x, 3) for x in ratios)
    assert float(np.median(ratios)) < 1.03, (r[:5], r[45:56], r[-5:])


def test_proc_counters_of_a_real_process():
    pid = os.getpid()
    a = vcpu.proc_counters(pid)
    for k in ("minflt", "majflt", "vol_cs", "invol_cs", "migrations", "last_cpu", "steal_ms"):
        assert k in a, k
    assert any(k.startswith("steal_ms_cpu") for k in a)
    time.sleep(0.01)  # a voluntary switch
    buf = mmap.mmap(-1, 8 << 20)  # fresh anonymous pages, touched: minor faults
    for off in range(0, len(buf), 4096):
        buf[off] = 1
    b = vcpu.proc_counters(pid)
    buf.close()
    d = vcpu.counter_deltas(a, b, int(b["last_cpu"]))
    # >= 4: one per page, or per 2 MiB huge page where transparent huge pages back it
    assert d["vol_cs"] >= 1 and d["minflt"] >= 4
    assert d["steal_ms"] >= 0 and d["steal_cpu_ms"] >= 0 and d["migrations"] >= 0
    assert d["last_cpu"] in os.sched_getaffinity(0)
    assert set(d) == set(vcpu.DELTA_COLUMNS)
