"""profkit's folding as a drop-in for FlameGraph's stackcollapse-perf.pl.

- FlameGraph's own regression suite (its test.sh: 13 inputs x 6 options against
  test/results/*-collapsed-<opt>.txt), for the C core and the Python reference;
- the Perl script itself as an oracle in default mode, on every suite input and on this
  project's PostgreSQL captures;
- the C core and the Python reference agree byte for byte (and on errors);
- Hypothesis: real fixtures mutated (truncated, noise, blank lines, joined lines, garbled
  digits, non-UTF-8 bytes, long padding) give a folding or a ParseError, never another
  exception, in time proportional to their size; in default mode the same output as Perl.

The suite and the Perl script live outside the project (../shared/flamegraph-suite, or
$PROFKIT_FLAMEGRAPH_SUITE): test data and an oracle, never copied in. Without them these
tests skip, except under CI=true, where a missing suite or perl fails.
"""
from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profkit.errors import ParseError
from profkit.parse import perf_script as ps
from profkit.parse.perf_script import fold_perf_script

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(__file__).parent / "fixtures" / "perf"
OPTIONS = ("pid", "tid", "kernel", "jit", "all", "addrs")
IMPLS = ("c", "python")
# The Perl script at the suite's commit no longer prints these 8 expected files: since its
# Java tidy-up matches process names starting with "java" (it was `eq "java"`), "java-PID"
# frames lose their leading "L" too, and the results were not re-recorded (FlameGraph's own
# test.sh fails on exactly these). profkit follows the recorded results there (FlameGraph's
# suite passes 78/78) and the Perl script everywhere else, default mode included.
STALE_RESULTS = {(opt, f"perf-{name}.txt") for opt in ("pid", "tid")
                 for name in ("java-faults-01", "java-stacks-01", "java-stacks-02",
                              "vertx-stacks-01")}


def _suite() -> Path | None:
    env = os.environ.get("PROFKIT_FLAMEGRAPH_SUITE")
    cand = Path(env) if env else ROOT.parent / "shared" / "flamegraph-suite"
    return cand if (cand / "stackcollapse-perf.pl").is_file() else None


SUITE = _suite()
PERL = shutil.which("perl")


def _need_oracle() -> Path:
    if SUITE is None or PERL is None:
        what = ("FlameGraph's suite (../shared/flamegraph-suite or $PROFKIT_FLAMEGRAPH_SUITE)"
                if SUITE is None else "perl")
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} is missing; under CI=true it is required")
        pytest.skip(f"{what} not found")
    return SUITE


def _inputs() -> list[str]:
    return sorted(p.name for p in (SUITE / "test").glob("*.txt")) if SUITE else ["<none>"]


def _perl(data: bytes, *args: str) -> bytes:
    suite = _need_oracle()
    cp = subprocess.run([PERL, str(suite / "stackcollapse-perf.pl"), *args], input=data,
                        capture_output=True, check=True, timeout=300)
    return cp.stdout


def _read(path: Path) -> bytes:
    return gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()


def _ours(data: bytes | Path, impl: str, **kw: object) -> bytes:
    src = io.BytesIO(data) if isinstance(data, bytes) else data
    return fold_perf_script(src, implementation=impl, **kw).folded_bytes()  # type: ignore[arg-type]


@pytest.fixture(scope="module", autouse=True)
def _c_core_built() -> None:
    # the compiled core is part of the install: a test run without it is a failure
    assert ps._fold is not None, "profkit._fold is not built: pip install -e ."


# ---------------------------------------------------------------- FlameGraph's test.sh

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", _inputs())
@pytest.mark.parametrize("opt", OPTIONS)
def test_flamegraph_suite(opt: str, name: str, impl: str) -> None:
    suite = _need_oracle()
    src = suite / "test" / name
    expected = (suite / "test" / "results" / f"{src.stem}-collapsed-{opt}.txt").read_bytes()
    got = _ours(src, impl, **{opt: True})
    assert got == expected
    if (opt, name) in STALE_RESULTS:
        # the one place profkit and the Perl script part: its results file is stale for it
        assert _perl(src.read_bytes(), f"--{opt}") != expected


def test_suite_has_78_cases_all_exact() -> None:
    suite = _need_oracle()
    inputs = sorted((suite / "test").glob("*.txt"))
    assert len(inputs) * len(OPTIONS) == 78
    exact = sum(_ours(p, impl, **{o: True}) == (suite / "test" / "results" /
                                               f"{p.stem}-collapsed-{o}.txt").read_bytes()
                for o in OPTIONS for p in inputs for impl in IMPLS)
    assert exact == 2 * 78


@pytest.mark.parametrize("opt", OPTIONS)
def test_every_option_matches_perl(opt: str) -> None:
    """Perl's output for every option, except the 8 java --pid/--tid cases where the
    suite's recorded results (which profkit prints) and the script part ways."""
    suite = _need_oracle()
    for p in sorted((suite / "test").glob("*.txt")):
        ours, perl = _ours(p, "c", **{opt: True}), _perl(p.read_bytes(), f"--{opt}")
        if (opt, p.name) in STALE_RESULTS:
            assert ours != perl, p.name
        else:
            assert ours == perl, p.name


