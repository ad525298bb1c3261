"""perf script folding, on recorded outputs of this machine (tests/fixtures/perf/README.md)."""
from __future__ import annotations

import gzip
import io
import re
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from profkit import tables
from profkit.cli.parse import parse_group
from profkit.errors import ParseError
from profkit.parse import detect_stack_format, load_stacks
from profkit.parse.folded import (
    InvalidLines,
    INSTRUMENTATION_FUNCTIONS,
    diff_folded,
    format_diff_folded,
    format_folded,
    functions_table,
    instrumentation_share,
    is_instrumentation,
    read_diff_folded,
    read_folded,
    read_folded_or_diff,
    write_folded,
)
from profkit.parse.perf_script import VdsoSymbols, fold_perf_script, parse_perf_script

FIX = Path(__file__).parent / "fixtures" / "perf"
VDSO_IMAGE = FIX / "vdso-linux-6.18-x86_64.so"
# profkit's own reading (its collectors'): 1 per sample, [vdso] frames named, strict.
# The default (stackcollapse-perf.pl's output) is tested in test_perf_compat.py.
PK: dict = {"weight": "samples", "vdso_names": True, "strict": True}


def _csv(df: pd.DataFrame) -> str:
    return df.to_csv(index=False, lineterminator="\n")


def _as_perf_names(counts: dict[str, float]) -> dict[str, float]:
    """Our `[module]` names for unsymbolised frames → perf's own `[unknown]`."""
    out: dict[str, float] = {}
    for stack, c in counts.items():
        frames = [f if not (f.startswith("[") and f.endswith("]")) or f == "[vdso]"
                  else "[unknown]" for f in stack.split(";")]
        key = ";".join(frames)
        out[key] = out.get(key, 0) + c
    return out


# ---------------------------------------------------------------- recorded outputs

@pytest.mark.parametrize("src,expected", [
    ("clockloop.perf-script.txt", "expected_clockloop.folded"),
    ("pg18-query3.perf-script.txt.gz", "expected_pg18-query3.folded"),
    ("pg18-query2.perf-script.txt.gz", "expected_pg18-query2.folded"),
    ("clockloop.unresolved-vdso.perf-script.txt", "expected_clockloop-unresolved-vdso.folded"),
])
def test_folded_matches_committed_expected(src: str, expected: str) -> None:
    fold = fold_perf_script(FIX / src, **PK)
    assert fold.folded_text() == (FIX / expected).read_text()


@pytest.mark.parametrize("src,perf_collapsed", [
    ("clockloop.perf-script.txt", "clockloop.perf-stackcollapse.folded"),
    ("pg18-query3.perf-script.txt.gz", "pg18-query3.perf-stackcollapse.folded"),
    ("pg18-query2.perf-script.txt.gz", "pg18-query2.perf-stackcollapse.folded"),
])
def test_same_stacks_as_perfs_own_collapser(src: str, perf_collapsed: str) -> None:
    # `perf script report stackcollapse` on the same perf.data is an independent oracle;
    # the only intended difference is naming unsymbolised frames after their module
    ours = fold_perf_script(FIX / src, **PK).counts
    theirs = read_folded(FIX / perf_collapsed)
    assert _as_perf_names(ours) == theirs
    assert sum(ours.values()) == sum(theirs.values())


def test_header_field_variants_fold_identically() -> None:
    # same perf.data printed with default fields, all fields (cpu, period, symoff),
    # without period/event, and without time (pid/tid only)
    ref = fold_perf_script(FIX / "clockloop.perf-script.txt", **PK)
    for name in ("allfields", "noperiod", "notime"):
        got = fold_perf_script(FIX / f"clockloop.{name}.perf-script.txt", **PK)
        assert got.counts == ref.counts, name
        assert got.samples == ref.samples == 197


def test_comm_with_space_and_threads() -> None:
    fold = fold_perf_script(FIX / "clockloop.perf-script.txt", **PK)
    roots = {s.split(";")[0] for s in fold.counts}
    assert roots == {"clockloop", "busy_worker"}  # "busy worker" → "busy_worker" like perf
    pid = fold_perf_script(FIX / "clockloop.allfields.perf-script.txt", pid=True, tid=True)
    assert {s.split(";")[0] for s in pid.counts} == {"clockloop-32186/32186",
                                                     "busy_worker-32186/32190"}


