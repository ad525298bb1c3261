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

import csv
import math
from collections.abc import Iterable

import pandas as pd

from profkit import tables
from profkit.errors import ParseError
from profkit.parse.folded import Source, open_lines


def _float(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return math.nan


def parse_perf_stat(source: Source, *, run_id: str = "", build: str = "") -> pd.DataFrame:
    """Parse ``perf stat -x,`` output (path, file object or lines); see the module doc."""
    lines, to_close = open_lines(source)
    rows: list[dict] = []
    try:
        text_lines: Iterable[str] = (
            (ln.decode("utf-8", "replace") if isinstance(ln, bytes) else ln).rstrip("\r\n")
            for ln in lines)
        for lineno, fields in enumerate(csv.reader(text_lines), 1):
            if not fields or not "".join(fields).strip() or fields[0].startswith("#"):
                continue
            if len(fields) < 3:
                raise ParseError(f"perf stat, line {lineno}: expected 'value,unit,event,...' "
                                 f"(perf stat -x,), got {','.join(fields)[:120]!r}")
            value_s, unit, event = fields[0].strip(), fields[1].strip(), fields[2].strip()
            supported = not value_s.startswith("<")
            value = _float(value_s) if supported else math.nan
            if supported and math.isnan(value):
                raise ParseError(f"perf stat, line {lineno}: counter value {value_s!r} is "
                                 "not a number")
            rows.append({"run_id": run_id, "build": build, "event": event, "value": value,
                         "unit": unit, "supported": supported,
                         "runtime_pct": _float(fields[4]) if len(fields) > 4 else math.nan,
                         "metric": _float(fields[5]) if len(fields) > 5 else math.nan,
                         "metric_unit": fields[6].strip() if len(fields) > 6 else ""})
    finally:
        if to_close is not None:
            to_close.close()
    if not rows:
        df = tables.empty("perf_stat")
        df["metric"] = pd.Series(dtype="float64")
        df["metric_unit"] = pd.Series(dtype="string")
        return tables.validate(df, "perf_stat")
    return tables.validate(pd.DataFrame(rows), "perf_stat")
