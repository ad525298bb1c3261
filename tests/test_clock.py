"""Clock cost: the compiled helper on this machine, pg_test_timing output, clock source facts."""
from __future__ import annotations

from pathlib import Path

import pytest

from profkit import tables
from profkit.collect import clock
from profkit.errors import ParseError, ProbeError, ToolNotFound

pytestmark = pytest.mark.alone  # asserts times measured here: make test runs it alone

FIX = Path(__file__).parent / "fixtures" / "clock"


def test_helper_measures_every_source_here():
    df = clock.measure_clocks(loops=200_000, repeats=2, run_id="t")
    tables.validate(df, "clock_cost")
    expected = set(clock.POSIX_SOURCES) | (set(clock.TSC_SOURCES) if clock.is_x86() else set())
    assert set(df["source"]) == expected
    assert df.attrs["skipped"] == ([] if clock.is_x86() else list(clock.TSC_SOURCES))
    for r in df.itertuples():
        # a clock read costs more than nothing and less than a slow syscall
        assert 0.5 < r.ns_per_call < 20_000, r
        assert r.ns_per_call_min <= r.ns_per_call <= r.ns_per_call_max
        assert sum(r.histogram.values()) == 200_000 * 2
        assert r.backwards == 0 or r.source.startswith(("rdtsc", "lfence"))
    by = df.set_index("source")["ns_per_call"]
    # the coarse clock only reads a jiffy-updated variable: cheaper than the full read
    # (generous factor: other work shares these 2 cores)
    assert by["clock_monotonic_coarse"] < by["clock_monotonic"] * 1.5
    coarse_hist = df.set_index("source").loc["clock_monotonic_coarse", "histogram"]
    # jiffy resolution: almost all successive reads see the same value
    assert coarse_hist.get(0, 0) / sum(coarse_hist.values()) > 0.9
    if clock.is_x86():
        assert df.set_index("source").loc["rdtsc", "tsc_hz"] > 1e8
    long = clock.histogram_long(df)
    tables.validate(long, "clock_histogram")
    assert long.groupby("source")["share"].sum().round(9).eq(1.0).all()


def test_helper_is_cached_by_source_hash():
    p1 = clock.build_helper()
    assert p1.exists() and p1 == clock.helper_path()
    mtime = p1.stat().st_mtime_ns
    assert clock.build_helper().stat().st_mtime_ns == mtime


def test_unknown_source_and_bad_args():
    with pytest.raises(ProbeError, match="unknown clock source 'sundial'"):
        clock.measure_source("sundial")
    with pytest.raises(ProbeError, match="positive"):
        clock.measure_clocks(loops=0)


def test_parse_clock_bench_output():
    text = ("source rdtsc\nloops 1000\nelapsed_ns 9530\nns_per_call 9.530\n"
            "loop_elapsed_ns 11149\nns_per_loop 11.149\nbackwards 0\ntsc_hz 2596134814\n"
            "hist 0 58\nhist 16 900\nhist 32 42\n")
    m = clock.parse_clock_bench(text)
    assert m.source == "rdtsc" and m.loops == 1000
    assert m.ns_per_call == 9.53 and m.ns_per_loop == 11.149
    assert m.tsc_hz == 2596134814.0
    assert m.histogram == ((0, 58), (16, 900), (32, 42))
    with pytest.raises(ParseError, match="lacks"):
        clock.parse_clock_bench("")
    with pytest.raises(ParseError, match="bad histogram"):
        clock.parse_clock_bench(text + "hist 64\n")


def test_clock_info_reads_sysfs_and_cpuinfo(tmp_path):
    info = clock.clock_info()
    assert info.current_clocksource in info.available_clocksources or \
        info.current_clocksource == "unknown"
    # a Xen guest without an invariant TSC, from fake files
    sysfs = tmp_path / "cs"
    sysfs.mkdir()
    (sysfs / "current_clocksource").write_text("xen\n")
    (sysfs / "available_clocksource").write_text("xen tsc hpet acpi_pm \n")
    cpu = tmp_path / "cpuinfo"
    cpu.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) CPU E5-2686 v4\n"
                   "flags\t\t: fpu tsc constant_tsc rdtscp\n\nprocessor\t: 1\n")
    fake = clock.clock_info(sysfs, cpu)
    assert fake.current_clocksource == "xen"
    assert fake.available_clocksources == ("xen", "tsc", "hpet", "acpi_pm")
    assert fake.cpu_model.startswith("Intel(R) Xeon")
    assert fake.constant_tsc and not fake.nonstop_tsc and not fake.invariant_tsc
    assert fake.as_dict()["invariant_tsc"] is False


def test_parse_pg_test_timing_fixture():
    # recorded with the vanilla build's `pg_test_timing -d 1` on this machine
    r = clock.parse_pg_test_timing((FIX / "pg_test_timing.txt").read_text())
    assert r.duration_s == 1
    assert r.per_loop_ns == 65.18
    assert len(r.histogram) == 18
    assert r.histogram[0] == (1, 97.38339, 15136009)
    assert r.histogram[-1] == (131072, 0.00001, 1)
    df = clock.pg_test_timing_cost(r, run_id="x")
    tables.validate(df, "clock_cost")
    row = df.iloc[0]
    assert row["source"] == "pg_test_timing" and row["ns_per_call"] == 65.18
    assert row["histogram"][1000] == 15136009
    assert row["loops"] == sum(c for _, _, c in r.histogram)


def test_parse_pg_test_timing_locale_and_bad_input():
    # the article's output: a comma decimal separator (LC_NUMERIC=de_DE)
    text = ("Testing timing overhead for 3 seconds.\n"
            "Per loop time including overhead: 4620,82 ns\n"
            "Histogram of timing durations:\n"
            "  < us   % of total      count\n"
            "     1      0,00000          0\n"
            "     8     99,85491     648295\n")
    r = clock.parse_pg_test_timing(text)
    assert (r.duration_s, r.per_loop_ns) == (3, 4620.82)
    assert r.histogram[1] == (8, 99.85491, 648295)
    with pytest.raises(ParseError, match="printed nothing"):
        clock.parse_pg_test_timing("")
    with pytest.raises(ParseError, match="truncated"):
        clock.parse_pg_test_timing(text.split("Histogram")[0])
    with pytest.raises(ParseError, match="Per loop"):
        clock.parse_pg_test_timing("Testing timing overhead for 3 seconds.\n")


@pytest.mark.pg
def test_run_pg_test_timing_of_build(vanilla_build, tmp_path):
    out = clock.run_pg_test_timing(vanilla_build.bindir, duration=1)
    r = clock.parse_pg_test_timing(out)
    assert 1 < r.per_loop_ns < 100_000
    assert abs(sum(p for _, p, _ in r.histogram) - 100.0) < 0.01
    with pytest.raises(ToolNotFound, match="pg_test_timing"):
        clock.run_pg_test_timing(tmp_path)
