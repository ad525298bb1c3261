"""Folded stacks: the ``frame;frame;leaf count`` text format, and tables derived from it.

The format is FlameGraph's (``stackcollapse-*.pl`` output, ``perf script report
stackcollapse``, ``py-spy record --format raw``): one line per distinct stack,
frames root→leaf separated by ``;``, a space, and a count::

    postgres;main;PostmasterMain;ExecProcNodeInstr;InstrStartNode 12
    postgres;main;PostmasterMain;ExecProcNodeInstr;__vdso_clock_gettime 140

In memory a folded profile is a ``dict[str, float]`` (stack → count); the
helpers here read and write it, diff two of them, and turn one into the
``stacks`` and ``functions`` tables of :mod:`profkit.tables`.
"""
from __future__ import annotations

import functools
import io
import math
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

from profkit.errors import ParseError
from profkit.parse._io import _open_path

if TYPE_CHECKING:  # pandas loads lazily: folding from the command line never needs it
    import pandas as pd

# The instrumentation family of EXPLAIN ANALYZE, vanilla and patched builds:
# - vanilla: ExecProcNodeInstr wraps every node and calls InstrStartNode/InstrStopNode,
#   which read the clock through clock_gettime (glibc → vDSO);
# - seed step 1/2/3 patches: ExecProcNodeInstrLite, PostExecProcNodeInstr;
# - InstrEndLoop / InstrUpdateTupleCount: per-loop bookkeeping;
# - the "tsc" clock source: this project's tsc_clock patch reads the clock through
#   pg_instr_time_now → pg_rdtsc/pg_rdtscp and converts with pg_instr_ticks_to_ns; the
#   upstream rdtsc thread's names are pg_get_ticks[_fast], pg_ticks_to_ns and
#   pg_clock_gettime[_ns] (all static inline: frames only where gcc did not inline them);
# - the sampled_timing patch decides per call in InstrSampleStart/InstrSampleStop (draws
#   the next gap in InstrSampleSkip); its first version used InstrTimeThisCall.
# `[vdso]` is what an unresolved vDSO frame is called (see profkit.parse.perf_script).
INSTRUMENTATION_FUNCTIONS: frozenset[str] = frozenset({
    "InstrStartNode",
    "InstrStopNode",
    "ExecProcNodeInstr",
    "ExecProcNodeInstrLite",
    "PostExecProcNodeInstr",
    "InstrEndLoop",
    "InstrUpdateTupleCount",
    "clock_gettime",
    "__clock_gettime",
    "__vdso_clock_gettime",
    "[vdso]",
    "pg_instr_time_now",
    "pg_instr_ticks_to_ns",
    "pg_rdtsc",
    "pg_rdtscp",
    "InstrTimeThisCall",
    "InstrSampleStart",
    "InstrSampleStop",
    "InstrSampleSkip",
    "pg_get_ticks",
    "pg_get_ticks_fast",
    "pg_ticks_to_ns",
    "pg_clock_gettime",
    "pg_clock_gettime_ns",
})

# Longest names first so that the alternation prefers the most specific entry; a name
# matches when it *starts with* an entry: "clock_gettime@@GLIBC_2.17", "__clock_gettime64",
# "InstrStopNode.part.0" (gcc clone suffixes) and "pg_get_ticks_fast" all belong.
# Compiled on first use: folding from the command line never needs it.
@functools.cache
def _instr_re() -> re.Pattern[str]:
    return re.compile("|".join(re.escape(n) for n in sorted(INSTRUMENTATION_FUNCTIONS,
                                                               key=len, reverse=True)))


def is_instrumentation(function: str) -> bool:
    """True if *function* belongs to the instrumentation family (prefix match)."""
    return _instr_re().match(function) is not None


# --------------------------------------------------------------------------- reading

Source = str | os.PathLike[str] | IO[bytes] | IO[str] | Iterable[bytes] | Iterable[str]


MAX_LINE = 1 << 20  # bytes; a longer line is refused (no profiler writes one)


def open_lines(source: Source) -> tuple[Iterable[bytes | str], IO | None]:
    """Return an iterable of lines for *source* and the file to close (or None).

    A path opens in binary mode (gzip transparently) so lines stream without decoding
    the whole text, as every parser opens it (:mod:`profkit.parse._io`): a file with a
    UTF-16 byte-order mark (PowerShell's ``>``; speedscope's samples have both byte
    orders) is decoded, a UTF-8 one dropped.  File objects and iterables of lines are
    used as they are. Lines from files are read at most ``MAX_LINE + 2`` bytes at a time,
    so one huge line cannot exhaust memory (the caller refuses it).
    """
    if isinstance(source, str | os.PathLike):
        f = _open_path(Path(source))
        return _bounded(f), f
    if hasattr(source, "readline"):
        return _bounded(source), None  # type: ignore[arg-type]
    return source, None  # type: ignore[return-value]


