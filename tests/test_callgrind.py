"""callgrind: parser on recorded outputs, the real tool, and a real PostgreSQL backend."""
from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from conftest import benchmark_module

from profkit.collect import callgrind as cgc
from profkit.collect import perf_stat
from profkit.errors import ClusterError, ParseError, ProbeError
from profkit.parse import callgrind as cgp
from profkit.processes import children, run

FIX = Path(__file__).parent / "fixtures" / "callgrind"
COLS = ["function", "module", "calls", "self", "total"]


def _expected(name: str) -> pd.DataFrame:
    return pd.read_csv(FIX / name, dtype={"function": str, "module": str})


def _table(prof: cgp.CallgrindProfile) -> pd.DataFrame:
    f = prof.functions[COLS].copy()
    f["function"] = f["function"].astype(str)
    f["module"] = f["module"].astype(str)
    f["calls"] = f["calls"].astype("float64")
    f["self"] = f["self"].astype("int64")
    f["total"] = f["total"].astype("int64")
    return f.reset_index(drop=True)


def _compare(got: pd.DataFrame, exp: pd.DataFrame) -> None:
    key = ["module", "function"]
    g = got.sort_values(key).reset_index(drop=True)
    e = exp.sort_values(key).reset_index(drop=True)
    e["calls"] = e["calls"].astype("float64")
    pd.testing.assert_frame_equal(g[COLS], e[COLS], check_dtype=False)


# ---------------------------------------------------------------------------
# parser on recorded files


def test_fib_fixture_matches_expected_and_callgrind_annotate():
    prof = cgp.parse_callgrind_file(FIX / "fib.callgrind.out", run_id="r", build="b")
    assert prof.totals == 142143 == prof.summary  # valgrind printed "Collected : 142143"
    assert prof.events == ("Ir",) and prof.parts == 1
    assert prof.header["cmd"] == "./fib 1000"
    _compare(_table(prof), _expected("fib.expected.csv"))
    f = prof.functions.set_index("function")
    # fib(12): 2*F(13) - 1 = 465 calls, nested ones (fib'2) merged into fib
    assert f.loc["fib", "calls"] == 465
    assert "fib'2" not in f.index
    assert f.loc["leaf", "calls"] == 1000 + 233
    # inclusive of main equals callgrind_annotate --inclusive=yes (19,273); the
    # recursive fib is 7,206 (the arc from work), not callgrind_annotate's 51,260 for fib'2
    assert prof.inclusive("main") == 19273
    assert prof.inclusive("fib") == 7206
    assert prof.inclusive("leaf") == prof.self_cost("leaf") == 2466
    assert f["self"].sum() == prof.totals
    assert set(prof.functions["tool"]) == {"callgrind"}
    assert set(prof.functions["unit"]) == {"instructions"}
    assert prof.functions["self_share"].sum() == pytest.approx(1.0)
    assert set(prof.functions["run_id"]) == {"r"}


def test_postgres_fixture_matches_expected():
    prof = cgp.parse_callgrind_file(FIX / "pg18_nested_loop_analyze_notiming.callgrind.out.gz")
    assert prof.totals == 448_476_655
    _compare(_table(prof), _expected("pg18_nested_loop_analyze_notiming.expected.csv"))
    f = prof.functions.set_index("function")
    # scale 0.02: 800,000 rows through the nested loop, +1 for the end-of-scan call
    assert f.loc["ExecNestLoop", "calls"] == 800_001
    # every instrumented node call goes through both instrumentation functions
    assert f.loc["InstrStartNode", "calls"] == f.loc["InstrStopNode", "calls"]
    # callgrind_annotate --inclusive=yes on the same file
    assert prof.inclusive("standard_ExecutorRun") == 447_644_524
    assert prof.inclusive("ExecProcNodeInstr") == 447_643_023
    assert prof.inclusive("ExecNestLoop") == 287_641_228
    assert prof.inclusive("exec_simple_query") == prof.totals  # the toggle root
    with pytest.raises(KeyError):
        prof.inclusive("no_such_function")


def annotate_arcs(path: Path) -> dict[tuple[str, str], int]:
    """valgrind's callgrind_annotate --tree=caller read (benchmarks/peer_inputs.py)."""
    return benchmark_module("peer_inputs").annotate_arcs(path)


def edges_of(prof: cgp.CallgrindProfile) -> dict[tuple[str, str], int]:
    """Calls per (caller, callee) of *prof* (benchmarks/peer_inputs.py)."""
    return benchmark_module("peer_inputs").edge_calls(prof.call_edges)


@pytest.mark.parametrize("name", ["fib.callgrind.out", "fib_instr_cachesim.callgrind.out",
                                  "pg18_nested_loop_analyze_notiming.callgrind.out.gz"])