# ---------------------------------------------------------------- default mode vs Perl

def _default_inputs() -> list[Path]:
    mine = sorted(FIX.glob("*.perf-script.txt*"))
    return ([SUITE / "test" / n for n in _inputs()] if SUITE else []) + mine


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("path", _default_inputs(), ids=lambda p: p.name)
def test_default_mode_is_the_perl_scripts_output(path: Path, impl: str) -> None:
    data = _read(path)
    perl = _perl(data)
    assert _ours(path, impl) == perl
    if path.name.startswith("pg18-"):
        # a real PostgreSQL capture: weighted by period, [[vdso]]-style names
        assert perl.count(b"\n") > 20 and b" 1001001\n" in perl


@pytest.mark.parametrize("args", [("--event-filter=cpu-clock:ppp",), ("--event-filter=nope",),
                                  ("--pid", "--tid"), ("--all", "--addrs")])
def test_event_filter_and_combinations_match_perl(args: tuple[str, ...]) -> None:
    data = _read(FIX / "pg18-query3.perf-script.txt.gz")
    kw: dict[str, object] = {}
    for a in args:
        if a.startswith("--event-filter="):
            kw["event_filter"] = a.split("=", 1)[1]
        else:
            kw[a[2:]] = True
    for impl in IMPLS:
        assert _ours(data, impl, **kw) == _perl(data, *args)


def test_several_events_keep_the_first_like_perl() -> None:
    suite = _need_oracle()
    data = (suite / "test" / "perf-cycles-instructions-01.txt").read_bytes()
    warnings: list[str] = []
    fold = fold_perf_script(io.BytesIO(data), warn=warnings.append)
    assert fold.events == ("instructions", "cycles")
    assert fold.skipped > 0 and fold.samples > 0
    # what the Perl script writes to stderr (it names the event it leaves out)
    assert warnings[0] == "Filtering for events of type: cycles"
    assert fold.folded_bytes() == _perl(data)


def test_drop_in_command_matches_perl(tmp_path: Path) -> None:
    data = _read(FIX / "pg18-query2.perf-script.txt.gz")
    f = tmp_path / "q2.txt"
    f.write_bytes(data)
    exe = Path(sys.executable).with_name("profkit-stackcollapse-perf")
    cp = subprocess.run([str(exe), "--kernel", str(f)], capture_output=True, check=True)
    assert cp.stdout == _perl(data, "--kernel")
    cp = subprocess.run([str(exe)], input=data, capture_output=True, check=True)  # stdin
    assert cp.stdout == _perl(data)
    two = subprocess.run([str(exe), str(f), str(f)], capture_output=True, check=True)
    assert two.stdout == _perl(data + data)                        # files concatenated
    cut = tmp_path / "cut.txt"                 # a file whose last line has no newline
    cut.write_bytes(data[:data.rindex(b"\n\n") + 1] + HEADER[:-1])
    argv = [str(cut), str(f)]
    cp = subprocess.run([str(exe), *argv], capture_output=True, check=True)
    assert cp.stdout == subprocess.run([PERL, str(SUITE / "stackcollapse-perf.pl"), *argv],
                                       capture_output=True, check=True).stdout
    cp = subprocess.run([str(exe), "--event-filter", "cpu-clock:ppp", "--tid", str(f)],
                        capture_output=True, check=True)
    assert cp.stdout == _perl(data, "--event-filter=cpu-clock:ppp", "--tid")
    bad = subprocess.run([str(exe), "--strict", str(cut)], capture_output=True)
    assert bad.returncode == 2 and b"expected a newline at the end" in bad.stderr
    assert b"--event-filter" in subprocess.run([str(exe), "--help"], capture_output=True,
                                               check=True).stdout


# ---------------------------------------------------------------- C core == reference

PROFKIT_MODES: list[dict[str, object]] = [
    {}, {"weight": "samples"}, {"strict": True}, {"vdso_names": True},
    {"vdso": FIX / "vdso-linux-6.18-x86_64.so", "weight": "samples", "strict": True},
    {"pid": True, "tid": True, "all": True, "addrs": True},
    {"event_filter": "cpu-clock:ppp", "kernel": True},
]


def _outcome(data: bytes, impl: str, **kw: object) -> tuple[str, object]:
    try:
        f = fold_perf_script(io.BytesIO(data), implementation=impl, **kw)  # type: ignore[arg-type]
    except ParseError as e:
        return "error", str(e)
    return "ok", (f.folded_bytes(), dict(f.modules), f.samples, f.skipped, f.events, f.lines,
                  f.bytes, f.unrecognized, f.first_unrecognized)


