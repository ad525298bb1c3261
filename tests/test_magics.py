"""%load_ext profkit in a real in-process IPython shell: bad options, --help and an
unknown build give readable messages and the shell survives; a good cell runs on a
real vanilla cluster and returns the query's rows; %profkit_stop stops the cluster
by pid."""
from __future__ import annotations

import re

import pandas as pd
import pytest

from proc_helpers import alive, start_ticks

from profkit.experiments.profile import instrumentation_arcs
from profkit.lab import magics
from profkit.parse.callgrind import parse_callgrind_file
from profkit.pg.workloads import get_workload
from profkit.rundir import load_run

SCALE = 0.01


@pytest.fixture(scope="module")
def ip():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "profkit")
    yield shell
    magics.REGISTRY.stop()


def test_help_is_in_the_docstring_and_usage(ip, capsys):
    doc = ip.find_cell_magic("profkit").__doc__
    assert "--collector {none,perf,gprof,ltrace,bpf,callgrind}" in doc
    assert "--build" in doc and "--mode" in doc and "--workload" in doc
    out = ip.run_cell_magic("profkit", "--help", "SELECT 1")
    assert out is None
    printed = capsys.readouterr().out
    assert "usage: %%profkit" in printed and "--collector" in printed
    assert magics.REGISTRY.names() == []  # --help runs nothing


@pytest.mark.parametrize("line, expect", [
    ("--collector nosuch", "invalid choice: 'nosuch'"),
    ("--mode fast", "invalid choice: 'fast'"),
    ("--scale", "expected one argument"),
    ("--bogus 1", "unrecognized arguments: --bogus 1"),
    ("--build 'unterminated", "check the quotes"),
    ("--reps 0", "--reps must be >= 1"),
])
def test_bad_options_print_usage_and_the_cell_survives(ip, capsys, line, expect):
    out = ip.run_cell_magic("profkit", line, "SELECT 1")
    assert out is None
    err = capsys.readouterr().err
    assert expect in err
    if "quotes" not in expect and "--reps" not in expect:
        assert "usage: %%profkit" in err
    # the shell still works
    assert ip.run_cell("1 + 1").result == 2


def test_unknown_build_is_a_readable_error(ip, capsys):
    out = ip.run_cell_magic("profkit", "--build no_such_build", "SELECT 1")
    assert out is None
    err = capsys.readouterr().err
    assert "unknown build 'no_such_build'" in err and "known presets" in err
    assert "Traceback" not in err
    assert "no_such_build" not in magics.REGISTRY.names()
    assert ip.run_cell("x = 41 + 1").success


def test_gprof_on_a_non_profiling_build_says_which_build_to_use(ip, capsys):
    assert ip.run_cell_magic("profkit", "--collector gprof", "SELECT 1") is None
    assert "use --build gprof" in capsys.readouterr().err


def test_empty_cell_without_workload(ip, capsys):
    assert ip.run_cell_magic("profkit", "", "-- nothing\n") is None
    assert "the cell has no SQL" in capsys.readouterr().err


@pytest.mark.pg
def test_good_cell_returns_the_count_on_vanilla(ip, capsys, vanilla_build):
    wl = get_workload("nested_loop")
    df = ip.run_cell_magic("profkit", f"--build vanilla --workload nested_loop --scale {SCALE}",
                           wl.select_sql + ";")
    assert df is not None, capsys.readouterr().err
    assert list(df.columns) == ["count"]
    assert int(df.iloc[0, 0]) == wl.expected_rows(SCALE)
    assert "loaded nested_loop at scale 0.01" in capsys.readouterr().out
    sess = magics.REGISTRY.get("vanilla")
    pid = sess.cluster.pid
    start = start_ticks(pid)
    assert alive(pid, start)

    # the cluster and its tables are reused: an empty cell runs the workload's query
    # in EXPLAIN ANALYZE (TIMING off)
    plan = ip.run_cell_magic("profkit", f"--workload nested_loop --scale {SCALE} "
                             "--mode analyze_notiming", "-- the workload's query")
    assert plan.columns.tolist() == ["QUERY PLAN"]
    text = "\n".join(plan["QUERY PLAN"])
    assert "actual rows" in text and "Nested Loop" in text
    assert "loaded" not in capsys.readouterr().out
    assert magics.REGISTRY.get("vanilla").cluster.pid == pid

    # a SQL error is a readable message, not a dead kernel
    assert ip.run_cell_magic("profkit", "", "SELECT * FROM no_such_table") is None
    assert 'relation "no_such_table" does not exist' in capsys.readouterr().err
    # %profkit_stop stops the postmaster by pid
    ip.run_line_magic("profkit_stop", "vanilla")
    assert "stopped vanilla" in capsys.readouterr().out
    assert magics.REGISTRY.names() == []
    assert not alive(pid, start)
    ip.run_line_magic("profkit_stop", "vanilla")
    assert "no %%profkit cluster for vanilla" in capsys.readouterr().err


