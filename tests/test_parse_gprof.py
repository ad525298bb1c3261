"""gprof report parsing, on reports recorded here and the seed's excerpt
(tests/fixtures/gprof/README.md says how each was made)."""
from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from profkit import tables
from profkit.cli.parse import parse_group
from profkit.errors import ParseError
from profkit.parse.gprof import SPONTANEOUS, parse_gprof

FIX = Path(__file__).parent / "fixtures" / "gprof"


def _csv(df: pd.DataFrame) -> str:
    return df.to_csv(index=False, lineterminator="\n")


@pytest.mark.parametrize("name,module", [
    ("cycles", "prog"), ("seed-query2-excerpt", "postgres"), ("seed-query1-excerpt", "postgres"),
])
def test_tables_match_committed_expected(name: str, module: str) -> None:
    # the seed's excerpts stop after their last flat row: excerpts, so not strict
    prof = parse_gprof(FIX / f"{name}.gprof.txt", run_id="r1", build="b1", module=module,
                       strict=name == "cycles")
    assert _csv(prof.functions) == (FIX / f"expected_{name}_functions.csv").read_text()
    edges = FIX / f"expected_{name}_call_edges.csv"
    if edges.exists():
        assert _csv(prof.call_edges) == edges.read_text()
    assert prof.flat_csv() == (FIX / f"expected_{name}_flat.csv").read_text()


def test_flat_profile_values() -> None:
    prof = parse_gprof(FIX / "cycles.gprof.txt")
    f = prof.functions.set_index("function")
    assert list(prof.functions.columns[: len(tables.SCHEMAS["functions"])]) == list(
        tables.SCHEMAS["functions"])
    assert prof.sample_seconds == 0.01
    # built without -pg: time samples, no call count
    assert pd.isna(f.loc["uncounted_work", "calls"])
    assert f.loc["uncounted_work", "self_seconds"] == 0.31
    assert f.loc["uncounted_work", "percent_time"] == 88.71
    assert f.loc["leaf", "calls"] == 8040
    assert f.loc["leaf", "cumulative_seconds"] == 0.34
    assert f.loc["leaf", "self_s_per_call"] == pytest.approx(3.74e-6)   # us/call header
    # the flat profile counts fib's non-recursive calls; the recursion is in the graph
    assert f.loc["fib", "calls"] == 40 and f.loc["fib", "recursive_calls"] == 6001920
    assert f.loc["ping", "cycle"] == 1 and f.loc["pong", "cycle"] == 1
    assert pd.isna(f.loc["leaf", "cycle"])
    # main is only in the call graph (no samples, called from outside the profile)
    assert not f.loc["main", "in_flat"] and pd.isna(f.loc["main", "calls"])
    assert f.loc["main", "total"] == pytest.approx(0.04)
    assert "<cycle 1 as a whole>" not in f.index


def test_call_graph_edges() -> None:
    e = parse_gprof(FIX / "cycles.gprof.txt").call_edges
    assert list(e.columns[: len(tables.SCHEMAS["call_edges"])]) == list(
        tables.SCHEMAS["call_edges"])
    edges = {(r.caller, r.callee): r.calls for r in e.itertuples()}
    assert edges[("main", "ping")] == 40
    assert edges[("ping", "leaf")] == 4000 and edges[("pong", "leaf")] == 4000
    assert edges[("middle", "leaf")] == 40
    assert edges[("ping", "pong")] == 4000 and edges[("pong", "ping")] == 4000  # in-cycle
    assert edges[("fib", "fib")] == 6001920                                      # recursion
    assert pd.isna(edges[(SPONTANEOUS, "main")])
    # calls into leaf add up to its flat-profile count
    into_leaf = e[e["callee"] == "leaf"]
    assert into_leaf["calls"].sum() == 8040
    assert set(into_leaf["total_calls"]) == {8040}


def test_edges_agree_with_gprof2dot() -> None:
    """gprof2dot's GprofParser (an independent implementation) reads the same edges."""
    import gprof2dot
    with open(FIX / "cycles.gprof.txt") as f:
        prof2 = gprof2dot.GprofParser(f).parse()
    theirs = {}
    for fn in prof2.functions.values():
        for call in fn.calls.values():
            theirs[(fn.name, prof2.functions[call.callee_id].name)] = call[gprof2dot.CALLS]
    e = parse_gprof(FIX / "cycles.gprof.txt").call_edges
    ours = {(r.caller, r.callee): int(r.calls) for r in e.itertuples() if not pd.isna(r.calls)}
    assert ours == theirs