def test_call_edges_are_callgrind_annotates(name, tmp_path):
    """Every caller -> callee pair and its calls, as valgrind's own callgrind_annotate
    counts them; each function's calls are the sum of its edges."""
    path = FIX / name
    if name.endswith(".gz"):  # callgrind_annotate reads plain files only
        path = tmp_path / name.removesuffix(".gz")
        path.write_bytes(gzip.decompress((FIX / name).read_bytes()))
    prof = cgp.parse_callgrind_file(FIX / name)
    mine = edges_of(prof)
    theirs = annotate_arcs(path)
    assert len(mine) > 300 and mine == theirs, sorted(
        (k, mine.get(k), theirs.get(k)) for k in set(mine) ^ set(theirs))[:10]
    into = prof.call_edges.groupby("callee")["calls"].sum()
    calls = prof.functions.dropna(subset=["calls"]).groupby("function")["calls"].sum()
    assert (calls[calls > 0].sort_index() == into.sort_index()).all()
    if name.startswith("fib."):
        # fib.c: work calls leaf 1000 times, fib(12) calls itself 2*F(13) - 2 times
        assert mine[("work", "leaf")] == 1000 and mine[("fib", "fib")] == 464
        assert mine[("work", "fib")] == 1 and mine[("fib", "leaf")] == 233
    if name.startswith("pg18"):
        # every Instr* call comes from the wrapper, once per row through each node
        assert mine[("ExecProcNodeInstr", "InstrStartNode")] == 1_606_607
        assert mine[("ExecProcNodeInstr", "InstrStopNode")] == 1_606_607
        assert mine[("ExecProcNodeInstr", "ExecNestLoop")] == 800_001
        # calls=0 arcs (in progress when collection started) are not edges
        assert ("main", "PostgresSingleUserMain") not in mine
        assert mine[("exec_simple_query", "PortalRun")] == 1


def test_instr_positions_and_several_events():
    # --dump-instr=yes --cache-sim=yes: two position columns, nine events
    path = FIX / "fib_instr_cachesim.callgrind.out"
    ir = cgp.parse_callgrind_file(path)
    assert ir.events[:3] == ("Ir", "Dr", "Dw")
    assert ir.totals == 142143  # same program, same instruction count
    assert ir.summary == 142145  # callgrind's header differs from totals here; totals win
    assert ir.inclusive("fib") == 7206
    dr = cgp.parse_callgrind_file(path, event="Dr")
    assert dr.totals == 30295
    assert dr.functions.set_index("function").loc["fib", "self"] == 1395
    with pytest.raises(ParseError, match="not 'Bc'"):
        cgp.parse_callgrind_file(path, event="Bc")


def test_empty_file_is_a_clear_error():
    with pytest.raises(ParseError, match="empty"):
        cgp.parse_callgrind_file(FIX / "empty.callgrind.out")


def test_truncated_file_strict_and_lenient():
    with pytest.raises(ParseError, match="truncated"):
        cgp.parse_callgrind_file(FIX / "truncated.callgrind.out")
    prof = cgp.parse_callgrind_file(FIX / "truncated.callgrind.out", strict=False)
    assert 0 < prof.totals < 142143
    assert prof.totals == int(prof.functions["self"].sum())


def test_not_callgrind_and_missing_file():
    with pytest.raises(ParseError, match="not a callgrind output"):
        cgp.parse_callgrind("Each sample counts as 0.01 seconds.\n  %   cumulative\n")
    with pytest.raises(ParseError, match="does not exist"):
        cgp.parse_callgrind_file(FIX / "nope.out")
    bad_gz = FIX / "fib.c"
    with pytest.raises(ParseError):
        cgp.parse_callgrind_file(bad_gz)


def test_undefined_compressed_name_is_an_error():
    text = "# callgrind format\nevents: Ir\nfn=(7)\n1 5\ntotals: 5\n"
    with pytest.raises(ParseError, match=r"fn id \(7\) used before"):
        cgp.parse_callgrind(text)


def test_relative_positions_and_costs_read_as_speedscope_reads_them():
    """Positions may be '*', '+N', '-N' (valgrind's subposition compression).  valgrind
    writes costs as plain numbers, but speedscope's sample compresses them the same way,
    relative to the cost line before (any function's): read so, as speedscope reads it,
    its self costs sum to main's inclusive 820 (speedscope's snapshot: main 20, func1
    100, func2 700).  A relative cost with no cost line before it, or one that goes below
    0, is an error naming the line."""
    head = "# callgrind format\nevents: Ir\nfl=a.c\nfn=main\n16 20\ncfn=f\ncalls=3 20\n"
    prof = cgp.parse_callgrind(head + "* 400\n+4 7\n-2 3\nfn=f\n* 400\n")
    assert prof.totals == 430  # the call line's 400 is inclusive: f's own 400 counts once
    assert prof.functions.set_index("function")["self"].to_dict() == {"main": 30, "f": 400}
    # speedscope's sample/profiles/callgrind/callgrind.subposition-compression.log
    sample = ("# callgrind format\nevents: Instructions\n\nfl=file1.c\nfn=main\n16 20\n"
              "cfn=func1\ncalls=1 50\n* 400\ncfi=file2.c\ncfn=func2\ncalls=3 20\n* *\n\n"
              "fn=func1\n+35 -300\ncfi=file2.c\ncfn=func2\ncalls=2 20\n* 300\n\n"
              "fl=file2.c\nfn=func2\n-31 +400")
    prof = cgp.parse_callgrind(sample)
    assert prof.event == "Instructions" and prof.totals == 820
    got = prof.functions.set_index("function")[["self", "total"]].astype(int)
    assert got.to_dict("index") == {"main": {"self": 20, "total": 820},
                                    "func1": {"self": 100, "total": 400},
                                    "func2": {"self": 700, "total": 700}}
    arcs = {(r.caller, r.callee): int(r.calls) for r in prof.call_edges.itertuples()}
    assert arcs == {("main", "func1"): 1, ("main", "func2"): 3, ("func1", "func2"): 2}
    for cost in ("*", "+3", "-3"):
        with pytest.raises(ParseError, match=r"line 5: event cost .* there is none"):
            cgp.parse_callgrind(f"# callgrind format\nevents: Ir\nfl=a.c\nfn=main\n16 {cost}\n")
    with pytest.raises(ParseError, match=r"line 9: event cost '-500' takes .* 400 below 0"):
        cgp.parse_callgrind(head + "* 400\n* -500\n")


