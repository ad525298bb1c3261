"""Property-based tests (Hypothesis) of the gprof, callgrind, ltrace, perf stat and
EXPLAIN (JSON and text) parsers on mutations of their real fixtures (tests/mutations.py): every
mutated input gives a result or one ParseError naming the file — never another
exception, never a hang — within a time proportional to the input's size. Plus the
regressions issue 14 listed, each on the real fixture it was found with.
"""
from __future__ import annotations

import gzip
import os
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profkit.errors import ParseError
from mutations import FIX, KINDS, TARGETS, apply, read_input

OPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 10**9), st.integers(0, 10**6)),
               min_size=1, max_size=4)
PROPERTY = settings(max_examples=int(os.environ.get("PROFKIT_HYPOTHESIS_EXAMPLES", "60")),
                    deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)

_rate: dict[str, float] = {}


def _seconds_per_byte(name: str) -> float:
    """The parser's own speed on its unmutated fixtures, measured here (best of 3)."""
    if name not in _rate:
        t = TARGETS[name]
        best = []
        for p in t.fixtures:
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                t.parse(p)
                times.append(time.perf_counter() - t0)
            best.append(min(times) / max(1, len(read_input(p))))
        _rate[name] = max(best)
    return _rate[name]


def _check(name: str, data: bytes, *, gz: bool = False) -> None:
    t = TARGETS[name]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / (f"input{t.suffix}" + (".gz" if gz else ""))
        path.write_bytes(data)
        t0 = time.perf_counter()
        try:
            t.parse(path)
        except ParseError as e:
            # one line naming the input (EXPLAIN JSON is parsed from bytes: no file name)
            assert name in ("explain_json", "explain_text") or str(path) in str(e), str(e)
        elapsed = time.perf_counter() - t0
    # Linear: a generous multiple of the parser's own rate on its fixture, plus a fixed
    # allowance for start-up (pandas tables) and a shared 2-core machine. A quadratic
    # pattern on the 60,000-byte padding costs seconds to minutes and fails here.
    bound = 2.0 + 50 * _seconds_per_byte(name) * len(data)
    assert elapsed < bound, f"{name}: {elapsed:.2f} s for {len(data)} bytes (bound {bound:.2f})"


@pytest.mark.parametrize("name", sorted(TARGETS))
@PROPERTY
@given(ops=OPS, which=st.integers(0, 10))
def test_mutated_fixture_gives_result_or_parse_error(name: str, ops, which: int) -> None:
    fixtures = TARGETS[name].fixtures
    data = apply(read_input(fixtures[which % len(fixtures)]), ops)
    _check(name, data)


@pytest.mark.parametrize("name", ["gprof", "callgrind", "perf_stat", "ltrace"])
@PROPERTY
@given(ops=OPS, cut=st.integers(0, 10**6), compress_first=st.booleans())
def test_mutated_gzip_gives_result_or_parse_error(name: str, ops, cut: int,
                                                  compress_first: bool) -> None:
    """The same mutations on a .gz input: of the text before compressing, or of the
    compressed bytes themselves (a cut or corrupted .gz)."""
    raw = read_input(TARGETS[name].fixtures[0])
    if compress_first:
        data = apply(gzip.compress(raw), ops)
    else:
        data = gzip.compress(apply(raw, ops))
        data = data[: len(data) - cut % 8]  # sometimes cut inside the trailer
    _check(name, data, gz=True)


@pytest.mark.parametrize("name", ["gprof", "callgrind", "perf_stat", "ltrace"])
@PROPERTY
@given(ops=st.lists(st.tuples(st.just("blank_line"), st.integers(0, 10**9),
                              st.integers(0, 10)), min_size=1, max_size=5))
