"""The headline claim outside notebooks, through `make demo`'s own code path.

`profkit reproduce` runs end to end at a tiny scale in a subprocess whose
environment carries make's variables (as under `make demo`), and callgrind's
instruction counts (deterministic, unlike time on this VM) must show the seed's
result: Query-2's instruction overhead falls vanilla > step1 > step2 > step3.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
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
    assert list(rows[0]) == ["build", "mode", "n", "median_ms", "mean_ms", "variance",
                             "overhead_pct", "ci_low_pct", "ci_high_pct", "instr",
                             "instr_overhead_pct", "pg_version", "preset", "metric", "q25_ms",
                             "plain_instr", "plain_median_ms", "plain_q25_ms", "ref_build",
                             "vs_ref_pct", "vs_ref_ci_low_pct", "vs_ref_ci_high_pct",
                             "vs_ref_instr_pct"]
    assert {r["build"] for r in rows} == set(STEPS)
    assert {r["mode"] for r in rows} == {"plain", "analyze_notiming", "analyze_timing"}
    # n counts the executions kept: the ones whose vCPU calibration ran slow are left out
    import pandas as pd

    assert len(pd.read_csv(run / "timings.csv")) == len(STEPS) * 3 * 3  # 3 of each ran
    kept = kept_counts(run)
    for r in rows:
        assert int(r["n"]) == kept.get((r["build"], r["mode"]), 0) and 1 <= int(r["n"]) <= 3, r
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["status"] == "complete"
    svgs = sorted(p.name for p in (base / "flamegraphs").glob("*.svg"))
    assert {"query2-vanilla.svg", "query2-step3.svg", "query2-vanilla-vs-step3.svg"} <= set(svgs)
    assert "wall time: builds" in cp.stdout + cp.stderr


def test_query2_instruction_overhead_falls_step_by_step(reproduced):
    base, _cp = reproduced
    q2 = {r["build"]: float(r["instr_overhead_pct"]) for r in _summary(base)
          if r["mode"] == "analyze_notiming"}
    assert q2["vanilla"] > q2["step1"] > q2["step2"] > q2["step3"] > 0, q2
    # the seed's shape, loosely: step3 cuts vanilla's row-counting overhead by well over half
    assert q2["step3"] < q2["vanilla"] / 2, q2
    # step4 and step5 (issue 13) count rows for fewer instructions than step3 ...
    assert q2["step5"] < q2["step3"] and q2["step4"] < q2["step3"], q2
    # ... and every row carries its figures against vanilla's plain Query-1
    for r in _summary(base):
        assert r["ref_build"] == "vanilla" and r["pg_version"].startswith("18"), r
        assert r["plain_instr"] and float(r["plain_instr"]) > 0, r
    vs = {(r["build"], r["mode"]): float(r["vs_ref_instr_pct"]) for r in _summary(base)}
    assert vs[("vanilla", "plain")] == 0.0
    assert vs[("step5", "analyze_notiming")] < vs[("step3", "analyze_notiming")], vs
    q3 = {r["build"]: float(r["instr_overhead_pct"]) for r in _summary(base)
          if r["mode"] == "analyze_timing"}
    # TIMING TRUE costs more instructions than TIMING FALSE on every build
    assert all(q3[b] > q2[b] for b in STEPS), (q2, q3)


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