def test_zero_totals_profile_is_empty_table():
    # what --toggle-collect writes when the toggle function never ran
    text = ("# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\npart: 5\n"
            "positions: line\nevents: Ir\nsummary: 0\n\n\ntotals: 0\n")
    prof = cgp.parse_callgrind(text)
    assert prof.totals == 0 and prof.functions.empty
    assert list(prof.functions.columns)[:9] == [
        "run_id", "build", "tool", "function", "module", "calls", "self", "total", "self_share"]


def test_real_callgrind_run_on_a_small_program(tmp_path):
    """The real tool end to end: compile, run under callgrind, parse, compare with valgrind."""
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed (build-essential)"
    exe = tmp_path / "fib"
    run([gcc, "-O1", "-g", "-fno-inline", "-o", exe, FIX / "fib.c"], timeout=60)
    out = tmp_path / "cg.out"
    cp = run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
              "--toggle-collect=work", exe, "500"], timeout=120)
    # work(500) = sum of leaf(i) for i < 500, plus fib(12)
    assert cp.stdout.strip() == str(sum(3 * i + 1 for i in range(500)) + _fib_leafsum(12))
    collected = int(next(ln for ln in cp.stderr.splitlines() if "Collected" in ln).split()[-1])
    prof = cgp.parse_callgrind_file(out)
    assert prof.totals == collected
    f = prof.functions.set_index("function")
    assert f.loc["leaf", "calls"] == 500 + 233  # 500 from the loop, 233 fib leaves
    assert f.loc["fib", "calls"] == 465
    assert prof.inclusive("work") == prof.totals  # only work() was collected


def test_collect_jumps_gives_the_same_costs(tmp_path):
    """valgrind --collect-jumps=yes adds jump=/jcnd= lines (each followed by a position
    line without cost) and jfi=/jfn= names: the same program's table is the same as
    without them, calls and all."""
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed (build-essential)"
    exe = tmp_path / "fib"
    run([gcc, "-O1", "-g", "-fno-inline", "-o", exe, FIX / "fib.c"], timeout=60)
    tables = {}
    for name, extra in (("plain", []), ("jumps", ["--collect-jumps=yes"])):
        out = tmp_path / f"{name}.out"
        run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *extra,
             "--toggle-collect=work", exe, "500"], timeout=120)
        text = out.read_text()
        if name == "jumps":
            assert "\njcnd=" in text and "\njump=" in text, "valgrind wrote no jumps"
        prof = cgp.parse_callgrind_file(out)
        assert prof.totals == int(prof.functions["self"].sum()) > 0
        tables[name] = prof.functions.set_index("function")[["calls", "self", "total"]]
    pd.testing.assert_frame_equal(tables["plain"].sort_index(), tables["jumps"].sort_index())
    assert tables["jumps"].loc["fib", "calls"] == 465


def test_which_quotes_end_a_function_name():
    """A suffix after a quote is a recursion level (a number) or a caller of a context only
    when it names a function of the same profile; quotes inside brackets, and a quote
    followed by anything else, belong to the name."""
    body = ["fl=(1) a.c"]
    names = ["main", "fib'work", "fib'2'work", "leaf'fib'work", "work'main",
             "f'", "f''2", "x'_42", "<method 'read' of 'file' objects>",
             "std::operator<< <char>(std::ostream&)'main", "g<'a'>'main", "(below main)",
             "h'(below main)"]
    for i, n in enumerate(names, 2):
        body += [f"fn=({i}) {n}", "1 10"]
    prof = cgp.parse_callgrind("events: Ir\n" + "\n".join(body) + "\ntotals: 130\n")
    got = dict(zip(prof.functions["function"], prof.functions["self"], strict=True))
    # f''2: the second activation of f' (its own quote kept, the recursion level merged)
    assert got == {"main": 10, "fib": 20, "leaf": 10, "work": 10, "f'": 20, "x'_42": 10,
                   "<method 'read' of 'file' objects>": 10,
                   "std::operator<< <char>(std::ostream&)": 10, "g<'a'>": 10,
                   "(below main)": 10, "h": 10}, got