def _bounded(f: IO) -> Iterator[bytes | str]:
    readline = f.readline
    while True:
        ln = readline(MAX_LINE + 2)
        if not ln:
            return
        yield ln


def source_name(source: object, what: str) -> str:
    """How an error names *source*: ``folded stacks /path/x.folded``, ``... on stdin``."""
    if isinstance(source, str | os.PathLike):
        return f"{what} {os.fspath(source)}"
    name = getattr(source, "name", None)
    if isinstance(name, str) and name and not name.startswith("<"):
        return f"{what} {name}"
    if name == "<stdin>":
        return f"{what} on stdin"
    return what


def _is_count(b: bytes) -> bool:
    """``123``, ``1.5``, ``1.84467440737096e+19`` (what folded writers print), nothing else
    (no ``nan``, ``inf``, ``1_000``, signs or spaces that float() would take); ``6.``, which
    flamegraph.pl reads as 6, too."""
    if b.isdigit():          # the common case, in C
        return True
    n = len(b)
    i = 0
    while i < n and 48 <= b[i] <= 57:
        i += 1
    if i == 0:
        return False
    if i < n and b[i] == 46:  # '.'
        j = i + 1
        while j < n and 48 <= b[j] <= 57:
            j += 1
        i = j  # "6." too: flamegraph.pl's count pattern takes it
    if i < n and b[i] in (69, 101):  # e E
        j = i + 1
        if j < n and b[j] in (43, 45):
            j += 1
        k = j
        while k < n and 48 <= b[k] <= 57:
            k += 1
        if k == j:
            return False
        i = k
    return i == n


class InvalidLines(list):
    """The lines a folded reading left out, as ``(line number, text)``: the first
    :attr:`KEEP` of them (text cut at 200 characters), and :attr:`total`, how many there
    were (a long file of garbage costs no more memory than a short one)."""

    KEEP = 100

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def note(self, lineno: int, text: str) -> None:
        self.total += 1
        if len(self) < self.KEEP:
            self.append((lineno, text[:200]))


def read_folded(source: Source, *, strict: bool = False,
                invalid: InvalidLines | None = None) -> dict[str, float]:
    """Read folded stacks (``a;b;c 12``) into ``{stack: count}``.

    Producer: ``stackcollapse-perf.pl``, ``perf script report stackcollapse``,
    ``profkit parse perf-script``, ``py-spy record --format raw``. Example::

        postgres;ExecProcNodeInstr;InstrStopNode 7     ->   {"postgres;ExecProcNodeInstr;
        postgres;ExecAgg 3                                  InstrStopNode": 7, "postgres;ExecAgg": 3}

    Repeated stacks are summed; blank lines and ``#`` comments are skipped. Counts may
    be integers or decimals (weights). Names are bytes decoded with ``surrogateescape``
    (non-UTF-8 names stay distinct and write back unchanged). Errors
    (:class:`ParseError`, naming the file and line): a line without a trailing count, a
    count that is not a plain number, two counts (a differential file: flamegraph.pl reads
    a line's two trailing numbers as BEFORE AFTER; :func:`read_diff_folded` reads it) and
    a line over 1 MB.

    A last line without its newline is read, as flamegraph.pl and inferno read it: a file
    written by ``"\\n".join(lines)``, or saved by an editor, often ends so. *strict*
    refuses it as a file cut inside its last count; profkit passes it for the files its
    collectors wrote, which always end with a newline.

    *invalid*, an :class:`InvalidLines`, takes the lines that are not ``stack COUNT`` (no
    count after the last space, or a count that is not a number) instead of refusing the
    file: flamegraph.pl and inferno leave such lines out and say how many
    (``Ignored N lines with invalid format``); ``profkit flamegraph`` does the same.
    """
    out: dict[str, float] = {}
    for name, lineno, key, before, count in _records(source, strict=strict, invalid=invalid):
        if before is not None:
            raise ParseError(
                f"{name}, line {lineno}: two counts ({_fmt_count(before)} and "
                f"{_fmt_count(count)}): this is a differential folded file (difffolded.pl's "
                "BEFORE AFTER), not one profile; read it with read_diff_folded, draw it with "
                "profkit flamegraph FILE, or give the two profiles (profkit flamegraph --diff "
                "BEFORE AFTER)")
        out[key] = out.get(key, 0.0) + count
    return out


