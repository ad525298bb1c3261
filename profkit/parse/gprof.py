"""GNU gprof's text report → the ``functions`` and ``call_edges`` tables.

Producer: ``gprof BINARY gmon.out`` (default output: flat profile, call graph, index;
``-b``, ``-p`` (flat only) and ``-q`` (call graph only) outputs are read too).
Example (flat profile row, call graph child line)::

     6.01    108.44    10.29 4000215014     0.00     0.00  InstrStartNode
                    0.00    0.03      40/40          ping <cycle 1> [5]

becomes a ``functions`` row ``function=InstrStartNode, calls=4000215014, self=10.29,
cumulative_seconds=108.44, percent_time=6.01`` and a ``call_edges`` row
``caller=main, callee=ping, calls=40`` (the caller is the entry's primary function).

What is kept:

- Flat profile: calls exactly as printed — NA where gprof shows none (functions built
  without ``-pg`` such as ``_init``, which only have time samples); self and cumulative
  seconds; % time; self/total seconds per call, converted from the header's unit
  (``s/call``, ``ms/call``, ``us/call``, ``ns/call``). ``self_share`` = % time / 100.
- Call graph: for each entry, the primary line gives ``total`` (self + children
  seconds), the recursive-call count (``40+6001920``) and the cycle number; each child
  line gives an edge caller → callee with its call count (``4000/8040`` → 4000;
  ``4000`` alone for a call inside a recursion or cycle) and the time propagated along
  it. ``<spontaneous>`` parents become edges from ``<spontaneous>`` with NA calls.
  ``<cycle N as a whole>`` entries are not functions: their member lists are skipped,
  members carry ``cycle = N``.
- Functions that appear only in the call graph (``main`` when it has no samples) are
  added with NA calls unless the call graph shows a count.

A report with no flat-profile or call-graph header raises :class:`ParseError`; so does a
report that stops in the middle of a call-graph entry or mid-line (truncated). An
empty text gives empty tables.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from profkit import tables
from profkit.errors import ParseError
from profkit.parse.folded import Source, open_lines

TOOL = "gprof"

_FLOAT = r"\d+(?:\.\d+)?"
_FLAT_COLS = re.compile(r"^\s*time\s+seconds\s+seconds\s+(?:calls\s+)?(?P<unit>\S+)/call\s+"
                        r"(?P<unit2>\S+)/call\s+name\s*$|^\s*time\s+seconds\s+seconds\s+"
                        r"(?:calls\s+)?name\s*$")
_FLAT_ROW = re.compile(
    rf"^\s*(?P<pct>{_FLOAT})\s+(?P<cum>{_FLOAT})\s+(?P<self>{_FLOAT})\s+"
    rf"(?:(?P<calls>\d+)\s+(?P<spc>{_FLOAT})\s+(?P<tpc>{_FLOAT})\s+)?(?P<name>\S.*?)\s*$"
)
_CG_COLS = re.compile(r"^\s*index\s+%\s*time\s+self\s+children\s+called\s+name\s*$")
# gprof prints the leading "[N]" in a 6-character field, so from index 10000 on the
# closing bracket is cut ("[13794   0.0 ...") and from 100000 on a digit too; the
# trailing "[N]" is always whole, so it is the index and the leading one only a prefix.
_CG_PRIMARY = re.compile(
    rf"^\[(?P<lead>\d+)\]?\s+(?P<pct>{_FLOAT})\s+(?P<self>{_FLOAT})\s+(?P<children>{_FLOAT})"
    rf"\s+(?:(?P<called>\d+)(?:\+(?P<recursive>\d+))?\s+)?(?P<name>\S.*?)"
    rf"\s+\[(?P<index>(?P=lead)\d*)\]\s*$"
)
_CG_LINE = re.compile(
    rf"^\s+(?:(?P<self>{_FLOAT})\s+(?P<children>{_FLOAT})\s+)?"
    rf"(?:(?P<called>\d+)(?:/(?P<total>\d+))?\s+)?(?P<name>\S.*?)\s+\[(?P<index>\d+)\]\s*$"
)
_SPONTANEOUS = re.compile(r"^\s+<spontaneous>\s*$")
_CYCLE_SUFFIX = re.compile(r"^(?P<name>.*?)\s+<cycle (?P<cycle>\d+)>$")
_CYCLE_WHOLE = re.compile(r"^<cycle (?P<cycle>\d+) as a whole>$")
_DASHES = re.compile(r"^-{20,}\s*$")
_SAMPLE = re.compile(r"Each sample counts as (?P<s>[\d.]+) (?P<unit>\S+)")
_UNIT_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "Ks": 1e3, "Ts": math.nan}

SPONTANEOUS = "<spontaneous>"


@dataclass(frozen=True)
class GprofProfile:
    """A parsed gprof report: ``functions`` and ``call_edges`` tables plus header facts."""

    functions: pd.DataFrame
    call_edges: pd.DataFrame
    sample_seconds: float | None = None
    has_flat: bool = False
    has_call_graph: bool = False
    meta: dict[str, str] = field(default_factory=dict)

    def flat_csv(self) -> str:
        """The flat profile as CSV: ``name,calls,self_seconds,cumulative_seconds,
        percent_time`` (calls empty where gprof shows none)."""
        return flat_csv(self.functions)

    def edges_csv(self) -> str:
        """The call graph edges as CSV: ``caller,callee,calls`` (calls empty for
        ``<spontaneous>``)."""
        df = self.call_edges[["caller", "callee", "calls"]]
        return df.to_csv(index=False, lineterminator="\n")


def flat_csv(functions: pd.DataFrame) -> str:
    flat = functions[functions["in_flat"]] if "in_flat" in functions else functions
    df = pd.DataFrame({
        "name": flat["function"], "calls": flat["calls"],
        "self_seconds": flat["self_seconds"], "cumulative_seconds": flat["cumulative_seconds"],
        "percent_time": flat["percent_time"],
    })
    return df.to_csv(index=False, lineterminator="\n")


def _split_cycle(name: str) -> tuple[str, int | None]:
    m = _CYCLE_SUFFIX.match(name)
    if m:
        return m["name"], int(m["cycle"])
    return name, None


def _unit(u: str | None, lineno: int) -> float:
    if u is None:
        return math.nan
    try:
        return _UNIT_S[u]
    except KeyError:
        raise ParseError(f"gprof report, line {lineno}: unknown per-call unit {u!r}/call "
                         f"(expected one of {', '.join(_UNIT_S)})") from None


def _decoded(lines: Iterable[bytes | str]) -> Iterable[str]:
    for raw in lines:
        yield raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


def parse_gprof(source: Source, *, run_id: str = "", build: str = "",
                module: str = "", strict: bool = True) -> GprofProfile:
    """Parse a gprof text report (path, file object or lines); see the module docstring.

    *module* (e.g. ``postgres``) fills the ``module`` column: gprof profiles one binary.
    ``strict``: gprof always ends a call graph with the "Index by function name"
    section, so a call graph without it is a truncated report and raises; pass
    ``strict=False`` for hand-trimmed excerpts.
    """
    lines, to_close = open_lines(source)
    flat: list[dict] = []
    flat_order: dict[str, int] = {}
    primaries: dict[int, dict] = {}
    edges: list[dict] = []
    sample_s: float | None = None
    has_flat = has_cg = has_index = False
    state = "scan"           # scan | flat_hdr | flat | cg | cg_entry
    per_call = math.nan
    entry_lines: list[tuple[int, str]] = []
    lineno = 0
    line = "\n"
    nonblank = 0
    try:
        for lineno, line in enumerate(_decoded(lines), 1):
            text = line.rstrip("\r\n")
            if text.strip():
                nonblank += 1
            if state == "flat":
                if not text.strip():
                    state = "scan"
                    continue
                m = _FLAT_ROW.match(text)
                if m is None:
                    raise ParseError(f"gprof report, line {lineno}: expected a flat profile "
                                     f"row '%time cumulative self [calls self/call total/call] "
                                     f"name', got {text.strip()[:120]!r}")
                name, _cyc = _split_cycle(m["name"])
                calls = int(m["calls"]) if m["calls"] is not None else None
                flat_order.setdefault(name, len(flat))
                flat.append({
                    "function": name, "calls": calls, "self_seconds": float(m["self"]),
                    "cumulative_seconds": float(m["cum"]), "percent_time": float(m["pct"]),
                    # rounded so that 250.38 us/call is 0.00025038, not ...97e-04
                    "self_s_per_call": round(float(m["spc"]) * per_call, 12)
                    if calls is not None else math.nan,
                    "total_s_per_call": round(float(m["tpc"]) * per_call, 12)
                    if calls is not None else math.nan,
                })
                continue
            if state in ("cg", "cg_entry"):
                if _DASHES.match(text):
                    if state == "cg_entry":
                        _entry(entry_lines, primaries, edges)
                    entry_lines = []
                    state = "cg"
                    continue
                if not text.strip():
                    if state == "cg_entry":
                        raise ParseError(f"gprof report, line {lineno}: blank line inside a "
                                         "call graph entry (expected its lines, then a "
                                         "'-----' separator)")
                    state = "scan"  # the explanation or the index follows
                    continue
                if (state == "cg" and not text.startswith((" ", "\t", "["))):
                    state = "scan"
                    continue
                if state == "cg" and not (_CG_PRIMARY.match(text) or _CG_LINE.match(text)
                                          or _SPONTANEOUS.match(text)):
                    state = "scan"  # prose after the last entry
                    continue
                state = "cg_entry"
                entry_lines.append((lineno, text))
                continue
            # scanning between sections
            m = _SAMPLE.search(text)
            if m:
                sample_s = float(m["s"]) * _UNIT_S.get(m["unit"].rstrip("."), 1.0)
                continue
            m = _FLAT_COLS.match(text)
            if m:
                has_flat = True
                per_call = _unit(m.group("unit"), lineno) if m.group("unit") else math.nan
                state = "flat"
                continue
            if text.startswith("Index by function name"):
                has_index = True
                continue
            if _CG_COLS.match(text):
                has_cg = True
                state = "cg"
                entry_lines = []
                continue
        if state == "cg_entry":
            raise ParseError(f"gprof report is truncated: the call graph entry starting at "
                             f"line {entry_lines[0][0]} has no closing '-----' separator "
                             f"(file ends at line {lineno}). Regenerate it with "
                             f"`gprof BINARY gmon.out > report.txt`.")
    finally:
        if to_close is not None:
            to_close.close()

    if lineno and not line.endswith("\n"):
        raise ParseError(f"gprof report is truncated: line {lineno} ends without a newline. "
                         "Regenerate it with `gprof BINARY gmon.out > report.txt`.")
    if nonblank and not (has_flat or has_cg):
        raise ParseError("not a gprof report: no flat profile header (' time   seconds   "
                         "seconds    calls ...  name') and no call graph header ('index % "
                         "time    self  children    called     name') found. Pass the "
                         "text output of `gprof BINARY gmon.out`, not gmon.out itself.")
    if strict and has_cg and not has_index:
        raise ParseError(f"gprof report is truncated: the call graph is not followed by "
                         f"'Index by function name' (file ends at line {lineno}). Regenerate "
                         f"it with `gprof BINARY gmon.out > report.txt`, or pass strict=False "
                         f"for a trimmed excerpt.")
    functions = _functions_table(flat, flat_order, primaries, run_id=run_id, build=build,
                                 module=module)
    call_edges = _edges_table(edges, run_id=run_id, build=build)
    return GprofProfile(functions=functions, call_edges=call_edges, sample_seconds=sample_s,
                        has_flat=has_flat, has_call_graph=has_cg)


def _entry(entry: list[tuple[int, str]], primaries: dict[int, dict], edges: list[dict]) -> None:
    """One call graph entry: parents, the primary ``[N]`` line, children."""
    prim_at = next((i for i, (_, t) in enumerate(entry) if t.startswith("[")), None)
    if prim_at is None:
        raise ParseError(f"gprof report, line {entry[0][0]}: call graph entry without its "
                         "'[index] %time self children called name [index]' line")
    pl, pt = entry[prim_at]
    pm = _CG_PRIMARY.match(pt)
    if pm is None:
        raise ParseError(f"gprof report, line {pl}: expected a call graph primary line "
                         f"'[N] %time self children called name [N]', got {pt.strip()[:120]!r}")
    whole = _CYCLE_WHOLE.match(pm["name"])
    name, cycle = _split_cycle(pm["name"])
    index = int(pm["index"])
    if whole is None:
        primaries[index] = {
            "function": name, "index": index, "cycle": cycle,
            "self": float(pm["self"]), "children": float(pm["children"]),
            "cg_percent": float(pm["pct"]),
            "called": int(pm["called"]) if pm["called"] else None,
            "recursive": int(pm["recursive"]) if pm["recursive"] else None,
        }
    for pos, (ln, t) in enumerate(entry):
        if pos == prim_at:
            continue
        if _SPONTANEOUS.match(t):
            if pos > prim_at:
                raise ParseError(f"gprof report, line {ln}: <spontaneous> below the primary "
                                 "line (only callers can be spontaneous)")
            if whole is None:
                edges.append({"caller": SPONTANEOUS, "callee": name, "calls": None,
                              "total_calls": None, "self_seconds": math.nan,
                              "children_seconds": math.nan, "callee_index": index,
                              "caller_index": None})
            continue
        m = _CG_LINE.match(t)
        if m is None:
            raise ParseError(f"gprof report, line {ln}: expected a call graph line "
                             f"'[self children] called[/total] name [index]', got "
                             f"{t.strip()[:120]!r}")
        if whole is not None:
            continue  # a cycle-as-a-whole's callers and members are not call edges
        if pos < prim_at:
            continue  # callers: the same edges appear as children of their own entries
        other, _ = _split_cycle(m["name"])
        edges.append({
            "caller": name, "callee": other,
            "calls": int(m["called"]) if m["called"] else None,
            "total_calls": int(m["total"]) if m["total"] else None,
            "self_seconds": float(m["self"]) if m["self"] else math.nan,
            "children_seconds": float(m["children"]) if m["children"] else math.nan,
            "caller_index": index, "callee_index": int(m["index"]),
        })


def _functions_table(flat: list[dict], flat_order: dict[str, int], primaries: dict[int, dict],
                     *, run_id: str, build: str, module: str) -> pd.DataFrame:
    by_name = {p["function"]: p for p in primaries.values()}
    rows: list[dict] = []
    for f in flat:
        p = by_name.get(f["function"])
        rows.append({**f, "in_flat": True,
                     "total": (p["self"] + p["children"]) if p else math.nan,
                     "recursive_calls": p["recursive"] if p else None,
                     "index": p["index"] if p else None, "cycle": p["cycle"] if p else None})
    for p in sorted(primaries.values(), key=lambda p: p["index"]):
        if p["function"] in flat_order:
            continue
        rows.append({
            "function": p["function"], "calls": p["called"], "self_seconds": p["self"],
            "cumulative_seconds": math.nan, "percent_time": math.nan,
            "self_s_per_call": math.nan, "total_s_per_call": math.nan, "in_flat": False,
            "total": p["self"] + p["children"], "recursive_calls": p["recursive"],
            "index": p["index"], "cycle": p["cycle"],
        })
    cols = ["function", "calls", "self_seconds", "cumulative_seconds", "percent_time",
            "self_s_per_call", "total_s_per_call", "in_flat", "total", "recursive_calls",
            "index", "cycle"]
    df = pd.DataFrame(rows, columns=cols)
    df.insert(0, "run_id", run_id)
    df.insert(1, "build", build)
    df.insert(2, "tool", TOOL)
    df.insert(4, "module", module)
    df["calls"] = pd.array(df["calls"].tolist(), dtype="Int64")
    for c in ("recursive_calls", "index", "cycle"):
        df[c] = pd.array(df[c].tolist(), dtype="Int64")
    for c in ("self_seconds", "cumulative_seconds", "percent_time", "self_s_per_call",
              "total_s_per_call", "total"):
        df[c] = df[c].astype("float64")
    df["in_flat"] = df["in_flat"].astype("bool")
    df["self"] = df["self_seconds"]
    # share of all sampled time; for call-graph-only rows the flat total is unknown, so
    # use the flat profile's total seconds (the last cumulative figure) when there is one
    grand = float(df.loc[df["in_flat"], "self_seconds"].sum())
    df["self_share"] = (df["percent_time"] / 100.0).round(10).where(
        df["in_flat"], df["self_seconds"] / grand if grand else math.nan)
    df["unit"] = "seconds"
    schema = list(tables.SCHEMAS["functions"])
    df = df[schema + [c for c in df.columns if c not in schema]]
    return tables.validate(df, "functions")


def _edges_table(edges: list[dict], *, run_id: str, build: str) -> pd.DataFrame:
    cols = ["caller", "callee", "calls", "total_calls", "self_seconds", "children_seconds",
            "caller_index", "callee_index"]
    df = pd.DataFrame(edges, columns=cols)
    df.insert(0, "run_id", run_id)
    df.insert(1, "build", build)
    for c in ("calls", "total_calls", "caller_index", "callee_index"):
        df[c] = pd.array(df[c].tolist(), dtype="Int64")
    for c in ("self_seconds", "children_seconds"):
        df[c] = df[c].astype("float64")
    return tables.validate(df, "call_edges")


def read_gprof(path: str | os.PathLike[str], **kwargs: str) -> GprofProfile:
    """Parse the gprof report at *path* (same as :func:`parse_gprof`)."""
    return parse_gprof(path, **kwargs)