@pytest.mark.parametrize("kw", PROFKIT_MODES, ids=lambda k: ",".join(k) or "default")
def test_c_core_agrees_with_reference(kw: dict[str, object]) -> None:
    for path in sorted(FIX.glob("*.perf-script.txt*")):
        data = _read(path)
        assert _outcome(data, "c", **kw) == _outcome(data, "python", **kw), path.name


def test_c_core_agrees_on_any_chunking() -> None:
    data = _read(FIX / "pg18-query3.perf-script.txt.gz")
    ref = _ours(data, "python", strict=True)
    for size in (1, 7, 4096):
        chunks = [data[i:i + size] for i in range(0, len(data), size)]
        assert fold_perf_script(iter(chunks), implementation="c", strict=True
                                ).folded_bytes() == ref


# ---------------------------------------------------------------- bad input (issue 14)

HEADER = b"postgres 28954   525.733319:    1001001 cpu-clock:ppp: \n"
F1 = b"\t             b46 __vdso_clock_gettime+0x56 ([vdso])\n"
F2 = b"\t           cf439 clock_gettime@@GLIBC_2.17+0x19 (/usr/lib/x86_64-linux-gnu/libc.so.6)\n"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("text,message", [
    (HEADER + b"\t  b48 __vdso_clock_gettime+0x58 ([vdso]) \t cf439 clock_gettime@@GLIBC_2.17\n"
     + F2 + b"\n", r"line 2: expected one callchain frame .* got '\\t  b48 __vdso"),
    (b"postgres abc 525.733319:    1001001 cpu-clock:ppp: \n" + F1 + b"\n",
     r"line 1: expected a sample header .* numeric PID"),
    (HEADER + F1 + F2, r"line 1: expected a blank line closing the last sample"),
    (HEADER + F1 + F2 + b"\n" + HEADER + F1[:20], r"line 6: expected a newline at the end"),
    (F1 + b"\n", r"line 1: expected a sample header before this callchain frame"),
    (HEADER + F1 + HEADER + F1 + b"\n", r"line 3: expected a blank line ending the previous"),
    (HEADER + b"lorem ipsum dolor\n\n", r"line 2: expected a sample header .* or a blank line"),
])
def test_strict_errors_name_file_line_and_expectation(text: bytes, message: str, impl: str,
                                                      tmp_path: Path) -> None:
    f = tmp_path / "bad.txt"
    f.write_bytes(text)
    with pytest.raises(ParseError, match=message) as e:
        fold_perf_script(f, strict=True, implementation=impl)
    assert str(f) in str(e.value)
    # the default mode reads it as the Perl script does, without an error
    if PERL and SUITE:
        assert _ours(text, impl) == _perl(text)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_line_over_1_mb_is_refused_in_every_mode(impl: str) -> None:
    text = HEADER + b"\t" + b"x" * (2 << 20) + b"\n\n"
    with pytest.raises(ParseError, match=r"line 2: expected a line of at most 1 MB"):
        fold_perf_script(io.BytesIO(text), implementation=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_perf_data_is_refused(impl: str) -> None:
    with pytest.raises(ParseError, match="got a perf.data file"):
        fold_perf_script(io.BytesIO(b"PERFILE2\x00\x01\x02\n"), implementation=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_padding_is_linear(impl: str) -> None:
    # the Perl patterns (lazy comm, greedy symbol) backtrack quadratically on long runs
    # of spaces; the scans here are linear: 40k and 400k spaces, 10x the time at most
    def run(n: int) -> float:
        text = (b"postgres" + b" " * n + b"x\n" + HEADER + b"\t" + b" " * n + b"b46 f" +
                b" " * n + b"(m)\n\n")
        t = time.perf_counter()
        fold_perf_script(io.BytesIO(text), implementation=impl)
        return time.perf_counter() - t
    small, big = run(40_000), run(400_000)
    assert big < 2.0 and big < 40 * max(small, 1e-3)


@pytest.mark.parametrize("impl", IMPLS)
def test_non_utf8_names_stay_distinct(impl: str) -> None:
    text = b"".join(HEADER + b"\t  1 caf" + c + b"+0x1 (/bin/x)\n\n" for c in (b"\xe9", b"\xe8"))
    fold = fold_perf_script(io.BytesIO(text), implementation=impl)
    assert len(fold.counts) == 2
    out = fold.folded_bytes()
    assert b"postgres;caf\xe9 1001001\n" in out and b"postgres;caf\xe8 1001001\n" in out
    if PERL and SUITE:
        assert out == _perl(text)


@pytest.mark.parametrize("impl", IMPLS)
def test_perl_numbers_past_2_64(impl: str) -> None:
    big = b"18446744073709551615"                 # UV_MAX: still an integer
    text = (b"pp 1 1.0: " + big + b" ev:\n\t1 f (m)\n\n") * 2 + b"qq 1 1.0: 00 ev:\n\n"
    out = _ours(text, impl)
    assert out == b"pp;f 3.68934881474191e+19\nqq 0\n"
    if PERL and SUITE:
        assert out == _perl(text)


# ---------------------------------------------------------------- Hypothesis

def _fixture_texts() -> list[bytes]:
    return [(FIX / "clockloop.perf-script.txt").read_bytes(),
            (FIX / "clockloop.allfields.perf-script.txt").read_bytes(),
            _read(FIX / "pg18-query3.perf-script.txt.gz")[:60_000],
            _read(FIX / "pg18-query2.perf-script.txt.gz")[:30_000]]


TEXTS = _fixture_texts()

_mutation = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("noise"), st.floats(0, 1), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("blank"), st.floats(0, 1), st.integers(1, 3)),
    st.tuples(st.just("join"), st.floats(0, 1)),
    st.tuples(st.just("digits"), st.floats(0, 1), st.sampled_from(b"x:/ .\t\x00\xff9")),
    st.tuples(st.just("latin1"), st.floats(0, 1), st.sampled_from([b"\xe9", b"\xff\xfe", b"\x80"])),
    st.tuples(st.just("pad"), st.floats(0, 1), st.integers(1, 60_000)),
)


