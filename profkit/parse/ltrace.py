"""Parse ltrace's ``-c`` call summary into the ``functions`` table.

Produced by ``ltrace -p PID -c -e clock_gettime [-o FILE]`` when ltrace
detaches (SIGINT) or the traced process exits::

    % time     seconds  usecs/call     calls      function
    ------ ----------- ----------- --------- --------------------
    100.00    3.476809          86     40108 clock_gettime
    ------ ----------- ----------- --------- --------------------
    100.00    3.476809                 40108 total

becomes one row ``function="clock_gettime", calls=40108, self=3.476809 (s),
total=3.476809, self_share=1.0, usecs_per_call=86``.  ``seconds`` is the time
spent in the call *as seen through ltrace's breakpoints* (~100 µs per call
here), not the call's real cost.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

import pandas as pd

from profkit import tables
from profkit.parse._io import Source, describe, open_text, parse_error

_HEADER = re.compile(r"%\s*time\s+seconds\s+usecs/call\s+calls\s+function")
_FLOAT = re.compile(r"\d{1,15}(?:\.\d{1,15})?")
_INT = re.compile(r"\d{1,19}")


def _is_rule(text: str) -> bool:
    parts = text.split()
    return len(parts) >= 2 and all(p.count("-") == len(p) for p in parts)


def _row(text: str) -> tuple[float, float, int, int, str] | None:
    """``% time, seconds, usecs/call, calls, function`` of a row, or None."""
    parts = text.split(None, 4)
    if len(parts) != 5:
        return None
    pct, secs, usecs, calls, fn = parts
    if not (_FLOAT.fullmatch(pct) and _FLOAT.fullmatch(secs) and _INT.fullmatch(usecs)
            and _INT.fullmatch(calls)):
        return None
    fn = fn.strip()
    # a symbol name: no tab, no leading digit, no number column (two rows run together)
    if "\t" in fn or fn[:1].isdigit() or any(_FLOAT.fullmatch(t) for t in fn.split()):
        return None
    return float(pct), float(secs), int(usecs), int(calls), fn


def _total(text: str) -> int | None:
    parts = text.split()
    if (len(parts) == 4 and parts[3] == "total" and _FLOAT.fullmatch(parts[0])
            and _FLOAT.fullmatch(parts[1]) and _INT.fullmatch(parts[2])):
        return int(parts[2])
    return None


def parse_ltrace_summary(text: str, *, run_id: str = "", build: str = "",
                         module: str = "") -> pd.DataFrame:
    """Rows of an ``ltrace -c`` summary *text*; ``df.attrs["complete"]`` says a total line
    was seen.

    Empty input (ltrace printed nothing: it never attached, or was killed) gives
    an empty table with ``complete`` False.  Output cut short after some rows
    (ltrace killed while printing) keeps the complete rows, drops a partial last
    line and sets ``complete`` False. Anything else that is not ltrace's table — text
    without its header, a garbled row, a line after the total — raises
    :class:`ParseError` naming the line.
    """
    return _parse(text.splitlines(True), "<ltrace summary>", run_id=run_id, build=build,
                  module=module)


def read_ltrace_summary(source: Source, *, run_id: str = "", build: str = "",
                        module: str = "") -> pd.DataFrame:
    """:func:`parse_ltrace_summary` of a file (``ltrace -c -o FILE``), file object or lines.

    Bytes that are not UTF-8 are read as Latin-1 (see :mod:`profkit.parse._io`), so
    distinct symbol names stay distinct."""
    return _parse((line for _, line in open_text(source)), describe(source), run_id=run_id,
                  build=build, module=module)


def _parse(lines: Iterable[str], where: str, *, run_id: str, build: str,
           module: str) -> pd.DataFrame:
    rows: list[dict[str, object]] = []
    total_calls: int | None = None
    seen_header = False
    rules = 0
    prelude: tuple[int, str] | None = None  # first non-table line before the header
    cut = False
    for lineno, line in enumerate(lines, 1):
        if not line.endswith("\n"):
            # ltrace ends every line with a newline: this one was cut short (a cut
            # header starts with "%"; anything else before a header is not ltrace's)
            cut = True
            if not seen_header and prelude is None and not line.lstrip().startswith("%"):
                prelude = (lineno, line) if line.strip() else None
            break
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        if not seen_header:
            if _HEADER.fullmatch(text.strip()):
                seen_header = True
            elif prelude is None:
                prelude = (lineno, text)  # ltrace may print warnings before the table
            continue
        if _is_rule(text):
            rules += 1
            if rules > 2:
                raise parse_error(where, lineno, "a third rule line in an ltrace -c summary")
            continue
        if total_calls is not None:
            raise parse_error(where, lineno, f"unexpected line after the ltrace -c total line: "
                              f"{text.strip()[:120]!r}")
        if rules >= 2:
            total = _total(text)
            if total is not None:
                total_calls = total
                continue
        if rules == 1:
            row = _row(text)
            if row is not None:
                pct, secs, usecs, calls, fn = row
                rows.append({"function": fn, "calls": calls, "self": secs,
                             "self_share": pct / 100.0, "usecs_per_call": usecs})
                continue
        raise parse_error(where, lineno, f"unexpected line in ltrace -c output (expected "
                          f"'% time  seconds  usecs/call  calls  function' rows between two "
                          f"rules, then the total): {text.strip()[:120]!r}")
    if not seen_header and prelude is not None:
        raise parse_error(where, prelude[0], f"not an ltrace -c summary: no '% time  seconds  "
                          f"usecs/call  calls  function' header (first line: "
                          f"{prelude[1].strip()[:80]!r}). Pass the file written by "
                          f"`ltrace -c -o FILE`.")
    df = pd.DataFrame(rows, columns=["function", "calls", "self", "self_share",
                                     "usecs_per_call"])
    df.insert(0, "run_id", run_id)
    df.insert(1, "build", build)
    df.insert(2, "tool", "ltrace")
    df["module"] = module
    df["total"] = df["self"]
    complete = total_calls is not None and not cut
    if complete and int(df["calls"].sum()) != total_calls:
        raise parse_error(where, None, f"the ltrace summary rows add up to "
                          f"{int(df['calls'].sum())} calls but its total line says "
                          f"{total_calls}")
    out = tables.validate(df, "functions")
    out.attrs["complete"] = complete
    return out