def test_brief_flat_only_and_callgraph_only_variants_agree() -> None:
    full = parse_gprof(FIX / "cycles.gprof.txt")
    brief = parse_gprof(FIX / "cycles.brief.gprof.txt")
    pd.testing.assert_frame_equal(full.functions, brief.functions)
    pd.testing.assert_frame_equal(full.call_edges, brief.call_edges)
    flat = parse_gprof(FIX / "cycles.flat-only.gprof.txt", strict=False)  # gprof -b -p
    assert flat.has_flat and not flat.has_call_graph and flat.call_edges.empty
    assert flat.flat_csv() == full.flat_csv()
    cg = parse_gprof(FIX / "cycles.callgraph-only.gprof.txt")
    assert cg.has_call_graph and not cg.has_flat
    pd.testing.assert_frame_equal(cg.call_edges, full.call_edges)
    g = cg.functions.set_index("function")
    assert g.loc["leaf", "calls"] == 8040 and g.loc["leaf", "self_seconds"] == 0.03
    assert math.isnan(g.loc["leaf", "percent_time"])


def test_seed_excerpt_instrumentation_calls() -> None:
    """The seed's Query-2 flat profile: the three instrumentation functions run ~4e9 times."""
    f = parse_gprof(FIX / "seed-query2-excerpt.gprof.txt", strict=False).functions.set_index("function")
    assert f.loc["InstrStartNode", "calls"] == 4000215014
    assert f.loc["InstrStopNode", "calls"] == 4000215014
    assert f.loc["ExecProcNodeInstr", "calls"] == 4000215015
    assert pd.isna(f.loc["_init", "calls"])                    # gprof shows none
    assert f.loc["ExecAgg", "self_s_per_call"] == 2.11         # s/call header
    assert f.loc["ExecAgg", "total_s_per_call"] == 12.75
    assert f.loc["fetch_input_tuple", "cumulative_seconds"] == 161.72
    q1 = parse_gprof(FIX / "seed-query1-excerpt.gprof.txt", strict=False).functions
    assert "InstrStartNode" not in set(q1["function"])


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le-bom", "utf-16-be-bom", "utf-8-sig",
                                      "crlf"])
def test_windows_encodings_read_like_the_original(tmp_path: Path, encoding: str) -> None:
    """What Windows writes: PowerShell's `gprof prog.exe gmon.out > report.txt` is UTF-16
    with a byte-order mark and CRLF line ends; Notepad adds a UTF-8 byte-order mark. The
    tables are those of the same report as Unix text."""
    text = (FIX / "cycles.gprof.txt").read_text()
    crlf = text.replace("\n", "\r\n")
    data = {"utf-16": crlf.encode("utf-16"),
            "utf-16-le-bom": b"\xff\xfe" + crlf.encode("utf-16-le"),
            "utf-16-be-bom": b"\xfe\xff" + crlf.encode("utf-16-be"),
            "utf-8-sig": text.encode("utf-8-sig"),
            "crlf": crlf.encode()}[encoding]
    path = tmp_path / "report.txt"
    path.write_bytes(data)
    want = parse_gprof(FIX / "cycles.gprof.txt")
    got = parse_gprof(path)
    assert len(got.functions) == 7
    pd.testing.assert_frame_equal(got.functions, want.functions)
    pd.testing.assert_frame_equal(got.call_edges, want.call_edges)


# A BSD-style report (the layout of macOS's and AIX's gprof, which cannot run here; written
# for this test): the call graph header says "descendents" and "called+self" over three
# lines, flat profile names end with their index, "(N)" for one the call graph omits.
BSD_REPORT = """\
granularity: each sample hit covers 4 byte(s) for 0.86% of 1.16 seconds

                                  called/total       parents
index  %time    self descendents  called+self    name    \tindex
                                  called/total       children

                                                     <spontaneous>
[1]     99.1    0.00        1.15                 start [1]
                0.44        0.71       1/1           main [2]

-----------------------------------------------

                0.44        0.71       1/1           start [1]
[2]     99.1    0.44        0.71       1         main [2]
                0.58        0.13    1024/1024        fft [3]

-----------------------------------------------

                0.58        0.13    1024/1024        main [2]
[3]     61.2    0.58        0.13    1024         fft [3]

-----------------------------------------------

\f
flat profile:

granularity: each sample hit covers 4 byte(s) for 0.86% of 1.16 seconds

  %   cumulative   self              self     total
 time   seconds   seconds    calls  ms/call  ms/call  name
 50.0       0.58     0.58     1024     0.57     0.69  fft [3]
 37.9       1.02     0.44        1   440.00  1150.00  main [2]
 11.2       1.15     0.13                             mcount (4)

\f
Index by function name

   [3] fft                    [2] main                  (4) mcount
"""