def test_blank_lines_change_nothing(name: str, ops) -> None:
    """Blank lines separate nothing in these formats: inserted anywhere, the tables are
    the same as without them (gprof's call graph used to end at one)."""
    t = TARGETS[name]
    with tempfile.TemporaryDirectory() as d:
        a, b = Path(d) / f"a{t.suffix}", Path(d) / f"b{t.suffix}"
        raw = read_input(t.fixtures[0])
        a.write_bytes(raw)
        b.write_bytes(apply(raw, ops))
        want, got = t.parse(a), t.parse(b)
    tables = {"gprof": lambda p: (p.functions, p.call_edges),
              "callgrind": lambda p: (p.functions,)}.get(name, lambda p: (p,))
    for x, y in zip(tables(want), tables(got), strict=True):
        assert x.equals(y)


# --------------------------------------------------------------------------- regressions


def _tmp(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("name", sorted(set(TARGETS) - {"explain_json", "explain_text"}))  # from bytes
def test_unreadable_inputs_are_one_parse_error(name: str, tmp_path: Path) -> None:
    parse = TARGETS[name].parse
    raw = read_input(TARGETS[name].fixtures[0])
    gz = gzip.compress(raw)
    cases = {
        tmp_path: "is a directory",
        Path("/proc/self/mem"): "cannot read it",
        _tmp(tmp_path, "random.gz", os.urandom(4096)): "not a valid gzip file",
        _tmp(tmp_path, "cut.gz", gz[: len(gz) // 2]): "gzip file is truncated",
        Path("/dev/zero"): "longer than 1,048,576 bytes",
    }
    for path, message in cases.items():
        with pytest.raises(ParseError, match=message) as e:
            parse(path)
        assert str(path) in str(e.value)


def test_random_bytes_are_one_parse_error(tmp_path: Path) -> None:
    junk = bytes(range(256)) * 40 + b'\n"a,b",c\x00\n'
    for name, t in TARGETS.items():
        with pytest.raises(ParseError):
            t.parse(_tmp(tmp_path, f"junk-{name}{t.suffix}", junk))


def _gprof_lines() -> list[str]:
    return (FIX / "gprof" / "cycles.gprof.txt").read_text().splitlines(True)


def test_gprof_blank_line_in_call_graph_keeps_every_edge() -> None:
    from profkit.parse.gprof import parse_gprof

    lines = _gprof_lines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("[3]"))
    assert len(parse_gprof(lines).call_edges) == 11
    assert len(parse_gprof(lines[: at - 4] + ["\n"] + lines[at - 4:]).call_edges) == 11
    # the real report: a blank line after its 100th entry kept the first 3155 of 5163
    real = gzip.decompress((FIX / "gprof" / "pg18-query2.gprof.txt.gz").read_bytes())
    rl = real.decode().splitlines(True)
    seps = [i for i, ln in enumerate(rl) if ln.startswith("-----")]
    blank = rl[: seps[100] + 1] + ["\n"] + rl[seps[100] + 1:]
    assert len(parse_gprof(rl).call_edges) == len(parse_gprof(blank).call_edges) == 5163


def test_gprof_blank_line_in_flat_profile_keeps_every_row() -> None:
    from profkit.parse.gprof import parse_gprof

    lines = _gprof_lines()
    prof = parse_gprof(lines[:8] + ["\n"] + lines[8:])
    assert int(prof.functions["in_flat"].sum()) == 6


def test_gprof_garbled_number_is_an_error_not_a_name() -> None:
    from profkit.parse.gprof import parse_gprof

    text = "".join(_gprof_lines()).replace("250.38   250.38  fib", "250.38   25O.38  fib")
    with pytest.raises(ParseError, match=r"line 8: expected a flat profile row .*digit"):
        parse_gprof(text.splitlines(True))


def test_gprof_cut_inside_flat_profile_is_an_error() -> None:
    from profkit.parse.gprof import parse_gprof

    with pytest.raises(ParseError, match="flat profile ends at the end of the file"):
        parse_gprof(_gprof_lines()[:8])
    # what the brief output really is, accepted when asked
    prof = parse_gprof(_gprof_lines()[:8], strict=False)
    assert int(prof.functions["in_flat"].sum()) == 3


def test_gprof_latin1_names_stay_distinct(tmp_path: Path) -> None:
    from profkit.parse.gprof import parse_gprof

    text = "".join(_gprof_lines()).replace("ping", "p\xe9ng").replace("pong", "p\xe8ng")
    prof = parse_gprof(_tmp(tmp_path, "latin1.txt", text.encode("latin-1")))
    names = set(prof.functions["function"])
    assert {"p\xe9ng", "p\xe8ng"} <= names and not any("\ufffd" in n for n in names)


def test_gprof_long_padding_is_linear() -> None:
    from profkit.parse.gprof import parse_gprof

    head = "".join(_gprof_lines()[:5])
    times = []
    for n in (40_000, 400_000):
        t0 = time.perf_counter()
        with pytest.raises(ParseError):
            parse_gprof([head, " " * n + "x\n"])
        with pytest.raises(ParseError):
            parse_gprof(["index % time    self  children    called     name\n",
                         "[" + " " * n + "x [1]\n", "----------------------------------\n"])
        times.append(time.perf_counter() - t0)
    assert times[1] < 2.0, times  # was 19 s for 40,000 spaces (a .*?\s*$ pattern)


def test_ltrace_garbage_is_an_error_not_an_empty_table() -> None:
    from profkit.parse.ltrace import parse_ltrace_summary

    with pytest.raises(ParseError, match="not an ltrace -c summary"):
        parse_ltrace_summary("Segmentation fault\nsomething else\n")
    assert parse_ltrace_summary("").empty  # ltrace printed nothing: an empty table


def test_perf_stat_random_bytes_and_bad_values(tmp_path: Path) -> None:
    from profkit.parse.perf_stat import parse_perf_stat

    good = (FIX / "perf_stat" / "sleep.perf-stat.csv").read_text()
    df = parse_perf_stat(FIX / "perf_stat" / "sleep.perf-stat.csv")
    assert df.set_index("event").loc["page-faults", "value"] == 179
    assert not df.set_index("event").loc["instructions", "supported"]
    for bad, message in [("2.49,msec,task-clock", "2.4x,msec,task-clock"),
                         ("179,,page-faults", "nan,,page-faults"),
                         ("<not supported>,,cycles", "<garbage>,,cycles"),
                         ("2488820,100.00,0.301", "2488820,1OO.00,0.301")]:
        with pytest.raises(ParseError, match=r"line \d+: .*not a number"):
            parse_perf_stat(_tmp(tmp_path, "bad.csv", good.replace(bad, message).encode()))
    with pytest.raises(ParseError, match="NUL"):
        parse_perf_stat(_tmp(tmp_path, "nul.csv", b"1,,a\x00b,1,100.00,,\n"))


def test_explain_json_malformed_plans_name_the_node() -> None:
    from profkit.parse.explain import flatten_plan

    for bad, message in [
        ('[{"Plan": {"Node Type": "Limit", "Plans": [1]}}]', r"Plans\[0\]: expected a plan"),
        ('[{"Plan": {"Actual Rows": NaN, "Actual Loops": 1}}]', "finite number"),
        ('[{"Plan": {"Actual Rows": "x"}}]', "finite number"),
        ('[{"Plan": {"Plans": {"a": 1}}}]', "should be a list"),
        ('[{"Plan": {"Node Type": 3}}]', "should be text"),
        ('[{"Plan": ', "line 1 column 11"),
        ("[" * 100_000, "nested too deeply"),
    ]:
        with pytest.raises(ParseError, match=message):
            flatten_plan(bad)
    deep: dict = {"Node Type": "Result"}
    for _ in range(5000):
        deep = {"Node Type": "Limit", "Plans": [deep]}
    with pytest.raises(ParseError, match="nested deeper"):
        flatten_plan([{"Plan": deep}])