def test_offsets_stripped_and_modules_kept() -> None:
    fold = fold_perf_script(FIX / "clockloop.perf-script.txt", **PK)
    frames = {f for s in fold.counts for f in s.split(";")}
    assert not any(re.search(r"\+0x[0-9a-f]+$", f) for f in frames)
    assert fold.modules["__vdso_clock_gettime"] == "[vdso]"
    assert fold.modules["fib"] == "/tmp/h5/fx/clockloop"
    assert fold.modules["clock_gettime@@GLIBC_2.17"] == "/usr/lib/x86_64-linux-gnu/libc.so.6"


def test_unknown_frames_named_after_module() -> None:
    fold = fold_perf_script(FIX / "pg18-query3.perf-script.txt.gz", **PK)
    frames = {f for s in fold.counts for f in s.split(";")}
    # `4e2a2f [unknown] (/tmp/h5/pginst/bin/postgres)` and `[unknown] ([unknown])`
    assert "[postgres]" in frames
    assert "[unknown]" in frames
    assert fold.modules["[postgres]"] == "/tmp/h5/pginst/bin/postgres"


# ---------------------------------------------------------------- vDSO

def test_vdso_frames_unresolved_without_image_are_named_vdso() -> None:
    fold = fold_perf_script(FIX / "clockloop.unresolved-vdso.perf-script.txt", **PK)
    leaves = {s.rsplit(";", 1)[1] for s in fold.counts}
    assert "[vdso]" in leaves and "__vdso_clock_gettime" not in leaves
    assert is_instrumentation("[vdso]")


def test_vdso_frames_resolved_from_image() -> None:
    # the text perf printed without its build-id cache (HOME without ~/.debug) resolves,
    # with the vDSO image, to exactly what perf printed with the cache
    resolved = fold_perf_script(FIX / "clockloop.unresolved-vdso.perf-script.txt",
                                vdso=VDSO_IMAGE, **PK)
    with_cache = fold_perf_script(FIX / "clockloop.perf-script.txt", **PK)
    assert resolved.counts == with_cache.counts
    fa = resolved.functions_df()
    fb = fold_perf_script(FIX / "clockloop.unresolved-vdso.perf-script.txt", **PK).functions_df()
    assert instrumentation_share(fa) == pytest.approx(instrumentation_share(fb))


def test_vdso_symbol_table() -> None:
    syms = VdsoSymbols.from_image(VDSO_IMAGE)
    assert syms.build_id == "e95baaeaec8534edc5df3654182ddf12b19d9b23"
    assert syms.lookup(0xB46) == "__vdso_clock_gettime"   # aliases: __vdso_ name wins
    assert syms.lookup(0xAC0) == "__vdso_time"
    assert syms.lookup(0x10) is None
    assert syms.lookup(0x7F6B88E5BB46) is None             # absolute address: not mapped


def test_vdso_of_running_kernel_has_clock_gettime() -> None:
    syms = VdsoSymbols.from_running_kernel()
    assert "__vdso_clock_gettime" in syms.names


def test_bad_vdso_image() -> None:
    with pytest.raises(ParseError, match="not a vDSO ELF image"):
        VdsoSymbols.from_image(b"\x7fELF-not-really" + b"\0" * 64)
    with pytest.raises(ParseError, match="cannot read vDSO image"):
        VdsoSymbols.from_image(FIX / "no-such-file.so")


# ---------------------------------------------------------------- tables

def test_functions_table_matches_expected() -> None:
    for name, src in (("clockloop", "clockloop.perf-script.txt"),
                      ("pg18-query3", "pg18-query3.perf-script.txt.gz"),
                      ("pg18-query2", "pg18-query2.perf-script.txt.gz")):
        df = fold_perf_script(FIX / src, **PK).functions_df(run_id="r1", build="b1")
        assert _csv(df) == (FIX / f"expected_{name}_functions.csv").read_text(), name


def test_functions_self_total_and_recursion() -> None:
    fold = fold_perf_script(FIX / "clockloop.perf-script.txt", **PK)
    df = fold.functions_df().set_index("function")
    # every sample has one leaf: self sums to the sample count
    assert df["self"].sum() == fold.samples == 197
    # fib recurses up to 16 deep; each of the 7 worker samples counts once in its total
    worker_samples = sum(c for s, c in fold.counts.items() if s.startswith("busy_worker;"))
    assert worker_samples == 7
    assert df.loc["fib", "total"] == 7
    assert df.loc["main", "total"] == 190
    assert df.loc["__vdso_clock_gettime", "self_share"] == pytest.approx(167 / 197)
    assert df["calls"].isna().all()
    assert "clockloop" not in df.index  # the process root frame is not a function


