r"""profkit's parsers on other people's profiles: gprof2dot's test inputs, read by profkit
and by gprof2dot (the pip package, an independent implementation), compared.

    python benchmarks/peer_inputs.py GPROF2DOT_TESTS_DIR [--inferno-tests DIR]
                                     [--speedscope-samples DIR] [--flamegraph-suite DIR]
                                     [--pev2-tests DIR]

GPROF2DOT_TESTS_DIR is the ``tests`` folder of a gprof2dot checkout
(https://github.com/jrfonseca/gprof2dot): gprof reports (``prof/*.prof``), callgrind files
(``callgrind/*.callgrind``, ``compare/callgrind/test/*.callgrind``) and ``perf script``
texts (``perf/*.perf``) recorded on many machines (Windows, macOS, embedded targets,
old valgrind versions, Python profilers that write the callgrind format).

For each file it prints whether profkit reads it and whether the numbers agree:

- callgrind: self cost per function (recursion suffixes ``'N`` merged), profkit against
  gprof2dot's ``CallgrindParser``: the number of functions whose self cost differs; and
  the calls of each caller -> callee arc against gprof2dot's and against valgrind's own
  ``callgrind_annotate --tree=caller`` (where it reads the file);
- gprof: calls per call-graph edge (summed per caller and callee) against gprof2dot's
  ``GprofParser``, where the report has a call graph;
- perf: profkit's folding against FlameGraph's stackcollapse-perf.pl, byte for byte
  (with --flamegraph-suite, default ../shared/flamegraph-suite).

With --inferno-tests (the ``tests`` folder of https://github.com/jonhoo/inferno, the Rust
port of FlameGraph): its ``perf script`` inputs (``data/collapse-perf/*.txt``) folded
against stackcollapse-perf.pl, its diff-folded expected outputs
(``data/diff-folded/results``) against profkit's ``format_diff_folded`` of the same
inputs, and its folded inputs (``data/flamegraph/*/*.txt``; of a differential one, its
AFTER profile, whose widths flamegraph.pl draws) read as ``profkit flamegraph FILE``
reads them (sniffed; lines that are not ``stack COUNT`` left out and counted, as
flamegraph.pl and inferno do) against a reading by flamegraph.pl's own line pattern
(``(.*)\s+?(\d+(?:\.\d*)?)``, a second such number making the line differential; lines
starting with ``#`` are comments, as profkit and inferno take them, where flamegraph.pl
would draw austin's ``# duration: 23873`` as a frame): stacks, total count and the lines
left out.

With --speedscope-samples (the ``sample/profiles`` folder of
https://github.com/jlfwong/speedscope): its callgrind files (``callgrind/*.log``) as above,
and their self cost per function against speedscope's own test snapshot of them
(``src/import/__snapshots__/callgrind.test.ts.snap`` of the same checkout, where it is
there: speedscope scales a ``Time_(10ns)`` event to ns, and builds a function's self
weight from its callers' inclusive costs where the file's own cost lines say less); its
``perf script`` texts (``linux-perf/*.txt``) folded against stackcollapse-perf.pl; its folded
files (``stackcollapse/*.txt``) as inferno's above, and against speedscope's snapshot of
them (``bg-flamegraph.test.ts.snap``).

With --pev2-tests (the ``src/services/__tests__`` folder of https://github.com/dalibo/pev2,
a plan visualiser): its EXPLAIN plans in the text format (``from-text/*-plan``,
``12-line-wrapped-plans/*-plan``: from psql, pgAdmin, wrapped by terminals, from
PostgreSQL 8 to 17) read by profkit.parse.explain_text, against pev2's expected JSON of each
(``*-expect``): every node key both give, and the tree's shape.

A file profkit refuses is listed with profkit's message: a refusal is right only when the
file is not what it claims to be (cut, no header); the message must say so.
"""
from __future__ import annotations

import argparse
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import gprof2dot  # noqa: E402
import pandas as pd  # noqa: E402

