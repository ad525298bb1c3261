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

import pandas as pd

from profkit import tables
from profkit.errors import ParseError

_HEADER = re.compile(r"^\s*%\s*time\s+seconds\s+usecs/call\s+calls\s+function\s*$")
_RULE = re.compile(r"^\s*-+(\s+-+)+\s*$")
_ROW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\s+(\d+)\s+(\d+)\s+(\S.*?)\s*$")
_TOTAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\s+(\d+)\s+total\s*$")


def parse_ltrace_summary(text: str, *, run_id: str = "", build: str = "",
                         module: str = "") -> pd.DataFrame:
    """Rows of an ``ltrace -c`` summary; ``df.attrs["complete"]`` says a total line was seen.

    Empty input (ltrace printed nothing: it never attached, or was killed) gives
    an empty table with ``complete`` False.  Output cut short after some rows
    (ltrace killed while printing) keeps the complete rows, drops a partial last
    line and sets ``complete`` False; a garbled row in the middle raises
    :class:`ParseError`.
    """
    cut = bool(text) and not text.endswith("\n")
    raw = text.splitlines()
    if cut:
        raw = raw[:-1]  # ltrace ends every line with a newline: the last one was cut short
    lines = [ln for ln in raw if ln.strip()]
    rows: list[dict[str, object]] = []
    total_calls: int | None = None
    seen_header = False
    rules = 0
    for line in lines:
        if _HEADER.match(line):
            seen_header = True
            continue
        if _RULE.match(line):
            rules += 1
            continue
        if not seen_header:
            # ltrace may print warnings before the table (e.g. about PIE binaries)
            continue
        t = _TOTAL.match(line)
        if t and rules >= 2:
            total_calls = int(t.group(3))
            continue
        m = _ROW.match(line)
        if m and rules == 1:
            pct, secs, usecs, calls, fn = m.groups()
            rows.append({"function": fn, "calls": int(calls), "self": float(secs),
                         "self_share": float(pct) / 100.0, "usecs_per_call": int(usecs)})
            continue
        raise ParseError(f"unexpected line in ltrace -c output: {line!r}")
    df = pd.DataFrame(rows, columns=["function", "calls", "self", "self_share",
                                     "usecs_per_call"])
    df.insert(0, "run_id", run_id)
    df.insert(1, "build", build)
    df.insert(2, "tool", "ltrace")
    df["module"] = module
    df["total"] = df["self"]
    complete = total_calls is not None and not cut
    if complete and int(df["calls"].sum()) != total_calls:
        raise ParseError(f"ltrace summary rows add up to {int(df['calls'].sum())} calls but its "
                         f"total line says {total_calls}")
    out = tables.validate(df, "functions")
    out.attrs["complete"] = complete
    return out