def _mutate(data: bytes, muts: list[tuple]) -> bytes:
    for m in muts:
        kind, frac = m[0], m[1]
        at = int(frac * len(data))
        if kind == "truncate":
            data = data[:at]
        elif kind == "noise":
            data = data[:at] + m[2] + data[at:]
        elif kind == "blank":
            i = data.find(b"\n", at)
            if i >= 0:
                data = data[:i + 1] + b"\n" * m[2] + data[i + 1:]
        elif kind == "join":
            i = data.find(b"\n", at)
            if i >= 0:
                data = data[:i] + b" " + data[i + 1:]
        elif kind == "digits":
            for i in range(at, min(len(data), at + 200)):
                if 48 <= data[i] <= 57:
                    data = data[:i] + bytes([m[2]]) + data[i + 1:]
                    break
        elif kind == "latin1":
            data = data[:at] + m[2] + data[at:]
        elif kind == "pad":
            data = data[:at] + b" " * m[2] + data[at:]
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(range(len(TEXTS))), st.lists(_mutation, min_size=1, max_size=4),
       st.booleans())
def test_mutated_fixtures_fold_or_raise_parseerror(which: int, muts: list[tuple],
                                                   strict: bool) -> None:
    data = _mutate(TEXTS[which], muts)
    results = {}
    for impl in IMPLS:
        t = time.perf_counter()
        results[impl] = _outcome(data, impl, strict=strict)   # anything else propagates
        elapsed = time.perf_counter() - t
        assert elapsed < 1.0 + len(data) * 20e-6, (impl, len(data), elapsed)
    assert results["c"] == results["python"]
    if not strict:
        assert results["c"][0] == "ok"       # the Perl reading never fails on these
        if PERL and SUITE:
            assert results["c"][1][0] == _perl(data)  # type: ignore[index]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(range(len(TEXTS))), st.lists(_mutation, min_size=1, max_size=4))
def test_mutated_folded_files_read_or_raise_parseerror(which: int, muts: list[tuple]) -> None:
    from profkit.parse.folded import read_folded

    folded = fold_perf_script(io.BytesIO(TEXTS[which])).folded_bytes()
    data = _mutate(folded, muts)
    t = time.perf_counter()
    try:
        counts = read_folded(io.BytesIO(data))
    except ParseError:
        return
    finally:
        assert time.perf_counter() - t < 1.0 + len(data) * 20e-6
    assert all(v >= 0 for v in counts.values())


# ---------------------------------------------------------------- --inline (addr2line)

INLINE_C = r"""
#include <stdio.h>
static inline __attribute__((always_inline)) double leaf(double x)
{ for (int i = 0; i < 200; i++) x = x * 1.0000001 + 0.5; return x; }
static inline __attribute__((always_inline)) double mid(double x)
{ return leaf(x) + leaf(x * 2); }
__attribute__((noinline)) double outer(double x) { return mid(x) * 0.5; }
int main(void) { double s = 0; for (long i = 0; i < 1500000; i++) s += outer(i);
  printf("%f\n", s); return 0; }
"""


def _compiled(tmp_path: Path, name: str, source: str, *tools: str) -> Path:
    """*source* compiled here with -O2 -g and frame pointers, as tmp_path/name; the
    oracle and *tools* (besides gcc and perf) checked first."""
    _need_oracle()
    for tool in ("gcc", "perf", *tools):
        assert shutil.which(tool), f"{tool} is installed by scripts/setup-system.sh"
    src, exe = tmp_path / f"{name}.c", tmp_path / name
    src.write_text(source)
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-o", str(exe), str(src)],
                   check=True)
    return exe


def _perf_record(prog: Path, *record_args: str) -> Path:
    """`perf record -g` (and *record_args*) of *prog* run here: the perf.data file."""
    data = prog.with_name(prog.name + ".data")
    subprocess.run(["perf", "record", "-q", "-F", "999", "-g", *record_args, "-o", str(data),
                    str(prog)], check=True, capture_output=True, timeout=120)
    return data