def test_caller_contexts_merge_into_the_same_tables(tmp_path):
    """valgrind --separate-callers=2 --separate-recs=4 names every function once per caller
    chain and recursion level (``fib'3'work'main``, ``leaf'fib'work``): merged, the functions
    table and the call arcs are the ones of the same program profiled without the
    options, calls, self and inclusive cost alike."""
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed (build-essential)"
    exe = tmp_path / "fib"
    run([gcc, "-O1", "-g", "-fno-inline", "-o", exe, FIX / "fib.c"], timeout=60)
    profs = {}
    for name, extra in (("plain", []),
                        ("contexts", ["--separate-callers=2", "--separate-recs=4"])):
        out = tmp_path / f"{name}.out"
        run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *extra,
             "--toggle-collect=work", exe, "500"], timeout=120)
        profs[name] = cgp.parse_callgrind_file(out)
    names = {ln.split(")", 1)[-1].strip() for ln in
             (tmp_path / "contexts.out").read_text().splitlines()
             if ln.startswith(("fn=", "cfn="))}
    # a nested fib keeps the context of the outermost one: fib'3'work'main
    assert {"leaf'work'main", "fib'work'main", "fib'3'work'main", "leaf'fib'work"} <= names, \
        sorted(names)

    def table(p):
        return p.functions.set_index("function")[["calls", "self", "total"]].sort_index()

    pd.testing.assert_frame_equal(table(profs["plain"]), table(profs["contexts"]))
    pd.testing.assert_frame_equal(profs["plain"].call_edges, profs["contexts"].call_edges)
    f = table(profs["contexts"])
    assert f.loc["fib", "calls"] == 465 and f.loc["leaf", "calls"] == 500 + 233
    assert profs["contexts"].inclusive("work") == profs["contexts"].totals


THREADS_C = r"""
#include <pthread.h>
#include <stdio.h>
static pthread_barrier_t both;  /* both workers alive at once: two thread ids */
static long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
static void *worker(void *a) {
    long s = 0;
    pthread_barrier_wait(&both);
    for (int i = 0; i < 100; i++) s += fib((int)(long)a);
    return (void *)s;
}
int main(void) {
    pthread_t t[2]; long s = 0;
    pthread_barrier_init(&both, 0, 3);
    for (long i = 0; i < 2; i++) pthread_create(&t[i], 0, worker, (void *)(10 + i));
    pthread_barrier_wait(&both);
    for (int i = 0; i < 2; i++) { void *r; pthread_join(t[i], &r); s += (long)r; }
    printf("%ld\n", s); return 0;
}
"""


def test_separate_threads_files(tmp_path):
    """--separate-threads=yes: callgrind leaves the file it was given empty and writes one
    profile per thread beside it; the empty one says so, and the thread files add up to
    what valgrind collected, each worker's calls its own."""
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed (build-essential)"
    src = tmp_path / "threads.c"
    src.write_text(THREADS_C)
    exe = tmp_path / "threads"
    run([gcc, "-O1", "-g", "-fno-inline", "-pthread", "-o", exe, src], timeout=60)
    out = tmp_path / "cg.out"
    cp = run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
              "--separate-threads=yes", exe], timeout=120)
    assert cp.stdout.strip() == str(100 * (55 + 89))  # fib(10) + fib(11), 100 times
    collected = int(next(ln for ln in cp.stderr.splitlines() if "Collected" in ln).split()[-1])
    assert out.stat().st_size == 0
    with pytest.raises(ParseError, match=r"cg.out is empty, and 3 files beside it \(cg.out-01 "
                                         r"\.\.\. cg.out-03\) .*--separate-threads=yes"):
        cgp.parse_callgrind_file(out)
    profs = [cgp.parse_callgrind_file(tmp_path / f"cg.out-0{i}") for i in (1, 2, 3)]
    assert sum(p.totals for p in profs) == collected
    # fib(n) makes 2 fib(n+1) - 1 calls: 177 for fib(10), 287 for fib(11)
    calls = sorted(int(p.functions.set_index("function").loc["fib", "calls"])
                   for p in profs[1:])
    assert calls == [17700, 28700]
    assert "fib" not in set(profs[0].functions["function"])  # the main thread only waits


def test_real_cachegrind_file(tmp_path):
    """valgrind's cachegrind writes the same format without calls, name compression or
    totals: (its summary: line ends the file): read, every instruction counted."""
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed (build-essential)"
    exe = tmp_path / "fib"
    run([gcc, "-O1", "-g", "-fno-inline", "-o", exe, FIX / "fib.c"], timeout=60)
    out = tmp_path / "cachegrind.out"
    cp = run(["valgrind", "--tool=cachegrind", "--cache-sim=no",
              f"--cachegrind-out-file={out}", exe, "500"], timeout=120)
    refs = int(next(ln for ln in cp.stderr.splitlines() if "I refs:" in ln or
                    "I   refs:" in ln).split(":")[1].replace(",", ""))
    assert "totals:" not in out.read_text()
    prof = cgp.parse_callgrind_file(out)
    assert prof.totals == prof.summary == refs, (prof.totals, prof.summary, refs)
    f = prof.functions.set_index("function")
    assert f.loc["leaf", "self"] > 0 and f.loc["fib", "self"] > 0


def test_jump_target_names_fill_the_name_tables():
    """jfn=(id) name defines a function id that a later fn=(id) reuses."""
    text = ("# callgrind format\nevents: Ir\nfn=(1) main\n1 10\n"
            "jfi=(2) other.c\njfn=(3) helper\njump=4 +2\n* \n"
            "fl=(2)\nfn=(3)\n5 7\ntotals: 17\n")
    f = cgp.parse_callgrind(text).functions.set_index("function")
    assert f.loc["main", "self"] == 10 and f.loc["helper", "self"] == 7