from profkit.errors import ParseError  # noqa: E402
from profkit.parse.explain import explain_order  # noqa: E402
from profkit.parse.folded import InvalidLines  # noqa: E402
from profkit.parse._io import read_text  # noqa: E402
from profkit.parse.callgrind import parse_callgrind_file  # noqa: E402
from profkit.parse.gprof import parse_gprof  # noqa: E402
from profkit.parse.perf_script import fold_perf_script  # noqa: E402

_REC = re.compile(r"'\d+$")
# callgrind_annotate --tree=caller: cost columns, then "<" (a caller of the function on
# the next "*" line, with its calls "(Nx)") or "*", then file:function and [object]
_ANNOTATE_LINE = re.compile(r"^[\d,.()%\s]*?\s([<*>])\s+(.*?)(?: \(([\d,]+)x\))?"
                            r"(?: \[([^\]]*)\])?$")


def annotate_arcs(path: Path) -> dict[tuple[str, str], int] | None:
    """Calls per (caller, callee) as valgrind's callgrind_annotate --tree=caller prints
    them (recursion levels fn'2 merged into fn, objects summed); None where
    callgrind_annotate cannot read the file."""
    cp = subprocess.run(["callgrind_annotate", "--tree=caller", "--threshold=100",
                         "--auto=no", str(path)], capture_output=True, text=True, timeout=600)
    if cp.returncode != 0:
        return None
    arcs: dict[tuple[str, str], int] = {}
    callers: list[tuple[str, int]] = []
    for line in cp.stdout.splitlines():
        m = _ANNOTATE_LINE.match(line)
        if not m:
            callers = []
            continue
        mark, where, n, _obj = m.groups()
        fn = _REC.sub("", where.split(":", 1)[1])
        if mark == "<":
            callers.append((fn, int(n.replace(",", ""))))
        elif mark == "*":
            for caller, calls in callers:
                arcs[(caller, fn)] = arcs.get((caller, fn), 0) + calls
            callers = []
    return arcs


def _ours(parse, path: Path):
    """profkit's reading of *path*, or the line saying it refused (with its message)."""
    try:
        return parse(path)
    except ParseError as e:
        return f"refused: {e}"


def callgrind_row(path: Path, prof: object = None) -> str:
    """The row of *path*; *prof*: profkit's reading of it when the caller has it."""
    prof = _ours(parse_callgrind_file, path) if prof is None else prof
    if isinstance(prof, str):
        return prof
    mine: dict[str, float] = {}
    for r in prof.functions.itertuples():
        mine[r.function] = mine.get(r.function, 0) + r.self
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            theirs_prof = gprof2dot.CallgrindParser(f).parse()
    except Exception as e:  # noqa: BLE001 - the peer's failure is a finding, not ours
        return (f"event {prof.event}, {len(mine)} functions, total {prof.totals:,}; "
                f"gprof2dot cannot read it ({type(e).__name__}: {e})")
    theirs: dict[str, float] = {}
    for fn in theirs_prof.functions.values():
        k = _REC.sub("", fn.name)
        theirs[k] = theirs.get(k, 0) + fn[gprof2dot.SAMPLES]
    differ = [k for k in set(mine) | set(theirs) if mine.get(k, 0) != theirs.get(k, 0)]
    edges = edge_calls(prof.call_edges)
    # gprof2dot keeps callgrind's recursion levels (fn'2) apart and its calls=0 arcs
    peer = _gprof2dot_calls(theirs_prof, name=lambda n: _REC.sub("", n), nonzero=True)
    annotate = annotate_arcs(path)
    by_annotate = ("callgrind_annotate cannot read it" if annotate is None else
                   f"{_count_differ(edges, annotate)} from callgrind_annotate --tree=caller's")
    return (f"event {prof.event}, {len(mine)} functions, total {prof.totals:,}; "
            f"self cost differs from gprof2dot for {len(differ)}; {len(edges)} call arcs, "
            f"calls differ from gprof2dot's for {_count_differ(edges, peer)}, {by_annotate}")