def _perf_script(data: Path, *script_args: str) -> bytes:
    return subprocess.run(["perf", "script", "-i", str(data), *script_args], check=True,
                          capture_output=True, timeout=300).stdout


def _perf_script_of(prog: Path, *script_args: str) -> bytes:
    """`perf record -g` of *prog* run here, then its `perf script` text."""
    return _perf_script(_perf_record(prog), *script_args)


def test_inline_matches_perl_on_a_real_recording(tmp_path: Path) -> None:
    """A program with inlined functions, compiled with -g and recorded by perf here:
    --inline (and --context) un-inline through addr2line exactly as the Perl script."""
    exe = _compiled(tmp_path, "inl", INLINE_C, "addr2line")
    text = _perf_script_of(exe)
    txt = tmp_path / "inl.txt"
    txt.write_bytes(text)
    ours = fold_perf_script(txt, inline=True).folded_bytes()
    assert ours == _perl(text, "--inline")
    assert b";outer;mid;leaf " in ours                  # the inlined frames appear
    ctx = fold_perf_script(io.BytesIO(text), inline=True, context=True).folded_bytes()
    assert ctx == _perl(text, "--inline", "--context")
    assert b"outer:inl.c:" in ctx


# ---------------------------------------------------------------- side-band events, fields

SIDEBAND_C = r"""
#include <pthread.h>
#include <unistd.h>
#include <sys/wait.h>
static volatile long sink;
__attribute__((noinline)) static void *spin(void *a)
{ for (long i = 0; i < 40000000; i++) sink += i; return a; }
int main(void) { pthread_t t; pthread_create(&t, 0, spin, 0); spin(0); pthread_join(t, 0);
  pid_t c = fork(); if (c == 0) { spin(0); _exit(0); } waitpid(c, 0, 0); return 0; }
"""
# what other machines' `perf script` adds or leaves out: side-band records between the
# samples (mmap, task, context-switch, namespace, lost), nanosecond times, chosen fields
SCRIPT_VARIANTS = [(), ("--show-mmap-events", "--show-task-events", "--show-switch-events",
                        "--show-namespace-events", "--show-lost-events"),
                   ("--ns",), ("-F", "comm,tid,ip,sym"), ("-F", "+period"), ("-G",),
                   ("-F", "comm,pid,tid,time,event,ip,sym,dso", "--show-switch-events")]


def test_sideband_records_and_fields_fold_as_perl_does(tmp_path: Path) -> None:
    """A program with a thread and a child, recorded here with context-switch records: its
    `perf script` text under each of SCRIPT_VARIANTS folds to the Perl script's bytes, by
    both cores and with --pid/--tid."""
    data = _perf_record(_compiled(tmp_path, "sideband", SIDEBAND_C), "--switch-events")
    for args in SCRIPT_VARIANTS:
        text = _perf_script(data, *args)
        if "--show-switch-events" in args:
            assert b"PERF_RECORD_SWITCH" in text, args
        perl = _perl(text)
        if args == ("-G",):  # no call graphs printed: nothing to fold, for either
            assert perl == b"", perl[:300]
        else:  # without the dso field the frames are not stack lines to the Perl script:
            # only the process names remain
            assert perl.strip() and (b";spin " in perl) == ("comm,tid,ip,sym" not in args), \
                (args, perl[:300])
        for impl in IMPLS:
            assert _ours(text, impl) == perl, (args, impl)
            assert _ours(text, impl, pid=True, tid=True) == _perl(text, "--pid", "--tid"), args


def test_perf_script_with_its_header_is_sniffed_as_perf_script(tmp_path: Path) -> None:
    """`perf script --header` (and --header -I) starts with some 30 to 60 comment lines:
    `profkit flamegraph` and `load_stacks` take it for perf script text and fold it as
    without the header. (They once took it for folded stacks: the first ten lines they
    sniffed were all comments; flamegraph then refused the file at its first sample.)"""
    from click.testing import CliRunner

    from profkit.cli.flamegraph import flamegraph_cmd
    from profkit.parse import detect_stack_format, load_stacks

    data = _perf_record(_compiled(tmp_path, "sideband", SIDEBAND_C))
    plain = _perf_script(data)
    want = fold_perf_script(io.BytesIO(plain), weight="samples").counts
    assert sum(want.values()) > 50
    for args in (("--header",), ("--header", "-I")):
        text = _perf_script(data, *args)
        assert text.startswith(b"# ========") and text.count(b"\n#") >= 25, text[:200]
        f = tmp_path / "with-header.txt"
        f.write_bytes(text)
        assert detect_stack_format(f) == "perf-script", args
        assert load_stacks(f, weight="samples") == want, args
        out = tmp_path / "h.svg"
        r = CliRunner().invoke(flamegraph_cmd, [str(f), "-o", str(out)])
        assert r.exit_code == 0, (args, r.output)
        assert f"samples: {round(sum(want.values())):,}" in out.read_text(), args