def test_another_producer_another_event_no_totals():
    """Callgrind format from another producer (lsprofcalltree, pyprof2calltree, Xdebug):
    no 'Ir', no totals: line (the format makes it optional). The first event is read,
    the unit is its name, the total is the sum read; a file by valgrind without totals
    stays an error (test_truncated_file_strict_and_lenient)."""
    text = ("events: Ticks\nsummary: 130\nfi=a.py\nfn=f a:1\n1 100\ncfn=g a:9\n"
            "calls=3 9\n1 25\n\nfi=a.py\nfn=g a:9\n9 25\n")
    prof = cgp.parse_callgrind(text)
    assert prof.event == "Ticks" and prof.totals == 125 and prof.summary == 130
    f = prof.functions.set_index("function")
    assert f.loc["f a:1", "self"] == 100 and f.loc["f a:1", "total"] == 125
    assert f.loc["g a:9", "calls"] == 3 and set(f["unit"]) == {"Ticks"}
    with pytest.raises(ParseError, match="not 'Ir'"):
        cgp.parse_callgrind(text, event="Ir")


def test_an_object_id_never_defined_reads_as_unknown():
    """An old callgrind wrote cob=(8) with no line naming object 8: the object is '???'
    and the costs stay right (a function id never defined is still an error)."""
    text = ("# callgrind format\ncreator: callgrind-0.10.1\nevents: Ir\n"
            "ob=(1) /bin/prog\nfn=(1) main\n1 10\ncob=(8)\ncfn=(2) lib_fn\ncalls=2 1\n"
            "1 6\nob=(8)\nfn=(2)\n3 6\ntotals: 16\n")
    f = cgp.parse_callgrind(text).functions.set_index("function")
    assert f.loc["lib_fn", "module"] == "???" and f.loc["lib_fn", "self"] == 6
    assert f.loc["main", "module"] == "prog" and f.loc["main", "total"] == 16


def _fib_leafsum(n: int) -> int:
    """What fib.c's fib(n) returns: leaf(x) = 3x + 1 at the leaves (n < 2)."""
    if n < 2:
        return 3 * n + 1
    return _fib_leafsum(n - 1) + _fib_leafsum(n - 2)


# ---------------------------------------------------------------------------
# perf stat


def test_parse_perf_stat_csv():
    text = ("# started on Mon Nov 30 02:40:03 2026\n\n"
            "<not supported>,,instructions:u,0,100.00,,\n"
            "0.55,msec,task-clock,545070,100.00,0.436,CPUs utilized\n")
    assert perf_stat.parse_perf_stat_csv(text, "task-clock") == (0.55, "msec")
    with pytest.raises(ProbeError, match="no hardware performance counters"):
        perf_stat.parse_perf_stat_csv(text, "instructions:u")
    with pytest.raises(ProbeError, match="no line for event"):
        perf_stat.parse_perf_stat_csv(text, "cycles")
    assert perf_stat.parse_perf_stat_csv("4153264,,instructions:u,1095204,100.00,,\n",
                                   "instructions:u") == (4153264.0, "")


@pytest.mark.parametrize("flags, extra", [
    ([], set()),
    (["-r", "3"], {"variance_pct"}),
    (["-I", "100"], {"time_s"}),
    (["-a", "-A"], {"aggregate"}),
    (["-a", "--per-core"], {"aggregate", "aggregate_cpus"}),
    (["-a", "--per-socket"], {"aggregate", "aggregate_cpus"}),
    (["-a", "-A", "-I", "100"], {"time_s", "aggregate"}),
])
def test_real_perf_stat_layouts_keep_their_columns(tmp_path, flags, extra):
    """perf stat -x, with -r, -I, -A, --per-core, --per-socket: each layout's extra columns
    are read as such, and value, unit, event and % counted stay in their own columns
    (before, -I read the time stamp as the value and -r a run time as % counted)."""
    from profkit.parse.perf_stat import parse_perf_stat

    out = tmp_path / "stat.csv"
    run(["perf", "stat", "-x,", "-o", str(out), *flags, "-e", "task-clock,context-switches",
         "--", "sh", "-c", "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done"], timeout=120)
    df = parse_perf_stat(out)
    assert len(df) >= 2 and set(df["event"]) == {"task-clock", "context-switches"}, df
    assert extra <= set(df.columns), (extra, list(df.columns))
    assert not ({"variance_pct", "time_s", "aggregate", "aggregate_cpus"} - extra) & set(
        df.columns), list(df.columns)
    tc = df[df["event"] == "task-clock"]
    assert set(tc["unit"]) == {"msec"}, tc
    counted = df[df["supported"]]
    assert ((counted["runtime_pct"] > 0) & (counted["runtime_pct"] <= 100)).all(), df
    assert (tc.loc[tc["supported"], "value"] > 0).all(), tc
    if "time_s" in extra:
        assert (df["time_s"] > 0).all() and df["time_s"].is_monotonic_increasing, df
    if "aggregate" in extra:
        assert df["aggregate"].str.match(r"CPU\d+$|S\d+").all(), df
    if "aggregate_cpus" in extra:
        assert (df["aggregate_cpus"] >= 1).all(), df
    if "variance_pct" in extra:
        assert (df["variance_pct"] >= 0).all(), df