def speedscope_selfs(snapshot: Path) -> dict[str, list[dict[str, int]]]:
    """Self weight per function of each profile in speedscope's own test snapshot of its
    callgrind importer (src/import/__snapshots__/callgrind.test.ts.snap): file name ->
    one dict per event, in the file's order of events."""
    out: dict[str, list[dict[str, int]]] = {}
    for block in snapshot.read_text().split("exports[`")[1:]:
        head = re.search(r'^  "name": "(.+?) -- ', block, re.M)
        if head:
            frames = re.findall(r'"name": "([^"]*)",\s*"selfWeight": (\d+)', block)
            out.setdefault(head.group(1), []).append({n: int(w) for n, w in frames})
    return out


def speedscope_callgrind_row(path: Path, snapshot: dict[str, list[dict[str, int]]]) -> str:
    """callgrind_row, and profkit's self cost per function against speedscope's snapshot
    of the same file (the event profkit reads)."""
    prof = _ours(parse_callgrind_file, path)
    line = callgrind_row(path, prof)
    profiles = snapshot.get(path.name)
    if isinstance(prof, str) or not profiles:
        return line + ("" if profiles else "; not in speedscope's snapshot")
    theirs = profiles[prof.events.index(prof.event)]
    mine = {r.function: int(r.self) for r in prof.functions.itertuples()}
    differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    return line + (f"; self cost per function against speedscope's snapshot: differs for "
                   f"{len(differ)} of {len(theirs)}" + (f" ({', '.join(differ)})" if differ else ""))


def speedscope_stacks(snapshot: Path) -> dict[str, dict[str, float]]:
    """Weight per stack of each profile in speedscope's test snapshot of its folded-stacks
    importer (src/import/__snapshots__/bg-flamegraph.test.ts.snap): file name -> stacks
    (its list of ``stack WEIGHT`` lines, summed per stack)."""
    out: dict[str, dict[str, float]] = {}
    for block in snapshot.read_text().split("exports[`")[1:]:
        head = re.search(r'^  "name": "(.+?)",', block, re.M)
        body = re.search(r'"stacks": \[(.*?)\]', block, re.S)
        if head and body:
            stacks = out.setdefault(head.group(1), {})
            for stack, weight in re.findall(r'"(.*) (\d+(?:\.\d+)?)",', body.group(1)):
                stacks[stack] = stacks.get(stack, 0) + float(weight)
    return out


def speedscope_folded_row(path: Path, snapshot: dict[str, dict[str, float]]) -> str:
    """folded_row, and profkit's stacks against speedscope's snapshot of the same file."""
    read = _read_folded_as_flamegraph(path)
    line = folded_row(path, read)
    theirs = snapshot.get(path.name)
    if theirs is None:
        return line + "; not in speedscope's snapshot"
    mine = read[0]
    if isinstance(mine, str):
        return line
    same = mine == theirs
    return line + (f"; speedscope's snapshot: {len(theirs)} stacks, total "
                   f"{sum(theirs.values()):g}: {'the same' if same else 'DIFFERENT'}")


#: the node keys EXPLAIN's text names, compared where pev2's expected JSON has them
_PLAN_KEYS = ("Node Type", "Relation Name", "Alias", "Index Name", "Startup Cost", "Total Cost",
              "Plan Rows", "Plan Width", "Actual Startup Time", "Actual Total Time",
              "Actual Rows", "Actual Loops", "Join Type", "Strategy", "Parent Relationship",
              "Subplan Name", "Scan Direction", "Partial Mode", "CTE Name", "Function Name",
              "Workers Planned", "Workers Launched", "Operation", "Command")


def _pev2_type(t: str) -> str:
    """pev2 keeps the text's words as the node type ("Nested Loop Join", "HashAggregate",
    "Merge"); PostgreSQL's JSON says "Nested Loop", "Aggregate", "ModifyTable"."""
    from profkit.parse.explain_text import _describe

    return "ModifyTable" if t in ("Insert", "Update", "Delete", "Merge") else \
        _describe(t)["Node Type"]


