"""Issue 15, part 2: workloads are TOML files; the seeds ship as three of them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from profkit.pg import workloads as W
from profkit.pg.workloads import WorkloadError, get_workload

MINE = """\
name = "mine"
description = "a user's workload"
tables = ["pk15_t"]
setup = [
    "DROP TABLE IF EXISTS pk15_t",
    "CREATE TABLE pk15_t AS SELECT i, i % 7 AS g FROM generate_series(1, {rows}) AS i",
]

[sizes]
rows = 100_000

[queries]
total = "SELECT sum(i) FROM pk15_t"
groups = "SELECT g, count(*) FROM pk15_t GROUP BY g"

[check]
expected = "rows * (rows + 1) // 2"
"""


def _write(tmp_path: Path, text: str, name: str = "mine.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_seed_files_keep_the_seed_figures():
    assert W.packaged_workloads()[:3] == ["nested_loop", "join_sum", "count_star"]
    nl = get_workload("nested_loop")
    assert nl.select_sql == ("SELECT count(*) FROM test1 AS a, test2 AS b, test3 AS c "
                             "WHERE a.id = c.id")
    assert nl.expected_rows(1.0) == 2_000_000_000  # the seed's Query-1 answer
    assert nl.sizes(0.01) == {"test1_a": 1500, "test1_b": 50, "test2": 500, "test3": 350}
    assert nl.expected_rows(0.01) == (350 + 50) * 500
    assert "generate_series(1, 1500)" in nl.setup(0.01)[5]
    js = get_workload("join_sum")
    assert js.expected_rows(1.0) == sum(i * i for i in range(1, 1001))
    assert js.expected_rows(0.003) == sum(i * i for i in range(1, 4))
    cs = get_workload("count_star")
    assert cs.expected_rows(0.5) == 5_000_000 and cs.tables == ("t1",)
    assert W.WORKLOADS["join_sum"].select_sql == js.select_sql


def test_user_file_queries_sizes_and_placeholders(tmp_path):
    p = _write(tmp_path, MINE)
    wl = get_workload(str(p))
    assert wl.name == "mine" and list(wl.named) == ["total", "groups"]
    assert wl.select_sql == "SELECT sum(i) FROM pk15_t"
    assert wl.expected_rows(0.5) == 50_000 * 50_001 // 2
    assert "generate_series(1, 1000)" in wl.setup(0.01)[1]
    g = get_workload(f"{p}#groups")
    assert g.select_sql.startswith("SELECT g, count(*)") and g.query_name == "groups"
    assert g.expected_rows(1.0) is None  # the expected answer is the first query's
    assert W.workload_label(f"{p}#groups") == "mine-groups"
    with pytest.raises(WorkloadError, match="has no query 'nope'; its queries: total, groups"):
        get_workload(str(p), "nope")


def test_no_setup_uses_the_database_as_it_is(tmp_path):
    p = _write(tmp_path, '[queries]\nq = "SELECT 1"\n', "bare.toml")
    wl = get_workload(str(p))
    assert wl.name == "bare" and wl.setup(1.0) == [] and wl.tables == ()
    assert wl.expected_rows(1.0) is None and wl.sizes(1.0) == {}


@pytest.mark.parametrize("text, want", [
    ('name = "x"\n[queries]\nq = "SELECT 1"\nbogus = \n', r"^{p}:4:\d+: TOML syntax error"),
    ('name = "x"\nsetpu = []\n[queries]\nq = "SELECT 1"\n',
     r"^{p}: unknown key 'setpu'; allowed: name, description, source, setup, tables, sizes, "
     r"queries, check$"),
    ('[queries]\nq = "SELECT 1"\n[check]\nexpect = 1\n',
     r"^{p}: unknown key \[check\] 'expect'; allowed: query, expected$"),
    ('setup = ["SELECT {nrows}"]\n[queries]\nq = "SELECT 1"\n',
     r"setup uses \{nrows\}, which is not a size; known: scale"),
    ('[queries]\nq = "SELECT 1"\n[check]\nexpected = "__import__(1)"\n',
     r"is not an arithmetic expression"),
    ('[queries]\nq = "SELECT 1"\n[check]\nexpected = "rows + 1"\n', r"unknown name 'rows'"),
    ('name = "x"\n', r"give at least one query"),
    ('[sizes]\nn = -3\n[queries]\nq = "SELECT 1"\n', r"\[sizes\] maps names to row counts > 0"),
])
def test_bad_files_are_one_line_errors(tmp_path, text, want):
    import re

    p = _write(tmp_path, text, "bad.toml")
    with pytest.raises(WorkloadError) as ei:
        get_workload(str(p))
    msg = str(ei.value)
    assert "\n" not in msg
    assert re.search(want.replace("{p}", re.escape(str(p))), msg), msg


def test_unknown_workload_and_missing_file(tmp_path):
    with pytest.raises(WorkloadError, match="unknown workload 'nope'; known: nested_loop, "
                                            "join_sum, count_star"):
        get_workload("nope")
    with pytest.raises(WorkloadError, match="not found"):
        get_workload(str(tmp_path / "none.toml"))


def test_cli_reports_bad_file_before_anything_starts(tmp_path):
    p = _write(tmp_path, 'setpu = 1\n[queries]\nq = "SELECT 1"\n', "bad.toml")
    for argv in (["bench", "--workload", str(p)], ["perf", "vanilla", "--workload", str(p)],
                 ["bench", "--workload", "nested_loop", "--query", "nope"]):
        cp = subprocess.run([sys.executable, "-m", "profkit", *argv, "--scale", "0.01"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert cp.returncode == 1, cp.stderr
        lines = cp.stderr.strip().splitlines()
        assert len(lines) == 1 and ("unknown key 'setpu'" in lines[0]
                                    or "has no query 'nope'" in lines[0]), cp.stderr


def test_cli_syntax_error_and_unknown_key_are_one_line_everywhere(tmp_path):
    """Every command taking --workload FILE.toml stops at a bad file with one line naming
    the file (and line:column, or the allowed keys), before it builds, connects or probes."""
    syntax = _write(tmp_path, 'name = "x"\n[queries]\nq = "SELECT 1\n', "syntax.toml")
    unknown = _write(tmp_path, 'name = "x"\nsetpu = []\n[queries]\nq = "SELECT 1"\n',
                     "unknown.toml")
    dsn = f"host={tmp_path} port=1 dbname=x"  # never reached: the file is read first
    # (bench with an unknown key: test_cli_reports_bad_file_before_anything_starts)
    cases = [(argv, f"{syntax}:3:") for argv in (
        ["bench", "--workload", str(syntax), "--scale", "0.01"],
        ["gprof", "vanilla", "--workload", str(syntax)],
        ["probe", "--dsn", dsn, "--workload", str(syntax)],
        ["clock-calls", "--dsn", dsn, "--workload", str(syntax)],
        ["perf", "--dsn", dsn, "--workload", str(syntax)])]
    cases.append((["probe", "--dsn", dsn, "--workload", str(unknown)],
                  "unknown key 'setpu'; allowed: "))
    for argv, want in cases:
        cp = subprocess.run([sys.executable, "-m", "profkit", *argv], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
        lines = cp.stderr.strip().splitlines()
        assert cp.returncode == 1 and len(lines) == 1, (argv, cp.stderr)
        assert want in lines[0] and "cannot connect" not in lines[0], (argv, lines[0])


@pytest.mark.pg
def test_bench_and_perf_on_a_user_workload_file(tmp_path, vanilla_build):
    p = _write(tmp_path, MINE + '\n', "mine.toml")
    out = tmp_path / "profiles"
    cp = subprocess.run([sys.executable, "-m", "profkit", "bench", "--builds", "vanilla",
                         "--workload", str(p), "--query", "total", "--scale", "0.05", "--reps",
                         "2", "--instructions", "none", "--out", str(out), "--json"],
                        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr[-3000:]
    res = json.loads(cp.stdout)
    run = Path(res["run_dir"])
    prov = json.loads((run / "provenance.json").read_text())
    assert "mine.toml#total" in json.dumps(prov)
    import pandas as pd

    t = pd.read_csv(run / "timings.csv")
    # 2 repetitions, and any the vCPU rule added (a mode left with none kept)
    extra = prov["extra_repetitions"]["extra_reps"]
    assert 0 <= extra <= 2 and len(t) == (2 + extra) * 3 and (t["build"] == "vanilla").all()
    cp = subprocess.run([sys.executable, "-m", "profkit", "perf", "vanilla", "--workload",
                         str(p), "--query", "groups", "--scale", "0.05", "--no-stat",
                         "--out", str(tmp_path / "fg")],
                        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr[-3000:]
    svgs = list((tmp_path / "fg").glob("perf-vanilla-mine-groups-*.svg"))
    assert svgs and svgs[0].stat().st_size > 1000, cp.stdout
