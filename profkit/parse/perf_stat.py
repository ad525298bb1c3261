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

Other ``perf stat -x,`` layouts are read by their columns, never shifted into the wrong
ones: ``-r N`` adds the spread over the N runs after the event (``2.17%``:
``variance_pct``); ``-I MS`` starts each line with its time stamp (``time_s``); ``-A``,
``--per-socket``/``--per-die``/``--per-core``/``--per-node`` and ``--per-thread`` start
it with what was aggregated (``CPU0``; ``S0-D0-C1`` and the number of CPUs in it;
``postgres-4242``: ``aggregate`` and ``aggregate_cpus``). These columns are present when
the input has them.
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
# what -A / --per-socket / --per-die / --per-core / --per-cache / --per-node /
# --per-thread put first: CPU3, S0, S0-D0, S0-D0-C1, S0-D0-L3-ID0, N0, postgres-4242
_AGGREGATE = re.compile(r"CPU\d{1,6}|S\d{1,4}(?:-D\d{1,4})?(?:-C\d{1,6}|-L\d-ID\d{1,6})?"
                        r"|N\d{1,4}|[^,]{1,64}-\d{1,10}")
_INT = re.compile(r"\d{1,10}")


def _is_value(s: str) -> bool:
    s = s.strip()
    return s in _UNCOUNTED or bool(_NUMBER.fullmatch(s))


def _prefix(fields: list[str]) -> dict:
    """The columns -I, -A, --per-X put before the value: ``{"time_s": ...}``,
    ``{"aggregate": ..., "aggregate_cpus": ...}``, and how many there are (``"n"``)."""
    out: dict = {"n": 0}
    i = 0
    # -I: a time stamp, then a value or what -A/--per-X aggregated (a plain line has its
    # unit there: never a number, never CPU0)
    if len(fields) > 3 and _NUMBER.fullmatch(fields[0].strip()) and (
            _is_value(fields[1]) or _AGGREGATE.fullmatch(fields[1].strip())):
        out["time_s"] = float(fields[0])
        i = 1
    head = fields[i].strip() if len(fields) > i else ""
    if head and not _is_value(head) and _AGGREGATE.fullmatch(head):
        out["aggregate"] = head
        i += 1
        # --per-socket/die/core/node: the number of CPUs aggregated, then the value
        if (len(fields) > i + 3 and _INT.fullmatch(fields[i].strip())
                and _is_value(fields[i + 1]) and not _is_value(fields[i + 2])):
            out["aggregate_cpus"] = int(fields[i])
            i += 1
    out["n"] = i
    return out


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
        pre = _prefix(fields)
        fields = fields[pre.pop("n"):]
        if len(fields) > 3 and fields[3].strip().endswith("%"):  # -r N: the runs' spread
            pre["variance_pct"] = _optional_float(fields[3].strip()[:-1], "spread over the "
                                                  "runs (-r)", where, lineno)
            fields = fields[:3] + fields[4:]
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
                     "metric_unit": fields[6].strip() if len(fields) > 6 else "", **pre})
    if not rows:
        df = tables.empty("perf_stat")
        df["metric"] = pd.Series(dtype="float64")
        df["metric_unit"] = pd.Series(dtype="string")
        return tables.validate(df, "perf_stat")
    return tables.validate(pd.DataFrame(rows), "perf_stat")