def _pev2_name(name: str) -> str:
    """pev2 keeps a name as the text prints it (``public."my t"``); PostgreSQL's JSON gives
    it unquoted, its schema apart (``my t``)."""
    from profkit.parse.explain_text import _PART, _unquote

    return _unquote(re.findall(_PART, name)[-1]) if name else name


def _plan_differs(mine: dict, theirs: dict, where: str) -> list[str]:
    off = []
    for k in _PLAN_KEYS:
        want = theirs.get(k)
        if k == "Node Type" and k in theirs:
            want = _pev2_type(want)
        elif k in ("Relation Name", "Index Name") and isinstance(want, str):
            want = _pev2_name(want)
        if k in theirs and mine.get(k) != want:
            off.append(f"{where}: {k} {mine.get(k)!r}, pev2 {want!r}")
    if "Plans" in theirs:
        a, b = mine.get("Plans", []), theirs["Plans"]
        if len(a) != len(b):
            return [*off, f"{where}: {len(a)} children, pev2 {len(b)}"]
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            off += _plan_differs(x, y, f"{where}>{i}")
    return off


def explain_text_row(path: Path) -> str:
    """profkit's reading of one of pev2's text plans (``NAME-plan``) against pev2's
    expected JSON of it (``NAME-expect``): the node keys both have, the tree's shape."""
    import json

    from profkit.parse.explain_text import parse_text_explain

    expect = path.with_name(path.name.removesuffix("plan") + "expect")
    theirs = json.loads(expect.read_text())
    mine = _ours(lambda p: parse_text_explain(p.read_text(encoding="utf-8")), path)
    if isinstance(mine, str):
        return mine
    off = _plan_differs(mine["Plan"], theirs["Plan"], "Plan")
    off += [f"{k} {mine.get(k)!r}, pev2 {theirs[k]!r}" for k in ("Planning Time",
            "Execution Time") if k in theirs and mine.get(k) != theirs[k]]
    nodes = len(explain_order(mine["Plan"]))
    return (f"{nodes} nodes; pev2's expected JSON: "
            + ("the same" if not off else f"DIFFERENT ({'; '.join(off[:3])})"))


def edge_calls(call_edges: pd.DataFrame) -> dict[tuple[str, str], int]:
    """Calls per (caller, callee) of a profkit call_edges table (a pair listed twice, as
    gprof lists cycle members or callgrind the same name in two objects, summed; rows
    without calls left out)."""
    out: dict[tuple[str, str], int] = {}
    for r in call_edges.itertuples():
        if not pd.isna(r.calls):
            out[(r.caller, r.callee)] = out.get((r.caller, r.callee), 0) + int(r.calls)
    return out


def _gprof2dot_calls(theirs_prof, *, name=lambda n: n,
                     nonzero: bool = False) -> dict[tuple[str, str], int]:
    """Calls per (caller, callee) as gprof2dot's parser read them (*name* maps its
    function names; *nonzero* leaves out arcs of 0 calls)."""
    out: dict[tuple[str, str], int] = {}
    for fn in theirs_prof.functions.values():
        for call in fn.calls.values():
            if gprof2dot.CALLS in call and (call[gprof2dot.CALLS] or not nonzero):
                k = (name(fn.name), name(theirs_prof.functions[call.callee_id].name))
                out[k] = out.get(k, 0) + call[gprof2dot.CALLS]
    return out


def _count_differ(a: dict, b: dict) -> int:
    """Keys whose values differ, a key missing on one side counted too."""
    return sum(a.get(k) != b.get(k) for k in set(a) | set(b))