@pytest.mark.pg
def test_ltrace_collector_counts_clock_reads(ip, capsys, vanilla_build):
    """ltrace on the backend: TIMING on reads the clock, TIMING off does not (per row)."""
    line = "--workload join_sum --scale 0.002 --collector ltrace --mode "
    on = ip.run_cell_magic("profkit", line + "analyze_timing", "--")
    assert on is not None, capsys.readouterr().err
    off = ip.run_cell_magic("profkit", line + "analyze_notiming", "--")
    calls_on = int(on.loc[on["function"] == "clock_gettime", "calls"].iloc[0])
    calls_off = off.loc[off["function"] == "clock_gettime", "calls"]
    calls_off = int(calls_off.iloc[0]) if len(calls_off) else 0
    # join_sum at 0.002: 2000 + 2 rows scanned -> thousands of reads with TIMING on
    assert calls_on > 2000
    assert calls_off < 100
    magics.REGISTRY.stop()


@pytest.mark.pg
def test_perf_collector_shows_a_flamegraph_inline(ip, capsys, vanilla_build, tmp_path,
                                                  monkeypatch):
    from profkit.render.flamegraph import FlameGraph

    monkeypatch.setenv("PROFKIT_PROFILES", str(tmp_path))
    fg = ip.run_cell_magic("profkit", "--workload nested_loop --scale 0.03 --collector perf "
                           "--mode analyze_timing", "-- the workload's query")
    assert isinstance(fg, FlameGraph), capsys.readouterr().err
    assert fg.total > 0
    html = fg._repr_html_()
    assert html.startswith("<iframe srcdoc=") and "ExecProcNodeInstr" in html
    assert "instrumentation" in capsys.readouterr().out
    # the run directory was written under PROFKIT_PROFILES
    assert any((p / "perf.data").exists() for p in tmp_path.iterdir())
    magics.REGISTRY.stop()


@pytest.mark.pg
def test_bpf_collector_counts_per_plan_node(ip, capsys, vanilla_build, tmp_path, monkeypatch):
    monkeypatch.setenv("PROFKIT_PROFILES", str(tmp_path))
    nodes = ip.run_cell_magic("profkit", "--workload join_sum --scale 0.002 --collector bpf "
                              "--mode analyze_timing", "-- the workload's query")
    assert nodes is not None, capsys.readouterr().err
    # join_sum: Aggregate, Hash Join, Seq Scan, Hash, Seq Scan; 2 clock reads per call
    assert len(nodes) == 5
    assert (nodes["clock_reads"] > 0).all()
    scan = nodes[nodes["node_id"] == 2].iloc[0]  # Seq Scan on i1: 2000 rows + 1 NULL call
    assert scan["exec_calls"] == 2001
    assert "probes on" in capsys.readouterr().out
    # the cell's run is a run directory with its provenance, found like any other run
    (run,) = [load_run(p) for p in tmp_path.iterdir() if p.is_dir() and p.name != "latest"]
    assert run.kind == "magic-bpf" and run.get("build_name") == "vanilla"
    assert run.get("status") == "complete"
    magics.REGISTRY.stop()


@pytest.mark.pg
@pytest.mark.builds("gprof")
def test_gprof_collector_counts_calls_exactly(ip, capsys, tmp_path, monkeypatch):
    """Needs the -pg build (conftest builds it before the session)."""
    monkeypatch.setenv("PROFKIT_PROFILES", str(tmp_path))
    fn = ip.run_cell_magic("profkit", "--build gprof --workload join_sum --scale 0.002 "
                           "--collector gprof --mode analyze_notiming --top 400",
                           "-- the workload's query")
    assert fn is not None, capsys.readouterr().err
    calls = dict(zip(fn["function"], fn["calls"], strict=True))
    # join_sum at 0.002: i1 2000 rows, i2 2; exec calls = rows + loops per node:
    # Agg 1+1, Hash Join 2+1, Seq Scan i1 2000+1, Seq Scan i2 2+1 -> 2009; the Hash node's
    # MultiExec bracket 1; the shutdown bracket of each of the 5 nodes -> 2015 InstrStartNode
    assert calls["InstrStartNode"] == calls["InstrStopNode"] == 2015
    # gprof skips dotted local symbols: the 5 calls of ExecShutdownNode_walker.part.0 (right
    # after ExecProcNodeInstr in the binary) are counted as ExecProcNodeInstr's
    assert calls["ExecProcNodeInstr"] == 2009 + 5
    assert "gprof call counts of backend" in capsys.readouterr().out
    magics.REGISTRY.stop()