def test_perf_stat_availability_matches_perf():
    got = perf_stat.counts()
    cp = subprocess.run(["perf", "stat", "-x,", "-e", "instructions:u", "true"],
                        check=False, capture_output=True, text=True, timeout=30)
    supported = cp.returncode == 0 and "<not supported>" not in cp.stderr
    assert got is supported
    assert perf_stat.instruction_counter() == ("perf_stat" if supported else "callgrind")


# ---------------------------------------------------------------------------
# collector input checks that need no server


def test_sql_statement_for_single_user_mode():
    assert cgc._sql_statement("SELECT 1;") == "SELECT 1;\n\n"
    assert cgc._sql_statement("SELECT\n\n  1\n") == "SELECT\n  1;\n\n"
    with pytest.raises(cgc.CallgrindError, match="empty"):
        cgc._sql_statement("  ;  ")


def test_collect_rejects_non_datadir(tmp_path):
    from profkit.pg.cluster import ensure_os_user

    with pytest.raises(cgc.CallgrindError, match="not a PostgreSQL data directory"):
        cgc.collect_callgrind(postgres="/bin/true", datadir=tmp_path, os_user=ensure_os_user(),
                              queries={"plain": "SELECT 1"}, out_dir=tmp_path / "o")
    with pytest.raises(cgc.CallgrindError, match="no queries"):
        cgc.collect_callgrind(postgres="/bin/true", datadir=tmp_path, os_user=ensure_os_user(),
                              queries={}, out_dir=tmp_path / "o")


# ---------------------------------------------------------------------------
# a real PostgreSQL backend under callgrind

CG_SCALE = 0.01  # 200,000 rows through the nested loop; ~1-2 s per query under callgrind


@pytest.fixture(scope="module")
def cg_cluster(vanilla_build):
    """A cluster of its own: collect_callgrind_cluster stops and restarts it, which must
    not disturb the session's shared pg_cluster."""
    from profkit.pg.cluster import Cluster
    from profkit.pg.workloads import get_workload

    wl = get_workload("nested_loop")
    with Cluster(vanilla_build, name="test-callgrind") as cl:
        with cl.connect() as conn:
            wl.load(conn, CG_SCALE)
        yield cl


@pytest.fixture(scope="module")
def cg_sessions(cg_cluster, tmp_path_factory):
    from profkit.pg.workloads import get_workload

    wl = get_workload("nested_loop")
    out = []
    for i in range(2):
        d = tmp_path_factory.mktemp(f"callgrind{i}")
        out.append(cgc.collect_callgrind_cluster(cg_cluster, wl.queries, d, timeout=600))
    return out


@pytest.mark.pg
def test_instruction_counts_order_and_repeat(cg_sessions, cg_cluster):
    t1 = cgp.instr_counts_from_session(cg_sessions[0], build="vanilla", workload="nested_loop")
    t2 = cgp.instr_counts_from_session(cg_sessions[1].out_dir, build="vanilla",
                                       workload="nested_loop")  # read back from disk
    assert list(t1["mode"]) == ["plain", "analyze_notiming", "analyze_timing"]
    n1 = t1.set_index("mode")["instructions"]
    n2 = t2.set_index("mode")["instructions"]
    assert n1["plain"] < n1["analyze_notiming"] < n1["analyze_timing"]
    ex = t1.set_index("mode")["executor_instructions"]
    assert ex["plain"] < ex["analyze_notiming"] < ex["analyze_timing"]
    assert (ex <= n1).all()
    # ~450 instructions per row through the nested loop on PostgreSQL 18 at -O2
    assert 200 * 200_000 < n1["plain"] < 1000 * 200_000
    ov = (n1["analyze_notiming"] / n1["plain"] - 1) * 100
    assert 15 < ov < 40, ov  # 26.2 % measured on vanilla 18.6
    # stable: the same to within 0.1 % (in practice to a few hundred instructions)
    for m in n1.index:
        assert abs(n2[m] - n1[m]) / n1[m] < 1e-3
    assert set(t1["tool"]) == {"callgrind"} and set(t1["scope"]) == {"exec_simple_query"}
    # the cluster is back up after the single-user runs
    with cg_cluster.connect() as conn:
        assert conn.execute("SELECT count(*) FROM test3").fetchone()[0] == 350


@pytest.mark.pg
def test_profiles_hold_exact_call_counts(cg_sessions):
    s = cg_sessions[0]
    by_mode = {q.mode: q for q in s.queries}
    plain = cgp.parse_callgrind_file(by_mode["plain"].out_file)
    f = plain.functions.set_index("function")
    rows = 400 * 500  # (350 + 50 matches of test1 x test3) x 500 rows of test2
    assert f.loc["ExecNestLoop", "calls"] == rows + 1
    assert "ExecProcNodeInstr" not in f.index  # no instrumentation in the plain query
    notiming = cgp.parse_callgrind_file(by_mode["analyze_notiming"].out_file)
    g = notiming.functions.set_index("function")
    assert g.loc["InstrStopNode", "calls"] == g.loc["InstrStartNode", "calls"]
    assert g.loc["InstrStopNode", "calls"] >= 2 * rows
    # the call graph of a real backend, read as callgrind_annotate reads it
    edges = edges_of(notiming)
    assert edges[("ExecProcNodeInstr", "ExecNestLoop")] == rows + 1
    assert edges == annotate_arcs(by_mode["analyze_notiming"].out_file)
    timing = cgp.parse_callgrind_file(by_mode["analyze_timing"].out_file)
    h = timing.functions
    clock = h[h["function"].str.startswith("clock_gettime")]
    # two clock reads per instrumented node call with TIMING on, none with it off
    assert int(clock["calls"].sum()) >= 2 * int(g.loc["InstrStopNode", "calls"])
    # TIMING off: only EXPLAIN's own few clock reads (planning/execution time), not per row
    off = g[g.index.str.startswith("clock_gettime")]
    assert int(off["calls"].sum()) < 50
    # session metadata on disk
    loaded = cgc.CallgrindSession.load(s.out_dir)
    assert loaded == s
    assert s.provenance()["instruction_counter"] == "callgrind"
    assert all(q.seconds > 0 for q in s.queries)