# ---------------------------------------------------------------- --srcline

SRCLINE_C = r"""
#include <stdio.h>
#include <string.h>
static volatile unsigned long sink;
static inline unsigned long mix(unsigned long x) { return x * 2654435761u ^ (x >> 7); }
__attribute__((noinline)) unsigned long leaf(unsigned long n)
{ unsigned long s = 0; for (unsigned long i = 0; i < n; i++) s += mix(i); return s; }
__attribute__((noinline)) unsigned long mid(unsigned long n)
{ char buf[4096]; memset(buf, 1 + (int)(n & 7), sizeof buf - 1); buf[sizeof buf - 1] = 0;
  return leaf(n) + (unsigned long)strlen(buf); }
int main(void) { for (int r = 0; r < 400; r++) sink += mid(150000 + r);
  printf("%lu\\n", sink); return 0; }
"""


def test_srcline_matches_perl_on_a_real_recording(tmp_path: Path) -> None:
    """`perf script -F+srcline` of a program recorded here (and of its stripped copy,
    whose frames have no symbol): --srcline adds each frame's source line as the Perl
    script does, with every option, through the library, `profkit parse perf-script` and
    the drop-in command."""
    exe = _compiled(tmp_path, "srcl", SRCLINE_C, "strip")
    src = tmp_path / "srcl.c"
    # built apart (its own build id: perf would find the first one's symbols by it)
    stripped = tmp_path / "srcl-stripped"
    subprocess.run(["gcc", "-O1", "-fno-omit-frame-pointer", "-o", str(stripped), str(src)],
                   check=True)
    subprocess.run(["strip", str(stripped)], check=True)
    text = _perf_script_of(exe, "-F+srcline") + _perf_script_of(stripped, "-F+srcline")
    txt = tmp_path / "srcl.txt"
    txt.write_bytes(text)
    assert text.count(b"\n  srcl.c:") > 20          # perf wrote the source lines
    ours = fold_perf_script(txt, srcline=True).folded_bytes()
    assert ours == _perl(text, "--srcline")
    assert b";main:srcl.c:" in ours and b";leaf:srcl.c:" in ours
    # a frame of the stripped copy: its module's name, and perf's "srcl-stripped[11bc]"
    assert b";[srcl-stripped]:srcl-stripped" in ours
    for opt in OPTIONS:
        assert fold_perf_script(txt, srcline=True, **{opt: True}).folded_bytes() == \
            _perl(text, "--srcline", f"--{opt}"), opt
    cli = subprocess.run([sys.executable, "-m", "profkit", "parse", "perf-script", "--srcline",
                          "--kernel", str(txt)], capture_output=True, check=True)
    assert cli.stdout == _perl(text, "--srcline", "--kernel")
    exe_cmd = Path(sys.executable).with_name("profkit-stackcollapse-perf")
    drop = subprocess.run([str(exe_cmd), "--srcline", "--pid", str(txt)], capture_output=True,
                          check=True)
    assert drop.stdout == _perl(text, "--srcline", "--pid")
    # without --srcline the source lines are what the Perl script skips; --strict names them
    assert fold_perf_script(txt).folded_bytes() == _perl(text)
    with pytest.raises(ParseError, match=r"line 3: .*source line of `perf script "
                                         r"-F\+srcline`: fold with srcline=True"):
        fold_perf_script(txt, strict=True)
    with pytest.raises(ParseError, match="srcline=True runs in the Python implementation"):
        fold_perf_script(txt, srcline=True, implementation="c")


SRCLINE_EDGES = b"""prog 10/11 1.000001: 3 cycles:
\t    4000 leaf+0x10 (/opt/prog)
  leaf.c:10 (discriminator 2)
\t    5000 outer->inner+0x8 (/opt/prog)
  outer.c:3
  [inlined] inner.h:7
\t    6000 [unknown] ([unknown])
\t    7000 main+0x1 (/opt/prog)
  main.c:1

prog 10/11 1.000002: 5 faults:
\t    4000 leaf+0x10 (/opt/prog)
  leaf.c:10

prog 10/12 1.000003: 2 cycles:
\t    8000 [unknown] (/opt/lib.so)
  lib.so[8000]
\t    9000 start+0x2 (/opt/prog)
  ??:0

prog 10/12 1.000004: 4 cycles:
\t    4000 leaf+0x10 (/opt/prog)
"""


@pytest.mark.parametrize("args", [("--srcline",), ("--srcline", "--event-filter=faults"),
                                  ("--srcline", "--tid", "--addrs"), ()])