def test_stacks_table() -> None:
    fold = fold_perf_script(FIX / "clockloop.perf-script.txt", **PK)
    st = fold.stacks_df(run_id="r", build="vanilla")
    assert list(st.columns) == list(tables.SCHEMAS["stacks"])
    assert st["weight"].sum() == 197
    assert (st["unit"] == "samples").all() and (st["tool"] == "perf").all()
    assert parse_perf_script(FIX / "clockloop.perf-script.txt", **PK).equals(fold.stacks_df())


def test_instrumentation_share_on_postgres() -> None:
    q3 = fold_perf_script(FIX / "pg18-query3.perf-script.txt.gz", **PK)
    q2 = fold_perf_script(FIX / "pg18-query2.perf-script.txt.gz", **PK)
    s3, s2 = (instrumentation_share(f.functions_df()) for f in (q3, q2))
    # independent count: samples whose leaf is in the family, from the committed folded file
    folded = read_folded(FIX / "expected_pg18-query3.folded")
    leaf_instr = sum(c for s, c in folded.items() if is_instrumentation(s.rsplit(";", 1)[1]))
    assert s3 == pytest.approx(leaf_instr / sum(folded.values()))
    # Query-3 (TIMING on) spends most of its time reading the clock; Query-2 does not
    assert s3 > 0.7
    assert 0.0 < s2 < 0.4
    top = q3.functions_df().iloc[0]
    assert top["function"] == "__vdso_clock_gettime"


def test_is_instrumentation_prefixes() -> None:
    for name in ("InstrStartNode", "InstrStopNode", "ExecProcNodeInstr", "ExecProcNodeInstrLite",
                 "PostExecProcNodeInstr", "InstrEndLoop", "InstrUpdateTupleCount",
                 "__vdso_clock_gettime", "clock_gettime@@GLIBC_2.17", "__clock_gettime64",
                 "[vdso]", "InstrStopNode.part.0", "pg_get_ticks_fast", "pg_ticks_to_ns",
                 "pg_instr_time_now", "pg_rdtscp", "pg_instr_ticks_to_ns", "InstrTimeThisCall",
                 "InstrSampleStart", "InstrSampleStop", "InstrSampleSkip"):
        assert is_instrumentation(name), name
    for name in ("ExecNestLoop", "ExecInterpExpr", "InstrAlloc", "clock_getres", "[postgres]",
                 "__x64_sys_clock_gettime", "InstrSampleTiming", "pg_instr_clock_select",
                 "InstrSampleSetup"):
        assert not is_instrumentation(name), name
    assert "ExecProcNodeInstr" in INSTRUMENTATION_FUNCTIONS


# ---------------------------------------------------------------- options

def test_event_filter_and_weights() -> None:
    src = FIX / "clockloop.allfields.perf-script.txt"
    fold = fold_perf_script(src, event_filter="cpu-clock:ppp", **PK)
    assert fold.samples == 197 and fold.skipped == 0 and fold.events == ("cpu-clock:ppp",)
    # stackcollapse-perf.pl compares the whole event name, modifiers included
    none = fold_perf_script(src, event_filter="cpu-clock", **PK)
    assert none.samples == 0 and none.skipped == 197 and none.counts == {}
    per = fold_perf_script(src)                      # the default: weighted by period
    assert per.unit == "period"
    assert sum(per.counts.values()) == 197 * 1001001
    assert all(isinstance(v, int) for v in per.counts.values())
    # without a period field a sample weighs 1, as in the Perl script
    noper = fold_perf_script(FIX / "clockloop.noperiod.perf-script.txt")
    assert sum(noper.counts.values()) == 197