def test_bsd_report_call_graph_and_indexed_names(tmp_path: Path) -> None:
    path = tmp_path / "bsd.txt"
    path.write_text(BSD_REPORT)
    prof = parse_gprof(path)
    f = prof.functions.set_index("function")
    assert sorted(f.index) == ["fft", "main", "mcount", "start"]
    assert f.loc["fft", "calls"] == 1024 and f.loc["fft", "self"] == 0.58
    assert pd.isna(f.loc["mcount", "calls"]) and f.loc["mcount", "self"] == 0.13
    assert f.loc["main", "total"] == pytest.approx(1.15)
    e = {(r.caller, r.callee): r.calls for r in prof.call_edges.itertuples()}
    assert e[("main", "fft")] == 1024 and e[("start", "main")] == 1
    assert pd.isna(e[(SPONTANEOUS, "start")])


def test_empty_report() -> None:
    prof = parse_gprof(FIX / "empty.gprof.txt")
    assert prof.functions.empty and prof.call_edges.empty
    assert list(prof.functions.columns[: len(tables.SCHEMAS["functions"])]) == list(
        tables.SCHEMAS["functions"])
    assert list(prof.call_edges.columns[:5]) == list(tables.SCHEMAS["call_edges"])
    assert prof.flat_csv() == "name,calls,self_seconds,cumulative_seconds,percent_time\n"