@pytest.mark.pg
def test_running_cluster_datadir_is_refused(cg_cluster, tmp_path):
    with pytest.raises(ClusterError, match="in use by a running postmaster"):
        cgc.collect_callgrind(postgres=cg_cluster.build.postgres, datadir=cg_cluster.datadir,
                              os_user=cg_cluster.os_user, queries={"plain": "SELECT 1"},
                              out_dir=tmp_path)


@pytest.mark.pg
def test_failing_statement_is_reported(cg_cluster, tmp_path):
    with pytest.raises(cgc.CallgrindError, match="statement failed"):
        cgc.collect_callgrind_cluster(cg_cluster, {"plain": "SELECT * FROM no_such_table"},
                                      tmp_path, warmup_sql=None)
    assert (tmp_path / "single-user.out").exists()  # the backend's output is kept
    with cg_cluster.connect() as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1


def _counts(session) -> dict[str, int]:
    t = cgp.instr_counts_from_session(session, build="vanilla", workload="nested_loop")
    return dict(zip(t["mode"], (int(n) for n in t["instructions"]), strict=True))


@pytest.mark.pg
def test_uninstrumented_warmup_counts_what_an_instrumented_one_does(cg_sessions, cg_cluster,
                                                                    tmp_path):
    """Start-up and warm-up without instrumentation (vgdb switches it on before the
    counted statements) leave the counts as a session instrumented from the start has
    them: the program does the same work either way."""
    from profkit.pg.workloads import get_workload

    fast = cg_sessions[0]
    assert fast.warmup_instrumented is False
    assert fast.provenance()["warmup_instrumented"] is False
    assert "--instr-atstart=no" in fast.argv
    whole = cgc.collect_callgrind_cluster(cg_cluster, get_workload("nested_loop").queries,
                                          tmp_path, timeout=600, instrument_warmup=True)
    assert whole.warmup_instrumented is True and "--instr-atstart=no" not in whole.argv
    # the instrumented warm-up leaves its profile; the uninstrumented one has none
    assert (tmp_path / "callgrind._warmup.out").is_file()
    assert not (Path(fast.out_dir) / "callgrind._warmup.out").exists()
    a, b = _counts(fast), _counts(whole)
    assert list(a) == list(b) == ["plain", "analyze_notiming", "analyze_timing"]
    for m in a:  # measured: within a few hundred to ~1,500 instructions of ~100-300 M
        assert abs(a[m] - b[m]) / b[m] < 1e-4, (m, a[m], b[m])
    assert all(q.seconds > 0 for q in whole.queries)


@pytest.mark.pg
def test_vgdb_that_cannot_switch_falls_back_to_instrumenting_all(cg_sessions, cg_cluster,
                                                                 tmp_path, monkeypatch):
    """Where vgdb cannot reach valgrind (no ptrace: a container, a hardened kernel) the
    backend ends after the warm-up and the session runs instrumented from the start.
    vgdb's refusal is simulated (a vgdb first on PATH that fails as a refused one does):
    this machine lets vgdb attach."""
    from profkit.pg.workloads import get_workload

    import tempfile

    fake = Path(tempfile.mkdtemp(prefix="profkit-fake-vgdb-"))  # the cluster's user runs it
    fake.chmod(0o755)
    (fake / "vgdb").write_text("#!/bin/sh\necho 'vgdb error: ptrace attach failed' >&2\n"
                               "exit 1\n")
    (fake / "vgdb").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    try:
        s = cgc.collect_callgrind_cluster(cg_cluster, get_workload("nested_loop").queries,
                                          tmp_path / "out", timeout=600)
    finally:
        shutil.rmtree(fake)
    assert s.warmup_instrumented is True and "--instr-atstart=no" not in s.argv
    a, b = _counts(s), _counts(cg_sessions[0])
    for m in b:
        assert abs(a[m] - b[m]) / b[m] < 1e-4, (m, a[m], b[m])
    with cg_cluster.connect() as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1


@pytest.mark.pg
@pytest.mark.parametrize("warmup, message", [
    ("SELECT * FROM no_such_table", "statement failed"),
    # the backend ends itself in the warm-up, before instrumentation is switched on
    ("SELECT pg_terminate_backend(pg_backend_pid())", "under valgrind exited with 1"),
])
def test_warmup_that_fails_is_reported(cg_cluster, tmp_path, warmup, message):
    with pytest.raises(cgc.CallgrindError, match=message):
        cgc.collect_callgrind_cluster(cg_cluster, {"plain": "SELECT 1"}, tmp_path,
                                      warmup_sql=warmup, timeout=300)
    assert (tmp_path / "single-user.out").exists()  # the backend's output is kept
    with cg_cluster.connect() as conn:  # the cluster runs again
        assert conn.execute("SELECT 1").fetchone()[0] == 1


