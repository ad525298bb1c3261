"""Every front door validates its arguments before any build or download.

Each check runs with an empty PROFKIT_CACHE: a bad workload, scale (0, negative,
NaN, infinite), repetition count or mode must fail in well under a second, and the
cache must still hold no build and no source afterwards.
"""
from __future__ import annotations

import math
import time

import pytest
from click.testing import CliRunner

from profkit.errors import ProfkitError


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("PROFKIT_CACHE", str(cache))
    monkeypatch.setenv("PROFKIT_PROFILES", str(tmp_path / "profiles"))
    monkeypatch.setenv("PROFKIT_FLAMEGRAPHS", str(tmp_path / "fg"))
    yield cache
    # nothing expensive started: no build tree, no source, no download
    for sub in ("builds", "sources", "downloads", "apt"):
        d = cache / sub
        assert not d.exists() or not any(d.iterdir()), f"{d} was populated"


BAD_SCALES = ["inf", "-inf", "nan", "0", "-1", "abc"]


@pytest.mark.parametrize("scale", BAD_SCALES)
def test_check_args_refuses_bad_scales(scale):
    from profkit.pg.workloads import WorkloadError, check_args

    value = float(scale) if scale != "abc" else scale
    with pytest.raises(WorkloadError, match="scale must be a number > 0"):
        check_args("nested_loop", scale=value)


def test_check_args_other_fields():
    from profkit.pg.workloads import WorkloadError, check_args, get_workload

    assert check_args("join_sum", scale=0.5, reps=3, mode="plain") is get_workload("join_sum")
    assert check_args(None) is None
    with pytest.raises(WorkloadError, match="unknown workload 'nope'"):
        check_args("nope", scale=1)
    for reps in (0, -3, 1.5, True):
        with pytest.raises(WorkloadError, match="reps must be an integer >= 1"):
            check_args("join_sum", reps=reps)
    with pytest.raises(WorkloadError, match="unknown mode 'fast'"):
        check_args("join_sum", mode="fast")
    with pytest.raises(WorkloadError, match="unknown mode 'x'"):
        check_args("join_sum", modes=["plain", "x"])


CLI_CASES = [
    (["perf", "vanilla", "--scale", "inf"], "scale must be a number > 0"),
    (["perf", "vanilla", "--scale", "nan"], "scale must be a number > 0"),
    (["perf", "vanilla", "--workload", "nope"], "unknown workload 'nope'"),
    (["perf", "vanilla", "--reps", "0"], "reps must be an integer >= 1"),
    (["gprof", "vanilla", "--scale", "inf"], "scale must be a number > 0"),
    (["gprof", "vanilla", "--reps", "0"], "reps must be an integer >= 1"),
    (["observers", "join_sum", "--scale", "inf"], "scale must be a number > 0"),
    (["observers", "nope"], "unknown workload 'nope'"),
    (["observers", "--reps", "0"], "reps must be an integer >= 1"),
    (["correction", "--workload", "join_sum=inf"], "scale must be a number > 0"),
    (["correction", "--workload", "nope=0.1"], "unknown workload 'nope'"),
    (["correction", "--reps", "0"], "reps must be an integer >= 1"),
    (["bench", "--builds", "vanilla", "--scale", "inf"], "scale must be a number > 0"),
    (["bench", "--builds", "vanilla", "--reps", "0"], "reps"),
    (["load", "nested_loop", "--cluster", "x", "--scale", "nan"], "scale must be a number > 0"),
]


@pytest.mark.parametrize(("argv", "message"), CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_cli_refuses_before_building(empty_cache, argv, message):
    from profkit.cli import main

    t0 = time.monotonic()
    res = CliRunner().invoke(main, argv)
    assert res.exit_code != 0
    assert message in res.output, res.output
    assert "Traceback" not in res.output
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("line", [
    "--scale inf --workload nested_loop",
    "--scale nan",
    "--workload nope",
    "--reps 0",
    "--build nonesuch",
    "--mode fast",
])
def test_magic_refuses_before_building(empty_cache, line):
    from profkit import magics

    with pytest.raises((ProfkitError, magics.MagicUsageError, SystemExit)):
        magics.run_cell(line, "SELECT 1", registry=magics.ClusterRegistry())


def test_magic_cell_without_sql_is_refused_before_building(empty_cache):
    from profkit import magics

    with pytest.raises(magics.MagicUsageError, match="the cell has no SQL"):
        magics.run_cell("", "-- nothing\n", registry=magics.ClusterRegistry())


@pytest.mark.parametrize("scale", [math.inf, math.nan, 0.0])
def test_library_entry_points_refuse_before_building(empty_cache, scale):
    from profkit import bench
    from profkit.collect import gprof, perf
    from profkit.timing_variants import run_timing_accuracy

    with pytest.raises(ProfkitError, match="scale must be a number > 0"):
        perf.profile_workload("vanilla", "nested_loop", scale=scale)
    with pytest.raises(ProfkitError, match="scale must be a number > 0"):
        gprof.profile_workload("gprof", "nested_loop", scale=scale)
    with pytest.raises(ProfkitError, match="scale must be a number > 0"):
        bench.run_bench("vanilla", "nested_loop", scale=scale, progress=None)
    with pytest.raises(ProfkitError, match="scale must be a number > 0"):
        run_timing_accuracy(["vanilla", "tsc_clock"], {"join_sum": scale})