def test_srcline_reads_the_lines_the_perl_script_reads(args: tuple[str, ...]) -> None:
    """A frame of an unknown module reads no source line; an inline chain (a->b) reads one
    per name; "[...]" parts are dropped; a sample of another event reads none; a text that
    ends waiting for a source line is the Perl script's too.  Without --srcline, a source
    line with a discriminator, "leaf.c:10 (discriminator 2)", is a frame to the Perl
    script's pattern: profkit reads it so too."""
    kw: dict[str, object] = {}
    for a in args:
        k, _, v = a[2:].partition("=")
        kw[k.replace("-", "_")] = v or True
    ours = fold_perf_script(io.BytesIO(SRCLINE_EDGES), **kw).folded_bytes()  # type: ignore[arg-type]
    assert ours == _perl(SRCLINE_EDGES, *args)
    want = {("--srcline",): b"prog;main:main.c:1;[unknown];outer:outer.c:3;inner_[i]:inner.h:7;"
                            b"leaf:leaf.c:10 (discriminator 2) 3\n"
                            b"prog;start:??:0;[lib.so]:lib.so 2\n",
            ("--srcline", "--event-filter=faults"): b"prog;leaf:leaf.c:10 5\n"}
    if args in want:
        assert ours == want[args]


@pytest.mark.parametrize("cache_max,table_max", [(0, 1 << 30), (4096, 0), (20_000, 3000)])
def test_c_core_limits_keep_the_output(cache_max: int, table_max: int) -> None:
    """Past its line cache's size the core folds without it, and its table of samples is
    flushed into the result when it grows: the same stacks either way."""
    from profkit import _fold

    data = _read(FIX / "pg18-query3.perf-script.txt.gz")
    ref = fold_perf_script(io.BytesIO(data), implementation="python")
    f = _fold.Folder(cache_max=cache_max, table_max=table_max)
    for i in range(0, len(data), 65536):
        f.feed(data[i:i + 65536])
    f.finish()
    collapsed, modules, stats = f.result()
    assert {k.decode(): v for k, v in collapsed.items()} == ref.counts
    assert stats["samples"] == ref.samples


def test_cli_event_filter_that_matches_nothing_is_an_error() -> None:
    """The Perl script prints nothing and exits 0 for an event the file lacks; profkit
    says which events the file has (exit 1), and a present event still folds."""
    from click.testing import CliRunner

    from profkit.cli import main

    src = str(FIX / "clockloop.perf-script.txt")
    r = CliRunner().invoke(main, ["parse", "perf-script", "--event-filter", "nosuch", src])
    assert r.exit_code == 1
    assert "no sample of event 'nosuch'" in r.output and "cpu-clock:ppp" in r.output
    r = CliRunner().invoke(main, ["parse", "perf-script", "--event-filter", "cpu-clock:ppp", src])
    assert r.exit_code == 0 and r.output.endswith("read_clock 17017017\n"), r.output[-200:]


# ------------------------------------- `profkit parse perf-script`: the compiled path

CLI_OPTION_SETS: list[tuple[str, ...]] = [
    (), ("--strict",), ("--pid", "--tid"), ("--all", "--addrs"), ("--kernel",), ("--jit",),
    ("--event-filter", "cpu-clock:ppp"), ("--event-filter", "cpu-clock:ppp", "--tid"),
]


def _cli_inputs(tmp_path: Path) -> list[Path]:
    out = []
    for p in sorted(FIX.glob("*.perf-script.txt*")):
        if p.suffix == ".gz":      # the fast path reads plain text (.gz takes the other one)
            q = tmp_path / p.name.removesuffix(".gz")
            q.write_bytes(_read(p))
            p = q
        out.append(p)
    if SUITE is not None:
        out += sorted((SUITE / "test").glob("*.txt"))
    return out