def read_diff_folded(source: Source, *, strict: bool = False,
                     invalid: InvalidLines | None = None
                     ) -> tuple[dict[str, float], dict[str, float]]:
    """Read a differential folded file (``a;b;c 12 15``: FlameGraph's difffolded.pl
    output, BEFORE AFTER per stack) into its two profiles ``(before, after)``.

    As flamegraph.pl reads such a file, a line with one count is the same in both (it adds
    width and no difference); a stack that is absent on one side has count 0 there (as
    difffolded.pl writes it).  Everything else as :func:`read_folded`.
    """
    before, after, two = _read_sides(source, strict, invalid)
    return (before if two else dict(after)), after


def read_folded_or_diff(source: Source, *, strict: bool = False,
                        invalid: InvalidLines | None = None
                        ) -> tuple[dict[str, float], dict[str, float] | None]:
    """One pass over a folded file that may be differential: ``(stacks, None)`` when no
    line has two counts (:func:`read_folded`'s result), else ``(after, before)`` (as
    :func:`read_diff_folded`; flamegraph.pl draws such a file as a differential, widths
    from AFTER)."""
    before, after, two = _read_sides(source, strict, invalid)
    return after, (before if two else None)


def _read_sides(source: Source, strict: bool, invalid: InvalidLines | None
                ) -> tuple[dict[str, float], dict[str, float], bool]:
    """(before, after, whether any line had two counts).  BEFORE is kept apart only
    from the first two-count line on (until then it is AFTER): a plain file costs one
    dictionary, as read_folded."""
    after: dict[str, float] = {}
    before: dict[str, float] | None = None
    for _name, _lineno, key, first, count in _records(source, strict=strict,
                                                      invalid=invalid):
        if first is not None and before is None:
            before = dict(after)
        if before is not None:
            before[key] = before.get(key, 0.0) + (count if first is None else first)
        after[key] = after.get(key, 0.0) + count
    return (after if before is None else before), after, before is not None


def _records(source: Source, *, strict: bool, invalid: InvalidLines | None = None
             ) -> Iterator[tuple[str, int, str, float | None, float]]:
    """(file name, line number, stack, BEFORE count or None, count) per stack line; a line
    without a valid count goes to *invalid* when one is given, else it is refused."""
    name = source_name(source, "folded stacks")
    lines, to_close = open_lines(source)
    lineno = 0
    try:
        for raw in lines:
            lineno += 1
            b = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
            if len(b) > MAX_LINE + 1:
                raise ParseError(f"{name}, line {lineno}: expected a line of at most 1 MB "
                                 "(is this a folded stacks file?)")
            newline = b.endswith(b"\n")
            line = b.rstrip(b"\r\n")
            if not line.strip() or line.startswith(b"#"):
                continue
            if not newline and strict:
                raise ParseError(
                    f"{name}, line {lineno}: expected a newline after the count: the file ends "
                    f"inside its last line {_show(line)} (truncated? if the file is complete, "
                    "add a final newline)")
            stack, sep, count_s = line.rpartition(b" ")
            try:
                if not sep or not stack.strip():
                    raise ParseError(f"{name}, line {lineno}: expected 'frame;frame;leaf "
                                     f"COUNT', got {_show(line)}")
                count = _count(count_s, name, lineno)
                first: float | None = None
                rest, sep2, first_s = stack.rstrip().rpartition(b" ")
                if sep2 and rest.strip() and _is_count(first_s):  # BEFORE AFTER
                    first, stack = _count(first_s, name, lineno), rest
            except ParseError:
                if invalid is None:
                    raise
                invalid.note(lineno, line[:200].decode("utf-8", "backslashreplace"))
                continue
            yield name, lineno, stack.rstrip().decode("utf-8", "surrogateescape"), first, count
    finally:
        if to_close is not None:
            to_close.close()


def _count(b: bytes, name: str, lineno: int) -> float:
    if not _is_count(b):
        raise ParseError(f"{name}, line {lineno}: expected a number after the last "
                         f"space, got {_show(b)} (is the file truncated?)")
    count = float(b)
    if not math.isfinite(count):
        raise ParseError(f"{name}, line {lineno}: count {_show(b)} is not a finite number")
    return count