def test_samples_without_callchain() -> None:
    # stackcollapse-perf.pl folds nothing from `perf record` without -g (its lines are
    # right-aligned, so they read as frames outside a sample); strict mode says why
    src = FIX / "clockloop.nocallchain.perf-script.txt"
    assert fold_perf_script(src).counts == {}
    with pytest.raises(ParseError, match=r"line 1: expected a sample header before this "
                                         r"callchain frame"):
        fold_perf_script(src, **PK)


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("name,message", [
    ("truncated-midline", r"line 28: expected a newline at the end of the last line \(the "
                          r"text is truncated\)"),
    ("truncated-sample", r"line 18: expected a blank line closing the last sample"),
    ("garbled-frame", (r"line 15: expected one callchain frame 'ADDRESS SYMBOL \(DSO\)': a hex "
                      r"address.* got '\\t.*g4z1c9 fib")),
    ("garbled-header", r"line 14: expected a sample header .* got 'lorem ipsum dolor'"),
])
def test_bad_input_names_the_line(name: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        fold_perf_script(FIX / f"{name}.perf-script.txt", **PK)


def test_truncated_non_strict_drops_incomplete_sample() -> None:
    # the Perl script's reading: the last sample has no blank line, so it never counts
    fold = fold_perf_script(FIX / "truncated-sample.perf-script.txt", weight="samples")
    assert fold.samples == 3 and fold.skipped == 0


def test_perf_data_instead_of_text() -> None:
    with pytest.raises(ParseError, match="perf.data file"):
        fold_perf_script(io.BytesIO(b"PERFILE2\x00\x01\x02\n"))


def test_missing_file() -> None:
    with pytest.raises(ParseError, match="cannot read"):
        fold_perf_script(FIX / "nope.txt", **PK)


def test_empty_input() -> None:
    fold = fold_perf_script(FIX / "empty.perf-script.txt", **PK)
    assert fold.counts == {} and fold.samples == 0
    assert fold.folded_text() == ""
    st, fn = fold.stacks_df(), fold.functions_df()
    assert st.empty and list(st.columns) == list(tables.SCHEMAS["stacks"])
    assert fn.empty and list(fn.columns)[: len(tables.SCHEMAS["functions"])] == list(
        tables.SCHEMAS["functions"])
    assert instrumentation_share(fn) == 0.0


# ---------------------------------------------------------------- streaming

def test_streams_from_an_iterator_in_bounded_memory() -> None:
    """A generator of lines works (no seek, no len) and memory stays flat while the
    input grows 200-fold: only distinct frame lines and stacks are kept."""
    text = (FIX / "clockloop.perf-script.txt").read_bytes()
    lines = text.splitlines(keepends=True)

    def gen(times: int):
        for _ in range(times):
            yield from lines

    ref = fold_perf_script(iter(lines), implementation="python")
    tracemalloc.start()
    try:
        big = fold_perf_script(gen(200), implementation="python")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert big.samples == 200 * ref.samples
    assert big.counts == {k: 200 * v for k, v in ref.counts.items()}
    input_size = 200 * len(text)                   # ~13.7 MB of text went through
    assert peak < 2_000_000 < input_size / 5, peak


def test_text_mode_file_object() -> None:
    with open(FIX / "clockloop.perf-script.txt", encoding="utf-8") as f:
        assert fold_perf_script(f).counts == fold_perf_script(
            FIX / "clockloop.perf-script.txt").counts


# ---------------------------------------------------------------- folded files and diff

def test_folded_roundtrip(tmp_path: Path) -> None:
    counts = fold_perf_script(FIX / "pg18-query3.perf-script.txt.gz", **PK).counts
    out = tmp_path / "q3.folded"
    write_folded(counts, out)
    assert read_folded(out) == counts
    assert out.read_text() == format_folded(counts)
    assert detect_stack_format(out) == "folded"
    assert detect_stack_format(FIX / "pg18-query3.perf-script.txt.gz") == "perf-script"
    assert load_stacks(out) == load_stacks(FIX / "pg18-query3.perf-script.txt.gz", **PK)


def test_read_folded_sums_duplicates_and_rejects_garbage(tmp_path: Path) -> None:
    assert read_folded(io.StringIO("a;b 2\n\n# comment\na;b 3\nc 1.5\n")) == {"a;b": 5.0,
                                                                              "c": 1.5}
    with pytest.raises(ParseError, match="line 2: expected a number"):
        read_folded(io.StringIO("a;b 2\na;b;c 1\x00x\n"))
    with pytest.raises(ParseError, match="line 1: expected 'frame;frame;leaf COUNT'"):
        read_folded(io.StringIO("lonely\n"))
    assert read_folded(io.StringIO("")) == {}
    for bad in ("a;b nan\n", "a;b 1_000\n", "a;b -3\n", "a;b inf\n", "a;b .5\n"):
        with pytest.raises(ParseError, match="line 1: expected a number"):
            read_folded(io.StringIO(bad))
    # flamegraph.pl's count pattern (\d+(?:\.\d*)?) takes "6." (inferno's zero-fractionals)
    assert read_folded(io.StringIO("a;b 6.\na;b 1.50\n")) == {"a;b": 7.5}
    # difffolded.pl's two counts per line are two profiles, not a frame named "b 31"
    with pytest.raises(ParseError, match=r"line 2: two counts \(31 and 56\): .*differential"
                                          r".*read_diff_folded.*--diff"):
        read_folded(io.StringIO("a;b 4\na;b 31 56\n"))


def test_read_diff_folded_reads_difffolded_output(tmp_path: Path) -> None:
    """difffolded.pl's ``stack BEFORE AFTER``, as flamegraph.pl reads it: the two
    profiles back, a one-count line in both, repeated stacks summed."""
    a = {"main;scan;next": 30.0, "main;scan": 10.0, "main;sort": 4.0}
    b = {"main;scan;next": 60.0, "main;agg": 20.0}
    f = tmp_path / "diff.folded"
    f.write_text("# difffolded.pl -n a b\n" + format_diff_folded(diff_folded(a, b)))
    before, after = read_diff_folded(f)
    assert read_folded_or_diff(f) == (after, before)
    # a file is differential as soon as one line has two counts, its first or not
    assert read_folded_or_diff(io.StringIO("a;b 4\na;b 31 56\n")) == ({"a;b": 60.0},
                                                                      {"a;b": 35.0})
    assert read_folded_or_diff(io.StringIO("a;b 4\na;c 5\n")) == ({"a;b": 4.0, "a;c": 5.0},
                                                                  None)
    # -n: A scaled to B's total (80 / 44) and cut to a whole number, as difffolded.pl -n
    # writes it (int()); a stack on one side only is 0 on the other
    assert after == {"main;agg": 20.0, "main;scan": 0.0, "main;scan;next": 60.0,
                     "main;sort": 0.0}
    assert before == {"main;agg": 0.0, "main;scan": 18.0, "main;scan;next": 54.0,
                      "main;sort": 7.0}
    f.write_text(format_diff_folded(diff_folded(a, b), exact=True))
    assert read_diff_folded(f)[0] == pytest.approx(
        {"main;agg": 0.0, "main;scan": 10 * 80 / 44, "main;scan;next": 30 * 80 / 44,
         "main;sort": 4 * 80 / 44}, abs=1e-6)
    # unscaled fractional counts as Perl prints them (%.15g)
    d = diff_folded({"x": 14.2343983248722834234}, {"x": 13.0}, normalise=False)
    assert format_diff_folded(d) == "x 14.2343983248723 13\n"
    before, after = read_diff_folded(io.StringIO("x;y 3 5\nx;z 7\n\nx;y 1 1\n"))
    assert before == {"x;y": 4.0, "x;z": 7.0} and after == {"x;y": 6.0, "x;z": 7.0}
    for bad, msg in (("x;y 3 nan\n", "expected a number"), ("x 1 2 3\n", None)):
        if msg:
            with pytest.raises(ParseError, match=f"line 1: {msg}"):
                read_diff_folded(io.StringIO(bad))
    # "x 1 2 3": the stack is "x 1" with counts 2 and 3 (flamegraph.pl's pattern too)
    assert read_diff_folded(io.StringIO("x 1 2 3\n")) == ({"x 1": 2.0}, {"x 1": 3.0})
    assert read_diff_folded(io.StringIO("")) == ({}, {})


def test_read_folded_last_line_without_newline(tmp_path: Path) -> None:
    f = tmp_path / "cut.folded"
    f.write_bytes(b"a;b 12\na;c 34")   # complete ("\n".join), or "a;c 345\n" cut short
    # read, as flamegraph.pl (its pattern needs no newline) and inferno read it
    assert read_folded(f) == {"a;b": 12.0, "a;c": 34.0}
    assert load_stacks(f) == {"a;b": 12.0, "a;c": 34.0}
    assert read_folded(io.StringIO("x;y 5")) == {"x;y": 5.0}
    assert read_folded(io.StringIO("a 1\n\n# end")) == {"a": 1.0}  # comment last: fine
    # strict: a file profkit wrote always ends with a newline, so one without was cut
    with pytest.raises(ParseError, match=rf"folded stacks {f}, line 2: expected a newline "
                                         r"after the count"):
        read_folded(f, strict=True)


def test_folded_file_with_a_byte_order_mark(tmp_path: Path) -> None:
    """A folded file written as UTF-16 with a byte-order mark, either order, CRLF line
    ends (PowerShell's ``>``; speedscope's samples simple-utf16-le/-be.txt are such
    files), or with a UTF-8 byte-order mark: the same stacks as the plain file, in
    read_folded, load_stacks (which sniffs it) and the gzip of it; before, the UTF-16 ones
    gave no stack at all."""
    text = "a;b;c 1\r\na;b;c 1\r\na;b;d 4\r\na;b;c 3\r\nä;b 5\r\n"
    want = {"a;b;c": 5.0, "a;b;d": 4.0, "ä;b": 5.0}
    for enc in ("utf-16-le", "utf-16-be", "utf-8"):
        bom = {"utf-16-le": b"\xff\xfe", "utf-16-be": b"\xfe\xff", "utf-8": b"\xef\xbb\xbf"}
        f = tmp_path / f"{enc}.folded"
        f.write_bytes(bom[enc] + text.encode(enc))
        assert read_folded(f, strict=True) == want, enc
        assert detect_stack_format(f) == "folded"
        assert load_stacks(f) == want, enc
        gz = tmp_path / f"{enc}.folded.gz"
        gz.write_bytes(gzip.compress(f.read_bytes()))
        assert read_folded(gz) == want, enc


def test_lines_without_a_count_are_refused_or_collected(tmp_path: Path) -> None:
    """A folded file with a stray line (a note pasted in, a cut fractional count): refused
    by default, naming the line; with *invalid* the line is collected and the rest read,
    which is what flamegraph.pl's pattern makes of it (those lines left out)."""
    f = tmp_path / "stray.folded"
    f.write_bytes(b"p;main;scan 31\np;main 6\nA NOTE PASTED IN\np;main;sort 1\n"
                  b"p;x 12V.43\np;main;scan 19\np;y 1e999\np;z\n")
    with pytest.raises(ParseError, match=rf"folded stacks {f}, line 3: expected a number "
                                         r"after the last space, got 'IN'"):
        read_folded(f)
    invalid = InvalidLines()
    assert read_folded(f, invalid=invalid) == {"p;main;scan": 50.0, "p;main": 6.0,
                                               "p;main;sort": 1.0}
    assert invalid == [(3, "A NOTE PASTED IN"), (5, "p;x 12V.43"), (7, "p;y 1e999"),
                       (8, "p;z")] and invalid.total == 4
    # sniffed as folded although not every line is (the stray ones are few)
    assert detect_stack_format(f) == "folded"
    assert load_stacks(f, invalid=InvalidLines()) == read_folded(f, invalid=InvalidLines())
    # a differential file's stray line too
    invalid = InvalidLines()
    assert read_folded_or_diff(io.StringIO("a;b 1 2\noops\na;c 3 4\n"), invalid=invalid) == (
        {"a;b": 2.0, "a;c": 4.0}, {"a;b": 1.0, "a;c": 3.0})
    assert invalid == [(2, "oops")]
    # a BEFORE count that is no finite number ("1e999 5") is such a line too, not an error
    invalid = InvalidLines()
    assert read_folded_or_diff(io.StringIO("a;b 1 2\na;c 1e999 5\n"), invalid=invalid) == (
        {"a;b": 2.0}, {"a;b": 1.0})
    assert invalid == [(2, "a;c 1e999 5")]
    # many: all counted, the first InvalidLines.KEEP kept, each cut at 200 characters
    invalid = InvalidLines()
    many = "".join(f"s;{i} {i}\n" + "x" * 300 + "\n" for i in range(1, 1001))
    assert len(read_folded(io.StringIO(many), invalid=invalid)) == 1000
    assert invalid.total == 1000 and len(invalid) == InvalidLines.KEEP
    assert invalid[0] == (2, "x" * 200) and invalid[-1][0] == 2 * InvalidLines.KEEP
    # a line over 1 MB is still refused: not a folded file
    with pytest.raises(ParseError, match="at most 1 MB"):
        read_folded(io.BytesIO(b"a " * (1 << 20) + b"1\n"), invalid=InvalidLines())


def test_read_folded_keeps_non_utf8_names_apart(tmp_path: Path) -> None:
    f = tmp_path / "latin1.folded"
    f.write_bytes(b"p;caf\xe9 1\np;caf\xe8 2\n")
    counts = read_folded(f)
    assert len(counts) == 2 and sorted(counts.values()) == [1.0, 2.0]
    out = tmp_path / "back.folded"
    write_folded(counts, out)
    assert out.read_bytes() == b"p;caf\xe8 2\np;caf\xe9 1\n"    # bytes back, sorted


def test_read_folded_refuses_a_huge_line() -> None:
    with pytest.raises(ParseError, match="line 2: expected a line of at most 1 MB"):
        read_folded(io.BytesIO(b"a 1\n" + b"x" * (2 << 20) + b" 1\n"))


def test_diff_normalises_a_to_b_total() -> None:
    a = {"p;x": 30.0, "p;y": 10.0}            # total 40
    b = {"p;x": 40.0, "p;z": 40.0}            # total 80
    d = diff_folded(a, b).set_index("stack")
    assert d.loc["p;x", "a_norm"] == 60.0 and d.loc["p;x", "delta"] == -20.0
    assert d.loc["p;y", "count_b"] == 0.0 and d.loc["p;y", "delta"] == -20.0
    assert d.loc["p;z", "count_a"] == 0.0 and d.loc["p;z", "delta"] == 40.0
    assert d["a_norm"].sum() == pytest.approx(d["count_b"].sum())
    assert format_diff_folded(diff_folded(a, b)).splitlines()[0] == "p;x 60 40"
    raw = diff_folded(a, b, normalise=False).set_index("stack")
    assert raw.loc["p;x", "a_norm"] == 30.0


def test_functions_table_from_plain_folded() -> None:
    df = functions_table({"a;b;a;b": 2.0, "a;c": 1.0})
    t = df.set_index("function")
    assert t.loc["a", "total"] == 3 and t.loc["b", "self"] == 2 and t.loc["b", "total"] == 2
    assert t.loc["a", "self"] == 0 and t["self"].sum() == 3


# ---------------------------------------------------------------- CLI

def test_cli_parse_perf_script() -> None:
    src = str(FIX / "clockloop.perf-script.txt")
    r = CliRunner().invoke(parse_group, ["perf-script", src])
    assert r.exit_code == 0, r.output
    # stackcollapse-perf.pl's output: weighted by period
    assert r.output.splitlines()[-1] == ("clockloop;__libc_start_call_main;main;read_clock "
                                         f"{17 * 1001001}")
    r = CliRunner().invoke(parse_group, ["perf-script", "--samples", src])
    assert r.output == (FIX / "expected_clockloop.folded").read_text()


def test_cli_parse_perf_script_stdin_and_vdso() -> None:
    data = (FIX / "clockloop.unresolved-vdso.perf-script.txt").read_bytes()
    r = CliRunner().invoke(parse_group, ["perf-script", "-", "--samples", "--vdso",
                                         str(VDSO_IMAGE)], input=data)
    assert r.exit_code == 0, r.output
    assert r.output == (FIX / "expected_clockloop.folded").read_text()


def test_cli_parse_perf_script_functions_csv() -> None:
    r = CliRunner().invoke(parse_group, ["perf-script", "--functions", "--samples",
                                         str(FIX / "clockloop.perf-script.txt")])
    assert r.exit_code == 0
    head = r.output.splitlines()[:2]
    assert head[0].startswith("tool,function,module,calls,self,total,self_share")
    assert head[1].startswith("perf,__vdso_clock_gettime,[vdso],,167.0,168.0,")


def test_cli_parse_perf_script_bad_input_exit_1() -> None:
    r = CliRunner().invoke(parse_group, ["perf-script", "--strict",
                                         str(FIX / "garbled-frame.perf-script.txt")])
    assert r.exit_code == 1  # a ParseError is a failure (1); usage errors are 2
    assert "line 15" in r.output


def test_known_frame_outside_a_sample() -> None:
    lines = (FIX / "clockloop.perf-script.txt").read_bytes().splitlines(keepends=True)
    # line 6 is the blank line after the first sample; repeat its frame line 3 after it
    assert lines[5] == b"\n"
    text = b"".join([*lines[:6], lines[2], *lines[6:]])
    with pytest.raises(ParseError, match=r"line 7: expected a sample header before this "
                                         r"callchain frame"):
        fold_perf_script(io.BytesIO(text), strict=True)