def test_cli_fold_takes_the_compiled_path_and_prints_the_same_bytes(tmp_path: Path) -> None:
    """`profkit parse perf-script FILE` in stackcollapse-perf.pl's weighting goes through
    profkit.stackcollapse (no str per stack, no pandas), and prints byte for byte what
    fold_perf_script(...).folded_bytes() gives, with the same notes and errors."""
    from click.testing import CliRunner

    from profkit.cli import main

    flags = {"--strict": "strict", "--pid": "pid", "--tid": "tid", "--all": "all",
             "--addrs": "addrs", "--kernel": "kernel", "--jit": "jit"}
    runner = CliRunner()
    checked = 0
    for path in _cli_inputs(tmp_path):
        for opts in CLI_OPTION_SETS:
            kw: dict[str, object] = {flags[o]: True for o in opts if o in flags}
            if "--event-filter" in opts:
                kw["event_filter"] = opts[opts.index("--event-filter") + 1]
            warnings: list[str] = []
            try:
                ref = fold_perf_script(path, implementation="c", warn=warnings.append, **kw)
                expected: tuple[int, bytes] = (0, ref.folded_bytes())
                if "event_filter" in kw and ref.samples == 0 and ref.events:
                    expected = (1, b"")
            except ParseError as e:
                expected, warnings = (1, b""), [f"profkit: {e}"]
            r = runner.invoke(main, ["parse", "perf-script", *opts, str(path)])
            assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
            assert (r.exit_code, r.stdout_bytes if r.exit_code == 0 else b"") == expected, \
                (path.name, opts)
            if expected[0] == 0:
                assert r.stderr.splitlines() == warnings, (path.name, opts)
            elif warnings and warnings[0].startswith("profkit: "):
                assert r.stderr.strip() == warnings[0], (path.name, opts)
            checked += 1
    assert checked >= 13 * len(CLI_OPTION_SETS)
    # -o FILE and stdin (`-`) too
    src = FIX / "clockloop.perf-script.txt"
    r = runner.invoke(main, ["parse", "perf-script", str(src), "-o", str(tmp_path / "o")])
    assert r.exit_code == 0 and (tmp_path / "o").read_bytes() == _ours(src, "c")
    r = runner.invoke(main, ["parse", "perf-script", "-"], input=src.read_bytes())
    assert r.exit_code == 0 and r.stdout_bytes == _ours(src, "c")
    # the command itself, as a user runs it: the compiled core, pandas never imported
    code = ("import atexit, sys, runpy\n"
            "atexit.register(lambda: sys.stderr.write(' '.join(sorted(sys.modules))))\n"
            f"sys.argv = ['profkit', 'parse', 'perf-script', {str(src)!r}]\n"
            "runpy.run_module('profkit', run_name='__main__')\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert cp.returncode == 0 and cp.stdout == _ours(src, "c")
    mods = set(cp.stderr.decode().split())
    assert "profkit._fold" in mods and "pandas" not in mods
    assert "profkit.parse.perf_script" not in mods


def test_fast_command_line_answers_as_click_does(tmp_path: Path) -> None:
    """`profkit parse perf-script` with stackcollapse-perf.pl's options is answered without
    click (profkit.__main__ → profkit.stackcollapse.command_main); anything else goes to
    click. Either way, the same exit status, stdout and stderr as the click command."""
    q3 = tmp_path / "q3.txt"
    q3.write_bytes(_read(FIX / "pg18-query3.perf-script.txt.gz"))
    clock = str(FIX / "clockloop.perf-script.txt")
    garbled = str(FIX / "garbled-frame.perf-script.txt")
    cases: list[list[str]] = [
        [clock], [str(q3)], ["--pid", "--tid", str(q3)], ["--all", "--addrs", str(q3)],
        ["--kernel", "--jit", clock], ["--event-filter", "cpu-clock:ppp", clock],
        ["--event-filter=cpu-clock:ppp", "--tid", clock], ["--event-filter", "nosuch", clock],
        ["--strict", garbled], [garbled], ["--strict", str(FIX / "truncated-midline.perf-script.txt")],
        [str(FIX / "empty.perf-script.txt")], [str(tmp_path / "none.txt")],
        [clock, "-o", str(tmp_path / "out1")], ["--output=" + str(tmp_path / "out2"), clock],
        [clock, "-o", "/nonexistent/dir/x"],
        # not the fast path's: click answers (usage errors, --help, profkit's own options)
        [], [clock, clock], [str(tmp_path)], ["--samples", clock], ["--nosuch", clock],
        ["--help"], ["--event-filter"], [clock, "-o", str(tmp_path)],
    ]
    click_code = "import sys; from profkit.cli import main; main(prog_name='profkit')"
    for args in cases:
        fast = subprocess.run([sys.executable, "-m", "profkit", "parse", "perf-script", *args],
                              capture_output=True, timeout=60, cwd=tmp_path)
        out_fast = {p.name: p.read_bytes() for p in tmp_path.glob("out*")}
        for p in tmp_path.glob("out*"):
            p.unlink()
        slow = subprocess.run([sys.executable, "-c", click_code, "parse", "perf-script", *args],
                              capture_output=True, timeout=60, cwd=tmp_path)
        out_slow = {p.name: p.read_bytes() for p in tmp_path.glob("out*")}
        for p in tmp_path.glob("out*"):
            p.unlink()
        assert (fast.returncode, fast.stdout, fast.stderr, out_fast) == \
            (slow.returncode, slow.stdout, slow.stderr, out_slow), args
        assert b"Traceback" not in fast.stderr, args
    assert fast.returncode == 2  # the last case: -o a folder is click's usage error
    # the fast path loads neither click nor pandas
    code = ("import atexit, sys, runpy\n"
            "atexit.register(lambda: sys.stderr.write(' '.join(sorted(sys.modules))))\n"
            f"sys.argv = ['profkit', 'parse', 'perf-script', {clock!r}]\n"
            "runpy.run_module('profkit', run_name='__main__')\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    mods = set(cp.stderr.decode().split())
    assert cp.returncode == 0 and "profkit._fold" in mods and "click" not in mods
    assert "pandas" not in mods
    # stdout that cannot be written: one line, exit 1, as click's path says it
    for runner in ([sys.executable, "-m", "profkit"], [sys.executable, "-c", click_code]):
        with open("/dev/full", "wb") as full:
            cp = subprocess.run([*runner, "parse", "perf-script", clock], stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=60)
        assert cp.returncode == 1 and cp.stderr.strip() == (
            "profkit: cannot write to standard output: No space left on device"), cp.stderr