def _show(b: bytes) -> str:
    return repr(b[:120].decode("utf-8", "backslashreplace"))


def _fmt_count(c: float) -> str:
    if isinstance(c, int):
        return str(c)
    c = float(c)
    if c.is_integer():
        # Perl prints its doubles %.15g: 1.84467440737096e+19, never 18446744073709551616
        return str(int(c)) if abs(c) < 1e15 else f"{c:.15g}"
    # and 14.2343983248723, not 14.234398324872284 (difffolded.pl's sum of a fractional
    # count)
    return f"{c:.15g}"


def _sort_key(stack: str) -> bytes:
    return stack.encode("utf-8", "surrogateescape")


def iter_folded_lines(counts: Mapping[str, float]) -> Iterator[str]:
    """Yield ``"stack count"`` lines sorted bytewise by stack (stackcollapse's order)."""
    for stack in sorted(counts, key=_sort_key):
        yield f"{stack} {_fmt_count(counts[stack])}"


def format_folded(counts: Mapping[str, float]) -> str:
    """The folded text of *counts* (sorted by stack, newline-terminated; "" when empty)."""
    return "".join(line + "\n" for line in iter_folded_lines(counts))


def write_folded(counts: Mapping[str, float], dest: str | os.PathLike[str] | IO[str]) -> None:
    """Write *counts* as folded text to a path or a text file object (names that came
    from non-UTF-8 bytes are written back as those bytes)."""
    if isinstance(dest, str | os.PathLike):
        with open(dest, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.writelines(line + "\n" for line in iter_folded_lines(counts))
    else:
        dest.writelines(line + "\n" for line in iter_folded_lines(counts))


def as_counts(stacks: Mapping[str, float] | pd.DataFrame | str | os.PathLike[str]
              ) -> dict[str, float]:
    """Accept a counts mapping, a ``stacks`` table, or a folded file path."""
    pd = sys.modules.get("pandas")  # a DataFrame means pandas is loaded already
    if pd is not None and isinstance(stacks, pd.DataFrame):
        if not {"stack", "weight"} <= set(stacks.columns):
            raise ParseError("a stacks DataFrame needs 'stack' and 'weight' columns")
        return {str(k): float(v) for k, v in stacks.groupby("stack")["weight"].sum().items()}
    if isinstance(stacks, str | os.PathLike):
        return read_folded(stacks)
    return dict(stacks)


# --------------------------------------------------------------------------- diff

def diff_folded(a: Mapping[str, float] | pd.DataFrame | str | os.PathLike[str],
                b: Mapping[str, float] | pd.DataFrame | str | os.PathLike[str],
                *, normalise: bool = True) -> pd.DataFrame:
    """Per-stack counts of two profiles, A ("before") scaled to B's total.

    Like FlameGraph's ``difffolded.pl -n``: a stack missing on one side counts 0 there.
    Columns: ``stack``, ``count_a``, ``count_b`` (raw), ``a_norm`` (A × total_B/total_A,
    or A itself with ``normalise=False``), ``delta`` = ``count_b - a_norm`` (positive:
    more samples in B, i.e. slower), ``delta_share`` = ``delta / total_B``.
    Sorted by stack.
    """
    import pandas as pd

    ca, cb = as_counts(a), as_counts(b)
    ta, tb = sum(ca.values()), sum(cb.values())
    scale = (tb / ta) if (normalise and ta > 0 and tb > 0) else 1.0
    keys = sorted(set(ca) | set(cb))
    df = pd.DataFrame({
        "stack": pd.Series(keys, dtype="string"),
        "count_a": pd.Series([ca.get(k, 0.0) for k in keys], dtype="float64"),
        "count_b": pd.Series([cb.get(k, 0.0) for k in keys], dtype="float64"),
    })
    df["a_norm"] = df["count_a"] * scale
    df["delta"] = df["count_b"] - df["a_norm"]
    df["delta_share"] = df["delta"] / tb if tb > 0 else 0.0
    return df


def format_diff_folded(diff: pd.DataFrame, *, exact: bool = False) -> str:
    """difffolded.pl's text, ``stack A B`` per line (sorted by stack; difffolded.pl's order
    is its hash's).  A normalised to B's total (:func:`diff_folded`'s default, ``-n``) is
    cut to a whole number as difffolded.pl -n cuts it (``int(A × total_B / total_A)``);
    *exact* keeps it to 6 decimals instead (flamegraph.pl reads either).  Counts that were
    not scaled are written as read."""
    ta, tb = float(diff["count_a"].sum()), float(diff["count_b"].sum())
    scaled = bool((diff["a_norm"] != diff["count_a"]).any()) and ta > 0
    out = []
    for s, a, a_norm, b in zip(diff["stack"], diff["count_a"], diff["a_norm"],
                               diff["count_b"], strict=True):
        if not scaled:
            shown = a
        elif exact:
            shown = round(a_norm, 6)
        else:  # Perl's int() of the same product and quotient
            shown = float(math.trunc(a * tb / ta))
        out.append(f"{s} {_fmt_count(shown)} {_fmt_count(b)}\n")
    return "".join(out)


# --------------------------------------------------------------------------- tables

def stacks_table(counts: Mapping[str, float], *, run_id: str = "", build: str = "",
                 tool: str = "perf", unit: str = "samples") -> pd.DataFrame:
    """The ``stacks`` table of a folded profile (one row per distinct stack, sorted)."""
    import pandas as pd

    from profkit import tables  # noqa: F401
    keys = sorted(counts)
    n = len(keys)
    df = pd.DataFrame({
        "run_id": [run_id] * n, "build": [build] * n, "tool": [tool] * n,
        "stack": keys, "weight": [float(counts[k]) for k in keys], "unit": [unit] * n,
    })
    return tables.validate(df if n else tables.empty("stacks"), "stacks")


def functions_table(counts: Mapping[str, float], *, modules: Mapping[str, str] | None = None,
                    root_is_process: bool = False, run_id: str = "", build: str = "",
                    tool: str = "perf") -> pd.DataFrame:
    """Self and total samples per function, from folded stacks.

    ``self``: samples where the function is the leaf. ``total``: samples where it is on
    the stack at all, counted once per stack even under recursion (``fib;fib;fib 1``
    adds 1 to fib's total, not 3). ``self_share``/``total_share``: divided by all samples.
    With ``root_is_process`` the root frame is the process name (stackcollapse-perf's
    comm) and is not a function; a stack made of only that frame still counts in the
    denominator. ``calls`` is NA: sampling does not count calls. Sorted by self, then
    total, descending, then name.
    """
    import pandas as pd

    from profkit import tables  # noqa: F401
    modules = modules or {}
    self_w: dict[str, float] = {}
    total_w: dict[str, float] = {}
    grand = 0.0
    for stack, w in counts.items():
        grand += w
        frames = stack.split(";")
        if root_is_process:
            frames = frames[1:]
        if not frames:
            continue
        leaf = frames[-1]
        self_w[leaf] = self_w.get(leaf, 0.0) + w
        for f in set(frames):
            total_w[f] = total_w.get(f, 0.0) + w
    names = sorted(total_w, key=lambda f: (-self_w.get(f, 0.0), -total_w[f], f))
    n = len(names)
    df = pd.DataFrame({
        "run_id": [run_id] * n, "build": [build] * n, "tool": [tool] * n,
        "function": names,
        "module": [modules.get(f, "") for f in names],
        "calls": pd.array([pd.NA] * n, dtype="Int64"),
        "self": [self_w.get(f, 0.0) for f in names],
        "total": [total_w[f] for f in names],
    })
    df["self_share"] = df["self"] / grand if grand else 0.0
    df["total_share"] = df["total"] / grand if grand else 0.0
    if not n:
        df = tables.empty("functions")
        df["total_share"] = pd.Series(dtype="float64")
    return tables.validate(df, "functions")


def instrumentation_share(functions_df: pd.DataFrame) -> float:
    """Share of all samples (self time) spent in :data:`INSTRUMENTATION_FUNCTIONS`.

    Sums ``self_share`` over functions matching :func:`is_instrumentation`; self time,
    not total, because ExecProcNodeInstr is on the stack of nearly every executor sample.
    """
    if functions_df.empty:
        return 0.0
    mask = functions_df["function"].astype(str).map(is_instrumentation)
    return float(functions_df.loc[mask, "self_share"].sum())


def instrumentation_functions(functions_df: pd.DataFrame) -> pd.DataFrame:
    """The rows of *functions_df* that belong to the instrumentation family."""
    mask = functions_df["function"].astype(str).map(is_instrumentation)
    return functions_df.loc[mask].reset_index(drop=True)


def text_lines(source: str) -> Iterable[str]:
    """Lines of an in-memory text (for tests and notebooks)."""
    return io.StringIO(source)