def gprof_row(path: Path) -> str:
    prof = _ours(parse_gprof, path)
    if isinstance(prof, str):
        return prof
    edges = edge_calls(prof.call_edges)
    try:  # the text as profkit decodes it (a UTF-16 report too), so both read the same
        theirs_prof = gprof2dot.GprofParser(io.StringIO(read_text(path))).parse()
    except Exception as e:  # noqa: BLE001 - the peer's own failure is a finding too
        return (f"{len(prof.functions)} functions, {len(edges)} edges; gprof2dot fails: "
                f"{type(e).__name__}")
    theirs = _gprof2dot_calls(theirs_prof)
    common = set(edges) & set(theirs)
    differ = [k for k in common if edges[k] != theirs[k]]
    return (f"{len(prof.functions)} functions, {len(edges)} edges with calls "
            f"(gprof2dot {len(theirs)}, {len(common)} in both); calls differ on {len(differ)}")


def perf_row(path: Path, suite: Path | None) -> str:
    folding = _ours(fold_perf_script, path)
    if isinstance(folding, str):
        return folding
    mine = folding.folded_bytes()
    n = mine.count(b"\n")
    perl = shutil.which("perl")
    if suite is None or perl is None:
        return f"{n} stacks (no stackcollapse-perf.pl to compare)"
    theirs = subprocess.run([perl, str(suite / "stackcollapse-perf.pl"), str(path)],
                            capture_output=True, check=True).stdout
    same = "byte for byte the same" if mine == theirs else "DIFFERENT"
    return f"{n} stacks; stackcollapse-perf.pl: {same}"


_FLAMEGRAPH_PL_LINE = re.compile(rb"^(.*)\s+?(\d+(?:\.\d*)?)$")


def _read_folded_as_flamegraph(path: Path) -> tuple[dict[str, float] | str, InvalidLines]:
    """What ``profkit flamegraph FILE`` draws of *path* (the format sniffed, a differential
    file's AFTER, the lines that are not 'stack COUNT' left out and counted), or the
    refusal's line; and those lines."""
    from profkit.experiments.stacks import perf_reading, read_stacks_or_diff

    invalid = InvalidLines()
    return _ours(lambda p: read_stacks_or_diff(str(p), perf_reading(), invalid)[0],
                 path), invalid


def folded_row(path: Path, read: tuple | None = None) -> str:
    """The row of *path*; *read*: :func:`_read_folded_as_flamegraph`'s, when the caller
    has it."""

    theirs: dict[bytes, float] = {}
    bad = differential = 0
    for raw in path.read_bytes().splitlines():
        if raw.startswith(b"#"):
            continue
        m = _FLAMEGRAPH_PL_LINE.match(raw.rstrip())
        if not m:
            bad += raw.strip() != b""
            continue
        stack, count = m.group(1).rstrip(), float(m.group(2))
        inner = _FLAMEGRAPH_PL_LINE.match(stack)
        if inner:  # BEFORE AFTER: flamegraph.pl's widths are AFTER's
            differential += 1
            stack = inner.group(1).rstrip()
        theirs[stack] = theirs.get(stack, 0) + count
    what = (f"flamegraph.pl's pattern: {len(theirs)} stacks, total {sum(theirs.values()):g}"
            + (f", {bad} lines it ignores" if bad else "")
            + (f", {differential} differential lines" if differential else ""))
    mine, invalid = read or _read_folded_as_flamegraph(path)
    if isinstance(mine, str):
        return f"{mine} ({what})"
    if not any(v > 0 for v in mine.values()) and not theirs:
        # flamegraph.pl: "ERROR: No stack counts found", exit 2; profkit: exit 1
        return f"0 stacks: nothing to draw; {what}: nothing to draw either (the same)"
    same = (len(mine) == len(theirs) and abs(sum(mine.values()) - sum(theirs.values())) < 1e-6
            and invalid.total == bad)
    return (f"{len(mine)} stacks, total {sum(mine.values()):g}"
            + (f", {invalid.total} lines left out" if invalid.total else "")
            + f"; {what}: {'the same' if same else 'DIFFERENT'}")


#: inferno's diff-folded expected outputs: (BEFORE file, normalised); fractionals.txt and
#: strip_hex.txt are inferno's own (it cuts fractional counts, which difffolded.pl keeps;
#: profkit has no hex stripping)
_DIFF_FOLDED_CASES = {"default.txt": ("before.txt", False), "normalize.txt": ("before.txt", True)}