@pytest.mark.pg
def test_callgrind_collector_counts_instructions(ip, capsys, vanilla_build, tmp_path,
                                                 monkeypatch):
    monkeypatch.setenv("PROFKIT_PROFILES", str(tmp_path))
    line = "--workload join_sum --scale 0.002 --collector callgrind --mode analyze_notiming"
    fn = ip.run_cell_magic("profkit", line + " --top 200", "-- the workload's query")
    assert fn is not None, capsys.readouterr().err
    calls = dict(zip(fn["function"], fn["calls"], strict=True))
    assert calls["ExecProcNodeInstr"] == 2009  # rows + loops of the four pulled nodes
    out = capsys.readouterr().out
    assert "instructions in exec_simple_query" in out
    (run,) = [load_run(p) for p in tmp_path.iterdir() if p.is_dir() and p.name != "latest"]
    assert run.kind == "magic-callgrind" and run.get("mode") == "analyze_notiming"
    assert run.get("instructions") > 0 and run.get("status") == "complete"
    # the run keeps callgrind's tables, equal to a fresh parse of its raw profile
    prof = parse_callgrind_file(run.path / "callgrind.analyze_notiming.out",
                                run_id=run.run_id, build="vanilla")
    assert prof.totals == run.get("instructions")
    pd.testing.assert_frame_equal(pd.read_parquet(run.path / "functions.parquet"),
                                  prof.functions)
    edges = pd.read_parquet(run.path / "call_edges.parquet")
    pd.testing.assert_frame_equal(edges, prof.call_edges)
    # the cell shows who calls the instrumentation: the per-row brackets of
    # ExecProcNodeInstr (2009) beside the others (the Hash node's MultiExec bracket, the
    # shutdown brackets), which sum to InstrStartNode's 2015 calls
    arcs = instrumentation_arcs(edges)
    start = arcs[arcs["callee"] == "InstrStartNode"]
    assert start.iloc[0][["caller", "calls"]].tolist() == ["ExecProcNodeInstr", 2009], start
    assert start["calls"].sum() == calls["InstrStartNode"] == 2015 and len(start) >= 2, start
    assert re.search(r"ExecProcNodeInstr\s+InstrStartNode\s+2009\b", out), out
    # the cluster was restarted after callgrind: the next cell runs on it again
    df = ip.run_cell_magic("profkit", "--workload join_sum --scale 0.002", "SELECT 1 AS one")
    assert df is not None and int(df.iloc[0, 0]) == 1
    magics.REGISTRY.stop()


@pytest.mark.pg
def test_perf_collector_says_too_few_samples_and_reps_fix_it(ip, capsys, vanilla_build,
                                                              tmp_path, monkeypatch):
    """A few-millisecond query (join_sum at 0.02: a hash join of 20,000 rows and 20)
    gives too few samples at 999 Hz: the magic says how long the query ran, what that
    gave, and the --reps that fixes it, and prints no instrumentation share; with that
    --reps the profile has >= MIN_SAMPLES samples and the share is back."""
    import re

    from profkit.collect.perf import MIN_SAMPLES

    monkeypatch.setenv("PROFKIT_PROFILES", str(tmp_path))
    line = "--workload join_sum --scale 0.02 --collector perf --mode plain"
    fg = ip.run_cell_magic("profkit", line, "-- the workload's query")
    out = capsys.readouterr().out
    assert fg.total < MIN_SAMPLES, out
    assert "too few samples for a profile" in out and "instrumentation" not in out, out
    m = re.search(r"the query ran ([\d.]+) ms; at 999 Hz that is about (\d+) samples of CPU "
                  r"time, perf kept (\d+)\. To fix: run the query more times in the "
                  r"recording: --reps (\d+)", out)
    assert m, out
    ran_ms, kept, reps = float(m.group(1)), int(m.group(3)), int(m.group(4))
    assert 0 < ran_ms < 100 and kept == fg.total
    assert "too few" in fg._repr_html_()               # the flamegraph's subtitle says it
    fg2 = ip.run_cell_magic("profkit", f"{line} --reps {reps}", "-- the workload's query")
    out2 = capsys.readouterr().out
    assert fg2.total >= MIN_SAMPLES, out2
    assert "too few" not in out2 and re.search(r"instrumentation \d+\.\d% of them", out2)
    magics.REGISTRY.stop()
