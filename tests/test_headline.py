"""The headline: `make demo`'s own code path, and the committed matrix held by value.

`profkit reproduce` runs end to end at a tiny scale in a subprocess whose
environment carries make's variables (as under `make demo`) and writes the demo's files.
Then step4/step5 of both majors are counted again with callgrind (deterministic, unlike
time on this VM) on the three seed workloads and must agree with the committed headline
matrix (benchmarks/results/headline.csv) within 0.05 %: a regression fails here.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import headline_module, moved_from_committed, prefetch_counts
from conftest import kept_counts

ROOT = Path(__file__).resolve().parent.parent
STEPS = ["vanilla", "step1", "step2", "step3", "step4", "step5"]
PG19 = ["pg19/vanilla", "pg19/step3", "pg19/step5"]

pytestmark = [pytest.mark.pg, pytest.mark.builds(*STEPS)]


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory):
    base = tmp_path_factory.mktemp("reproduce")
    env = {**os.environ, "MAKELEVEL": "1", "MAKEFLAGS": "w",
           "PROFKIT_FLAMEGRAPHS": str(base / "flamegraphs")}
    cp = subprocess.run(
        [sys.executable, "-m", "profkit.cli", "reproduce", "--scale", "0.01", "--reps", "3",
         "--instr-scale", "0.005", "--seed", "7", "--out", str(base / "profiles")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
        stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    return base, cp


def _summary(base: Path) -> list[dict[str, str]]:
    latest = base / "profiles" / "latest"
    assert latest.is_symlink() and latest.resolve().is_dir()
    with open(latest / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_reproduce_writes_the_demo_files(reproduced):
    base, cp = reproduced
    run = (base / "profiles" / "latest").resolve()
    for f in ("summary.csv", "report.md", "provenance.json", "instructions.csv"):
        assert (run / f).is_file(), f
    assert list(run.glob("overheads.png")) and list(run.glob("overheads.svg"))
    rows = _summary(base)
    from profkit.analyze.stats import SUMMARY_CSV_COLUMNS

    assert list(rows[0]) == list(SUMMARY_CSV_COLUMNS)
    assert list(rows[0])[:4] == ["build", "mode", "n", "median_ms"]
    assert {"backends", "between_share_pct", "note"} <= set(rows[0])
    for r in rows:
        assert int(r["backends"]) >= 1, r
    assert {r["build"] for r in rows} == set(STEPS)
    assert {r["mode"] for r in rows} == {"plain", "analyze_notiming", "analyze_timing"}
    # n counts the executions kept: the ones whose vCPU calibration ran slow are left out
    import pandas as pd

    prov = json.loads((run / "provenance.json").read_text())
    assert prov["status"] == "complete"
    # a cell the vCPU rule left with fewer than 2 of its 3 got extra repetitions of every
    # cell (at most 3), interleaved as the others
    extra = prov["extra_repetitions"]
    assert extra["min_kept"] == 2 and 0 <= extra["extra_reps"] <= 3, extra
    t = pd.read_csv(run / "timings.csv")
    assert len(t) == len(STEPS) * 3 * (3 + extra["extra_reps"])
    assert sorted(t["rep"].unique()) == list(range(1, 4 + extra["extra_reps"]))
    kept = kept_counts(run)
    for r in rows:
        assert int(r["n"]) == kept.get((r["build"], r["mode"]), 0), r
        # none is short unless the extra repetitions ran out (then the provenance names it)
        if not extra["short_after_extra"]:
            assert 2 <= int(r["n"]) <= 3 + extra["extra_reps"], (r, extra)
        else:
            assert extra["extra_reps"] == 3, (r, extra)
    svgs = sorted(p.name for p in (base / "flamegraphs").glob("*.svg"))
    assert {"query2-vanilla.svg", "query2-step3.svg", "query2-vanilla-vs-step3.svg"} <= set(svgs)
    assert "wall time: builds" in cp.stdout + cp.stderr
    # the differential's point: the wrapper and InstrStopNode, gone in step3, are drawn
    # as cheaper (their intervals exclude 0) from the demo's 5 + 5 recordings
    (fd,) = (base / "profiles").glob("*-flamediff-vanilla-vs-step3")
    recs = pd.read_csv(fd / "recordings.csv")
    assert recs.groupby("arm").size().to_dict() == {"vanilla": 5, "step3": 5}
    d = pd.read_csv(fd / "flamediff.csv")
    fs = d[(d["key"] == "function") & (d["basis"] == "self")].set_index("frame")
    for f in ("ExecProcNodeInstr", "InstrStopNode"):
        assert fs.loc[f, "b_mean"] == 0 and fs.loc[f, "flag"] == -1, fs.loc[f].to_dict()


def test_reproduce_counts_rows_against_vanilla_of_its_major(reproduced):
    """The demo's table sets every row against vanilla's plain Query-1; its figures are
    checked against the committed matrix by the tests below (same code as the matrix,
    at the matrix's scale), not here: the demo counts at a smaller scale."""
    base, _cp = reproduced
    for r in _summary(base):
        assert r["ref_build"] == "vanilla" and r["pg_version"].startswith("18"), r
        assert r["plain_instr"] and float(r["plain_instr"]) > 0, r
    vs = {(r["build"], r["mode"]): float(r["vs_ref_instr_pct"]) for r in _summary(base)}
    plain = {r["build"]: float(r["plain_instr"]) for r in _summary(base)}
    for b in STEPS:  # each build's plain row is its plain count against vanilla's
        assert vs[(b, "plain")] == pytest.approx(
            (plain[b] - plain["vanilla"]) / plain["vanilla"] * 100, abs=5e-3), (b, vs)


# ---------------------------------------------------------------------------------------
# The headline, asserted: instruction counts are deterministic, so each cell of the
# committed matrix (benchmarks/results/headline.csv, GCC) is measured again with the code
# that wrote it and must agree within TOLERANCE_PCT.
#
# Why 0.05 %: the same binary counted on fresh clusters (vanilla 18.6, GCC; three or four
# runs per cell) agreed within 28-3,956 instructions (at most 0.0025 %, TIMING TRUE on
# join_sum; at most 0.00075 % elsewhere: EXPLAIN's text carries numbers whose digits vary,
# and the clusters' paths and pids differ), 20 times below the tolerance.  One instruction
# more per row of the hottest node is 0.16-0.23 % of the plain query at the matrix's
# scales (nested_loop 0.02: 800,000 Nested Loop rows in 355 M; join_sum 0.2: 200,000
# outer rows in 125 M; count_star 0.02: 200,000 rows in 88 M): a per-row regression of
# the kind the row-counting patches guard against fails.

TOLERANCE_PCT = 0.05
HELD = {"18": ("vanilla", "step4", "step5", "step6"),
        "19": ("vanilla", "step4", "step5", "step6")}
HELD_MODES = ("plain", "analyze_notiming", "analyze_buffers")




@pytest.fixture(scope="module")
def counted(request):
    """The matrix's cells of the selected parameters, counted two sessions at a time."""
    mod = headline_module()

    def keys(item):
        if item.originalname != "test_row_counting_holds_the_committed_headline":
            return []
        major, workload = item.callspec.params["major"], item.callspec.params["workload"]
        return [(mod.build_name(v, major, "gcc"), workload, mod.SCALES[workload], HELD_MODES)
                for v in HELD[major]]

    prefetch_counts(request, keys)


@pytest.mark.builds("step6", "pg19/vanilla", "pg19/step4", "pg19/step5", "pg19/step6")
@pytest.mark.parametrize("major", ["18", "19"])
@pytest.mark.parametrize("workload", ["nested_loop", "join_sum", "count_star"])
def test_row_counting_holds_the_committed_headline(major, workload, counted):
    mod = headline_module()
    committed = mod.read_results()
    scale = mod.SCALES[workload]
    off = []
    counts = {}
    for variant in HELD[major]:
        c = mod.measure_once(mod.build_name(variant, major, "gcc"), workload, scale, HELD_MODES)
        counts[variant] = c.instructions
        for mode, n in c.instructions.items():
            row = mod.committed(committed, compiler="gcc", major=major, build=variant,
                                workload=workload, mode=mode)
            if row is None:  # headline.NOT_YET_COUNTED: the live checks below still run
                continue
            moved = moved_from_committed(row, n, scale, f"pg{major} {variant} {workload} "
                                         f"{mode}", TOLERANCE_PCT)
            if moved:
                off.append(moved)
    assert not off, ("instruction counts moved from the committed matrix (a regression, or "
                     "rerun benchmarks/headline.py and commit its results):\n" + "\n".join(off))
    # the verdicts follow from the counts just made, not only from the file
    v1 = counts["vanilla"]["plain"]
    for variant in HELD[major][1:]:
        for mode in ("plain", "analyze_notiming", "analyze_buffers"):
            pct = (counts[variant][mode] - v1) / v1 * 100
            row = mod.committed(committed, compiler="gcc", major=major, build=variant,
                                workload=workload, mode=mode)
            if row is not None:
                assert (pct <= mod.GOALS[mode]) == (row["verdict"] == "met"), (variant, mode, pct)


@pytest.mark.builds(*PG19)
def test_reproduce_pg19_adds_the_postgresql_19_rows(tmp_path):
    """`profkit reproduce --pg19`: PostgreSQL 19 rows against pg19/vanilla's plain query
    (the source: $PROFKIT_PG19_SOURCE, set by conftest to the shared 19beta1 tarball)."""
    env = {**os.environ, "MAKELEVEL": "1", "MAKEFLAGS": "w"}
    assert env.get("PROFKIT_PG19_SOURCE", "").startswith("tarball:")
    cp = subprocess.run(
        [sys.executable, "-m", "profkit.cli", "reproduce", "--pg19", "--builds", "vanilla",
         "--scale", "0.01", "--reps", "2", "--instr-scale", "0.005", "--seed", "7",
         "--no-flamegraphs", "--out", str(tmp_path / "profiles")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
        stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    rows = _summary(tmp_path)
    assert {r["build"] for r in rows} == {"vanilla", "pg19-vanilla", "pg19-step3", "pg19-step5"}
    for r in rows:
        pg19 = r["build"].startswith("pg19-")
        assert r["ref_build"] == ("pg19-vanilla" if pg19 else "vanilla"), r
        assert r["pg_version"].startswith("19" if pg19 else "18"), r
        assert r["preset"] == r["build"].replace("pg19-", "pg19/"), r
    q2 = {r["build"]: float(r["instr_overhead_pct"]) for r in rows
          if r["mode"] == "analyze_notiming"}
    assert q2["pg19-step3"] < q2["pg19-vanilla"] / 2, q2
    assert "against vanilla's plain Query-1" in cp.stdout