def diff_folded_row(path: Path) -> str:
    """profkit's difffolded.pl text (format_diff_folded) of inferno's before/after inputs
    against inferno's expected output, line for line (sorted: both write in hash order)."""
    from profkit.parse.folded import diff_folded, format_diff_folded

    case = _DIFF_FOLDED_CASES.get(path.name)
    if case is None:
        return "not compared (inferno's own behaviour, not difffolded.pl's)"
    data = path.parent.parent
    ours = sorted(format_diff_folded(diff_folded(data / case[0], data / "after.txt",
                                                 normalise=case[1])).splitlines())
    theirs = sorted(path.read_text().splitlines())
    return (f"{len(theirs)} lines (difffolded.pl{' -n' if case[1] else ''}); profkit: "
            + ("the same" if ours == theirs else
               f"DIFFERENT ({len(set(ours) ^ set(theirs))} lines differ)"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tests_dir", type=Path)
    ap.add_argument("--inferno-tests", type=Path, default=None)
    ap.add_argument("--speedscope-samples", type=Path, default=None)
    ap.add_argument("--pev2-tests", type=Path, default=None)
    ap.add_argument("--flamegraph-suite", type=Path,
                    default=ROOT.parent / "shared" / "flamegraph-suite")
    a = ap.parse_args(argv)
    suite = a.flamegraph_suite if (a.flamegraph_suite / "stackcollapse-perf.pl").is_file() \
        else None
    d = a.tests_dir
    groups = (("callgrind", sorted(d.glob("callgrind/*.callgrind"))
               + sorted(d.glob("compare/callgrind/test/*.callgrind")), callgrind_row),
              ("gprof", sorted(d.glob("prof/*.prof")), gprof_row),
              ("perf script", sorted(d.glob("perf/*.perf")), lambda p: perf_row(p, suite)))
    roots = [d] * len(groups)
    if a.inferno_tests is not None:
        i = a.inferno_tests
        groups += (("inferno perf script", sorted(i.glob("data/collapse-perf/*.txt")),
                    lambda p: perf_row(p, suite)),
                   ("inferno folded", sorted(i.glob("data/flamegraph/*/*.txt")), folded_row),
                   ("inferno diff-folded", sorted(i.glob("data/diff-folded/results/*.txt")),
                    diff_folded_row))
        roots += [i, i, i]
    if a.speedscope_samples is not None:
        sp = a.speedscope_samples
        snap = sp.parent.parent / "src" / "import" / "__snapshots__" / "callgrind.test.ts.snap"
        selfs = speedscope_selfs(snap) if snap.is_file() else {}
        snap = snap.with_name("bg-flamegraph.test.ts.snap")
        stacks = speedscope_stacks(snap) if snap.is_file() else {}
        groups += (("speedscope callgrind", sorted(sp.glob("callgrind/*.log")),
                    lambda p: speedscope_callgrind_row(p, selfs)),
                   ("speedscope folded", sorted(sp.glob("stackcollapse/*.txt")),
                    lambda p: speedscope_folded_row(p, stacks)),
                   ("speedscope perf script", sorted(sp.glob("linux-perf/*.txt")),
                    lambda p: perf_row(p, suite)))
        roots += [sp, sp, sp]
    if a.pev2_tests is not None:
        pv = a.pev2_tests
        groups += (("pev2 text plans", sorted(pv.glob("from-text/*plan"))
                    + sorted(pv.glob("12-line-wrapped-plans/*plan")), explain_text_row),)
        roots += [pv]
    refused = 0
    for (kind, files, row), root in zip(groups, roots, strict=True):
        print(f"## {kind}: {len(files)} files")
        for p in files:
            line = row(p)
            refused += line.startswith("refused")
            print(f"- {p.relative_to(root)}: {line}")
    print(f"refused: {refused}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