_COUNT_IN_A_CHILD = """
import sys
from profkit.collect import callgrind as cgc
from profkit.processes import OSUser
postgres, datadir, name, uid, gid, home, out = sys.argv[1:]
cgc.collect_callgrind(postgres=postgres, datadir=datadir, out_dir=out,
                      os_user=OSUser(name, int(uid), int(gid), home),
                      queries={"plain": "SELECT 1"}, warmup_sql="SELECT pg_sleep(120)")
"""


@pytest.mark.pg
def test_ctrl_c_in_the_uninstrumented_warmup_stops_valgrind(cg_cluster, tmp_path):
    """Ctrl-C while the backend runs its warm-up under valgrind (uninstrumented, fed
    through a pipe): the valgrind profkit started is stopped by pid, and the cluster
    starts again on its data directory."""
    import signal
    import sys
    import time

    from proc_helpers import alive, proc_text, start_ticks

    u = cg_cluster.os_user
    with cgc.postmaster_stopped(cg_cluster) as datadir:
        p = subprocess.Popen(
            [sys.executable, "-c", _COUNT_IN_A_CHILD, str(cg_cluster.build.postgres),
             str(datadir), u.name, str(u.uid), str(u.gid), u.home, str(tmp_path / "out")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 60
            vg = []
            while not vg and time.monotonic() < deadline and p.poll() is None:
                vg = [c for c in children(p.pid)
                      if "valgrind" in proc_text(c, "cmdline")
                      or "callgrind" in proc_text(c, "comm")]
                time.sleep(0.1)
            # the child's own error, when it ended before starting valgrind
            assert vg, ("valgrind did not start", p.poll() is not None and p.communicate()[1])
            time.sleep(3)  # start-up done: the backend sleeps in its warm-up
            vg_start = start_ticks(vg[0])
            assert alive(vg[0], vg_start) and p.poll() is None
            p.send_signal(signal.SIGINT)
            _out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
        deadline = time.monotonic() + 10
        while alive(vg[0], vg_start) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(vg[0], vg_start)
    with cg_cluster.connect() as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1


@pytest.mark.pg
def test_perf_stat_mechanism_on_a_backend(cg_cluster, tmp_path):
    """perf stat attached to a backend around one query; task-clock stands in for
    instructions, which this VM's perf cannot count (no hardware counters)."""
    from profkit.pg.workloads import get_workload

    sql = get_workload("nested_loop").select_sql
    with cg_cluster.connect() as conn:
        pid = cg_cluster.backend_pid(conn)
        ms = perf_stat.perf_stat_instructions(pid, lambda: conn.execute(sql).fetchall(),
                                        out_path=tmp_path / "perf-stat.csv", event="task-clock")
    assert ms > 1.0  # the query ran ~10+ ms of CPU in that backend


def test_a_child_run_as_another_user_keeps_only_a_temp_folder_it_can_use(tmp_path,
                                                                         monkeypatch):
    """root's own TMPDIR (pam_tmpdir's /tmp/user/0, 0700) does not reach a child run as
    the clusters' user; a shared one (1777, as /tmp) or the user's own does."""
    from profkit.processes import OSUser, child_env

    if os.geteuid() != 0:
        pytest.fail("runs as root, as make test does (the children change user)")
    from profkit import paths

    user = OSUser("nobody", 65534, 65534, "/nonexistent")
    # reachable by all, as /tmp is, also under a private TMPDIR (pam_tmpdir's 0700 one)
    base = paths.scratch_for_another_user("profkit-tmpdir-rule-")
    try:
        os.chmod(base, 0o755)
        private, shared, own = (base / n for n in ("private", "shared", "own"))
        for d, mode in ((private, 0o700), (shared, 0o1777), (own, 0o700)):
            d.mkdir()
            os.chmod(d, mode)
        os.chown(own, 65534, 65534)
        hidden = private / "own"  # the user's own, but inside root's private folder
        hidden.mkdir()
        os.chown(hidden, 65534, 65534)
        for d, kept in ((private, False), (shared, True), (own, True), (hidden, False),
                        (base / "missing", False)):
            monkeypatch.setenv("TMPDIR", str(d))
            assert ("TMPDIR" in child_env(user=user)) == kept, d
            assert child_env()["TMPDIR"] == str(d)  # a child that stays root keeps it
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.pg
def test_callgrind_under_a_private_temp_folder(cg_cluster, tmp_path, monkeypatch):
    """valgrind, as the clusters' user, once failed to start when the caller's TMPDIR was
    root's own ("Can't create client cmdline file"; "Cannot create log file" in profkit's
    scratch folder there): it now gets neither that TMPDIR nor a scratch folder in it."""
    import tempfile

    private = tmp_path / "private-tmp"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    assert tempfile.gettempdir() == str(private)
    s = cgc.collect_callgrind_cluster(cg_cluster, {"plain": "SELECT 1"}, tmp_path / "cg",
                                      timeout=300)
    t = cgp.instr_counts_from_session(s, build="vanilla", workload="select1")
    assert list(t["mode"]) == ["plain"] and int(t["instructions"].iloc[0]) > 0
    assert sorted(p.name for p in private.iterdir()) == []