@pytest.mark.parametrize("name,message", [
    ("truncated-midline", r"line 16: the gprof report is truncated: the line ends without a newline"),
    ("truncated-callgraph", (r"truncated: the call graph entry starting at line 70 has no "
                            r"closing '-----' separator")),
    ("truncated-at-entry", r"truncated: the call graph is not followed by a form feed or 'Index by "
                           r"function"),
    ("noheader", r"not a gprof report: no flat profile header"),
])
def test_bad_reports(name: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_gprof(FIX / f"{name}.gprof.txt")


@pytest.mark.parametrize("name", ["cycles.gprof.txt", "cycles.brief.gprof.txt"])
def test_last_line_without_its_newline(tmp_path: Path, name: str) -> None:
    """A whole report whose last line (in the index, gprof's last section) lost its
    newline, as a pasted one may, reads like the original; one cut inside a flat row does
    not, nor does `gprof -b -p` output (its last line is a row, whose name may be cut)."""
    text = (FIX / name).read_bytes()
    assert text.endswith(b"\n")
    f = tmp_path / name
    f.write_bytes(text.rstrip(b"\n"))
    a, b = parse_gprof(FIX / name), parse_gprof(f)
    pd.testing.assert_frame_equal(a.functions, b.functions)
    pd.testing.assert_frame_equal(a.call_edges, b.call_edges)
    assert len(a.functions) > 3
    # cut inside the name of the flat profile's third row: refused, strict or not
    lines = text.decode().splitlines(keepends=True)
    first = next(i for i, ln in enumerate(lines) if ln.strip().startswith("time"))
    cut = "".join(lines[:first + 3]) + lines[first + 3][:-3]
    f.write_text(cut)
    for strict in (True, False):
        with pytest.raises(ParseError, match=rf"line {first + 4}: the gprof report is "
                                             r"truncated: the line ends without a newline"):
            parse_gprof(f, strict=strict)
    f.write_bytes((FIX / "cycles.flat-only.gprof.txt").read_bytes().rstrip(b"\n"))
    with pytest.raises(ParseError, match="truncated: the line ends without a newline"):
        parse_gprof(f, strict=False)


@pytest.mark.parametrize("name", ["cycles.gprof.txt", "cycles.brief.gprof.txt",
                                  "cycles.callgraph-only.gprof.txt"])
def test_call_graph_closed_without_its_index(tmp_path: Path, name: str) -> None:
    """A report that stops after what gprof writes to close the call graph (its form
    feed, or its explanation in the full layout) has the whole call graph: it reads like
    the original, strictly, with or without the form feed's newline.  BSD gprofs' reports
    and excerpts of them end this way.  Cut at the last entry's '-----' it is refused."""
    lines = (FIX / name).read_text().split("\n")  # not splitlines: it splits at \f too
    lines = [ln + "\n" for ln in lines[:-1]]
    whole = parse_gprof(FIX / name)
    assert len(whole.call_edges) >= 5
    index = next(i for i, ln in enumerate(lines) if ln.startswith("Index by function name"))
    assert lines[index - 1].strip("\n") == "\f"
    f = tmp_path / name
    cuts = {"after the form feed": "".join(lines[:index]),
            "the form feed without its newline": "".join(lines[:index]).rstrip("\n")}
    expl = [i for i, ln in enumerate(lines) if ln.startswith(" This table describes")]
    if expl:  # the full layout: cut inside the explanation, mid-line
        cuts["inside the explanation"] = "".join(lines[:expl[0] + 3]) + lines[expl[0] + 3][:9]
    assert len(cuts) == (3 if name == "cycles.gprof.txt" else 2)
    for why, text in cuts.items():
        f.write_text(text)
        got = parse_gprof(f)
        pd.testing.assert_frame_equal(got.call_edges, whole.call_edges, obj=why)
        pd.testing.assert_frame_equal(got.functions, whole.functions, obj=why)
    last_sep = max(i for i, ln in enumerate(lines[:index]) if ln.startswith("-----"))
    f.write_text("".join(lines[:last_sep + 1]))
    with pytest.raises(ParseError, match="the call graph is not followed by a form feed"):
        parse_gprof(f)


def test_report_in_cycles(tmp_path: Path) -> None:
    """A gprof that counts cycles (an embedded target's: Xtensa) prints "cycles" where GNU
    prints "seconds", under a line of multipliers "(K)" (thousands), and a call graph header
    without "time".  Made here from the real brief report by changing only its headers:
    the same calls and edges, each time figure read as thousands of cycles, in columns
    named for cycles."""
    text = (FIX / "cycles.brief.gprof.txt").read_text()
    flat_head = ("  %   cumulative   self              self     total           \n"
                 " time   seconds   seconds    calls  us/call  us/call  name    \n")
    cg_head = "index % time    self  children    called     name\n"
    assert flat_head in text and cg_head in text
    cyc = (text.replace("Each sample counts as 0.01 seconds.\n", "")
           .replace(flat_head, "                                         self      total\n"
                    "     cumulative       self             cycles     cycles\n"
                    "  %      cycles     cycles    calls     /call      /call  name\n"
                    "           (K)        (K)                (K)        (K)\n")
           .replace(cg_head, "index    %      self  children    called     name\n"
                    "                (K)     (K) \n"))
    f = tmp_path / "xtensa.gprof.txt"
    f.write_text(cyc)
    sec, got = parse_gprof(FIX / "cycles.brief.gprof.txt"), parse_gprof(f)
    assert (sec.time_unit, got.time_unit) == ("seconds", "cycles")
    fs, fc = sec.functions, got.functions
    assert "self_seconds" not in fc and "children_seconds" not in got.call_edges
    assert list(fc["function"]) == list(fs["function"]) and len(fc) == 7
    assert fc["calls"].equals(fs["calls"]) and set(fc["unit"]) == {"cycles"}
    # 0.31 (K) -> 310 cycles; 250.38 (K)/call -> 250,380 cycles per call
    assert list(fc["self_cycles"]) == [round(v * 1000, 6) for v in fs["self_seconds"]]
    assert list(fc["self"]) == list(fc["self_cycles"])
    assert list(fc["cumulative_cycles"].dropna()) == \
        [round(v * 1000, 6) for v in fs["cumulative_seconds"].dropna()]
    assert fc.loc[fc["function"] == "fib", "self_cycles_per_call"].item() == 250380.0
    assert fc["total"].dropna().round(6).tolist() == (fs["total"].dropna() * 1000).round(6).tolist()
    es, ec = sec.call_edges, got.call_edges
    assert list(zip(ec["caller"], ec["callee"], ec["calls"], strict=True)) == \
        list(zip(es["caller"], es["callee"], es["calls"], strict=True)) and len(ec) >= 8
    assert ec["children_cycles"].dropna().tolist() == \
        (es["children_seconds"].dropna() * 1000).round(6).tolist()
    assert got.flat_csv().splitlines()[:2] == [
        "name,calls,self_cycles,cumulative_cycles,percent_time", "uncounted_work,,310.0,310.0,88.71"]
    r = CliRunner().invoke(parse_group, ["gprof", str(f), "--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.output)["flat_profile"][1]
    assert row == {"name": "leaf", "calls": 8040, "self_cycles": 30.0,
                   "cumulative_cycles": 340.0, "percent_time": 8.58}


def test_trimmed_report_non_strict() -> None:
    prof = parse_gprof(FIX / "truncated-at-entry.gprof.txt", strict=False)
    assert len(prof.functions) == 7  # the flat profile is complete
    assert ("ping", "leaf") in {(r.caller, r.callee) for r in prof.call_edges.itertuples()}


def test_garbled_flat_row_names_the_line() -> None:
    text = (FIX / "cycles.flat-only.gprof.txt").read_text().replace(
        "  8.58      0.34     0.03     8040", "  8.58      0.34     zz.zz     8040")
    with pytest.raises(ParseError, match=r"line 7: expected a flat profile row"):
        parse_gprof(io.StringIO(text))


def test_gmon_out_instead_of_text() -> None:
    with pytest.raises(ParseError, match="not gmon.out itself"):
        parse_gprof(io.BytesIO(b"gmon\x01\x00\x00\x00binary junk\n"))


def test_cli_flat_and_call_graph() -> None:
    runner = CliRunner()
    r = runner.invoke(parse_group, ["gprof", "--no-strict",
                                    str(FIX / "seed-query2-excerpt.gprof.txt")])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "name,calls,self_seconds,cumulative_seconds,percent_time"
    assert lines[1] == "ExecInterpExpr,4000040003,36.39,36.39,21.24"
    assert lines[2] == "_init,,26.6,62.99,15.53"
    r = runner.invoke(parse_group, ["gprof", "--call-graph", str(FIX / "cycles.gprof.txt")])
    assert r.exit_code == 0
    assert r.output.splitlines()[0] == "caller,callee,calls"
    assert "fib,fib,6001920" in r.output.splitlines()
    assert "<spontaneous>,main," in r.output.splitlines()
    r = runner.invoke(parse_group, ["gprof", str(FIX / "noheader.gprof.txt")])
    assert r.exit_code == 1 and "not a gprof report" in r.output  # a failure, not usage


def test_real_postgres_report():
    """A real report: `gprof postgres gmon.out` of one backend of the gprof preset
    build (PostgreSQL 18.6) running nested_loop's Query-2 at scale 0.01, recorded
    with `profkit gprof vanilla --scale 0.01`.  The plan's rows and loops predict
    403,316 InstrStartNode/InstrStopNode calls (rows + loops per node, one pair
    per loop for Hash, one pair per node at ExecShutdownNode).  ExecProcNodeInstr
    is not called for the 8 shutdown pairs nor for Hash's MultiExecHash pair, but
    gprof credits it 8 calls of the local symbol ExecShutdownNode_walker.part.0,
    which it drops: 403,316 - 8 - 1 + 8.  Call graph indices
    reach five digits there (gprof cuts "[10000]" to 6 characters)."""
    import gzip

    path = FIX / "pg18-query2.gprof.txt.gz"
    with gzip.open(path, "rt") as f:
        prof = parse_gprof(f, module="postgres")
    calls = prof.functions.set_index("function")["calls"]
    assert calls["InstrStartNode"] == calls["InstrStopNode"] == 403_316
    assert calls["ExecProcNodeInstr"] == 403_316 - 8 - 1 + 8
    flat = pd.read_csv(FIX / "expected_pg18-query2_flat.csv")
    # the functions table also lists the few functions seen only in the call graph;
    # static functions of the same name in two files appear twice (check_role)
    from collections import Counter

    def pairs(names, cs):
        return Counter((n, None if pd.isna(c) else int(c)) for n, c in zip(names, cs, strict=True))

    want = pairs(flat["name"], flat["calls"])
    got = pairs(prof.functions["function"], prof.functions["calls"])
    assert len(flat) > 2000 and not (want - got)
    edges = pd.read_csv(FIX / "expected_pg18-query2_edges.csv")
    assert len(prof.call_edges) == len(edges)
    got = set(zip(prof.call_edges["caller"], prof.call_edges["callee"], strict=True))
    assert got == set(zip(edges["caller"], edges["callee"], strict=True))
    # the same report through the text CLI gives the committed CSV byte for byte
    with gzip.open(path, "rt") as f:
        text = f.read()
    r = CliRunner().invoke(parse_group, ["gprof", "-"], input=text)
    assert r.exit_code == 0, r.output
    assert r.output == (FIX / "expected_pg18-query2_flat.csv").read_text()
