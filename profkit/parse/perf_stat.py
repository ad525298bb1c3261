"""``perf stat -x,`` CSV output → the ``perf_stat`` table.

Producer: ``perf stat -x, -o stat.csv -e task-clock,context-switches,... -p PID``
(perf 6.1 field order: value, unit, event, run time, % of run time counted, metric value,
metric unit). Example::

    105.90,msec,task-clock,105901595,100.00,0.239,CPUs utilized
    <not supported>,,instructions,0,100.00,,

becomes rows ``event=task-clock, value=105.9, unit=msec, supported=True,
runtime_pct=100.0`` and ``event=instructions, value=NaN, supported=False`` (a VM
without hardware counters answers ``<not supported>``; ``<not counted>`` is kept the
same way). ``# started on ...`` comments and blank lines are skipped.
"""
from __future__ import annotations

import math
import re

import pandas as pd

from profkit import tables
from profkit.parse._io import Source, describe, open_text, parse_error

# perf prints counter values as plain decimals ("105.90", "1234"); -x, turns grouping off
_NUMBER = re.compile(r"-?\d{1,30}(?:\.\d{1,30})?(?:[eE][-+]?\d{1,3})?")
_UNCOUNTED = ("<not supported>", "<not counted>")


def _optional_float(s: str, what: str, where: str, lineno: int) -> float:
    s = s.strip()
    if not s:
        return math.nan
    if not _NUMBER.fullmatch(s):
        raise parse_error(where, lineno, f"{what} {s[:40]!r} is not a number (perf stat -x, "
                          "prints value,unit,event,run time,% counted,metric,metric unit)")
    return float(s)


def _fields(text: str, where: str, lineno: int) -> list[str]:
    """perf stat -x, fields: perf never quotes, so a quote means this is not its output."""
    if '"' in text or "\x00" in text:
        raise parse_error(where, lineno, "not perf stat -x, output (quotes or NUL bytes in "
                          f"the line): {text[:80]!r}")
    return text.split(",")


def parse_perf_stat(source: Source, *, run_id: str = "", build: str = "") -> pd.DataFrame:
    """Parse ``perf stat -x,`` output (path, file object or lines); see the module doc.

    Every malformed line (too few fields, a value that is not a number or one of
    ``<not supported>``/``<not counted>``, an empty event name) raises one
    :class:`ParseError` naming the file and line.
    """
    where = describe(source)
    rows: list[dict] = []
    for lineno, line in open_text(source):
        text = line.rstrip("\r\n")
        if not text.strip() or text.startswith("#"):
            continue
        fields = _fields(text, where, lineno)
        if len(fields) < 3 or not fields[2].strip():
            raise parse_error(where, lineno, f"expected 'value,unit,event,...' (perf stat "
                              f"-x,), got {text[:120]!r}")
        value_s, unit, event = fields[0].strip(), fields[1].strip(), fields[2].strip()
        supported = value_s not in _UNCOUNTED
        if supported and not _NUMBER.fullmatch(value_s):
            raise parse_error(where, lineno, f"counter value {value_s[:40]!r} is not a number "
                              f"(nor {' / '.join(_UNCOUNTED)})")
        value = float(value_s) if supported else math.nan
        rows.append({"run_id": run_id, "build": build, "event": event, "value": value,
                     "unit": unit, "supported": supported,
                     "runtime_pct": _optional_float(fields[4], "% of run time counted", where,
                                                    lineno) if len(fields) > 4 else math.nan,
                     "metric": _optional_float(fields[5], "metric value", where, lineno)
                     if len(fields) > 5 else math.nan,
                     "metric_unit": fields[6].strip() if len(fields) > 6 else ""})
    if not rows:
        df = tables.empty("perf_stat")
        df["metric"] = pd.Series(dtype="float64")
        df["metric_unit"] = pd.Series(dtype="string")
        return tables.validate(df, "perf_stat")
    return tables.validate(pd.DataFrame(rows), "perf_stat")
