"""GNU gprof's text report → the ``functions`` and ``call_edges`` tables.

Producer: ``gprof BINARY gmon.out`` (default output: flat profile, call graph, index;
``-b``, ``-p`` (flat only) and ``-q`` (call graph only) outputs are read too; so is the
call graph of BSD-derived gprofs, macOS's and AIX's, whose header says ``descendents``
and ``called+self``; and the report of a gprof that counts cycles, an embedded target's,
whose headers say ``cycles`` over a ``(K)`` multiplier line: its time columns are
``self_cycles``, ``cumulative_cycles``, ... and ``time_unit`` is ``"cycles"``).
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

Strictness (gprof's text is read, never guessed at): a report with no flat-profile or
call-graph header raises :class:`ParseError`; so does a report that stops mid-line, in
the middle of a call-graph entry, after the call graph's last entry without the form
feed, explanation or index gprof writes after it, or right after the flat profile's
last row (``strict=False`` accepts the last two: ``gprof -b
-p`` output and trimmed excerpts). Blank lines separate nothing: inside the flat
profile or the call graph they are skipped, not taken as the section's end. A row or
line whose name starts with a digit, holds a tab or a bare number column is rejected
(a garbled number or two lines run together), naming the line. Every input error is
one ``ParseError`` naming the file and line (see :mod:`profkit.parse._io`). An empty
text gives empty tables. Lines are tokenised with linear scans, not backtracking
patterns, so parsing is linear in the input.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from profkit import tables
from profkit.parse._io import Source, describe, open_text, parse_error

TOOL = "gprof"

_FLOAT_TOK = re.compile(r"\d{1,15}(?:\.\d{1,15})?")
_INT_TOK = re.compile(r"\d{1,19}")
_CALLED_TOK = re.compile(r"(?P<called>\d{1,19})(?:\+(?P<recursive>\d{1,19}))?")
# "4000/8040" (calls/total), "4000" (inside a recursion or cycle), "9+7" (a caller of a
# cycle member: calls from outside + inside the cycle)
_CALLED_TOTAL_TOK = re.compile(r"(?P<called>\d{1,19})(?:/(?P<total>\d{1,19})|\+\d{1,19})?")
_TOKEN = re.compile(r"\s*(\S+)")
_FLAT_COLS = re.compile(r"time\s+seconds\s+seconds\s+(?:calls\s+)?(?P<unit>[^\s/]+)/call\s+"
                        r"(?P<unit2>[^\s/]+)/call\s+name|time\s+seconds\s+seconds\s+"
                        r"(?:calls\s+)?name")
# GNU: "index % time    self  children    called     name"; BSD-derived gprofs (macOS,
# AIX): "index  %time    self descendents  called+self    name    index"
_CG_COLS = re.compile(r"index\s+%\s*(?P<time>time\s+)?self\s+(?:children|descendents)\s+"
                      r"called(?:\+self)?\s+name(?:\s+index)?")
# a gprof that counts cycles, not seconds (an embedded target's, Xtensa): "%  cycles  cycles
# calls  /call  /call  name" over a line of multipliers "(K)  (K) ..." (thousands); its
# call graph header has no "time" ("index  %  self  children  called  name") and the same
# multiplier line under it
_FLAT_CYCLES = re.compile(r"%\s+cycles\s+cycles\s+(?:calls\s+/call\s+/call\s+)?name")
_MULTIPLIER = {"()": 1.0, "(K)": 1e3, "(M)": 1e6, "(G)": 1e9}
# gprof prints the leading "[N]" in a 6-character field, so from index 10000 on the
# closing bracket is cut ("[13794   0.0 ...") and from 100000 on a digit too; the
# trailing "[N]" is always whole, so it is the index and the leading one only a prefix.
_CG_LEAD = re.compile(r"\[(?P<lead>\d{1,19})\]?")
_CYCLE_SUFFIX = re.compile(r"<cycle (?P<cycle>\d{1,9})>")
_CYCLE_WHOLE = re.compile(r"<cycle (?P<cycle>\d{1,9}) as a whole>")
_SAMPLE = re.compile(r"Each sample counts as (?P<s>\d{1,15}(?:\.\d{1,15})?) (?P<unit>\S+)")
_UNIT_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "Ks": 1e3, "Ts": math.nan}
_FORM_FEED = "\f"

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
    #: "seconds", or "cycles" for a gprof that counts cycles (its time columns are then
    #: ``self_cycles``, ``cumulative_cycles``, ... instead of ``self_seconds``, ...)
    time_unit: str = "seconds"

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
    u = "cycles" if "self_cycles" in flat else "seconds"
    df = pd.DataFrame({
        "name": flat["function"], "calls": flat["calls"],
        f"self_{u}": flat[f"self_{u}"], f"cumulative_{u}": flat[f"cumulative_{u}"],
        "percent_time": flat["percent_time"],
    })
    return df.to_csv(index=False, lineterminator="\n")


def _split_cycle(name: str) -> tuple[str, int | None]:
    """``ping <cycle 1>`` -> ``("ping", 1)``; ``leaf`` -> ``("leaf", None)``."""
    if name.endswith(">"):
        i = name.rfind(" <cycle ")
        if i > 0:
            m = _CYCLE_SUFFIX.fullmatch(name, i + 1)
            if m:
                return name[:i].rstrip(), int(m["cycle"])
    return name, None


def _unit(u: str | None, where: object, lineno: int) -> float:
    if u is None:
        return math.nan
    try:
        return _UNIT_S[u]
    except KeyError:
        raise parse_error(where, lineno, f"unknown per-call unit {u!r}/call (expected one of "
                          f"{', '.join(_UNIT_S)})") from None


def _token(s: str, pos: int) -> tuple[str, int] | None:
    """The next whitespace-separated token of *s* from *pos* and where it ends (linear)."""
    m = _TOKEN.match(s, pos)
    return (m.group(1), m.end()) if m else None


def _name_problem(name: str) -> str | None:
    """Why *name* cannot be a function name, or None.

    gprof prints C and C++ names: they never start with a digit, never hold a tab and
    never hold a bare number column; a name that does is two lines run together or a
    garbled number ("40   250.38   25O.38  fib"), and is rejected rather than invented.
    """
    if not name:
        return "no function name"
    base, _ = _split_cycle(name)
    if _CYCLE_WHOLE.fullmatch(name):
        return None
    if "\t" in name:
        return "a tab inside the function name"
    if base[:1].isdigit():
        return "the name starts with a digit (a garbled number column?)"
    if any(_FLOAT_TOK.fullmatch(t) for t in base.split()):
        return "a number column inside the function name (two lines run together?)"
    return None


def _flat_row(text: str) -> tuple[float, float, float, int | None, float, float, str] | str:
    """A flat profile row's fields, or (a str) why the line is not one."""
    nums: list[str] = []
    pos = 0
    for _ in range(3):
        t = _token(text, pos)
        if t is None or not _FLOAT_TOK.fullmatch(t[0]):
            return "not a row"
        nums.append(t[0])
        pos = t[1]
    rest_at = pos
    more: list[str] = []
    for _ in range(3):
        t = _token(text, pos)
        if t is None:
            break
        more.append(t[0])
        pos = t[1]
    name = text[pos:].strip()
    if (len(more) == 3 and name and _INT_TOK.fullmatch(more[0]) and _FLOAT_TOK.fullmatch(more[1])
            and _FLOAT_TOK.fullmatch(more[2])):
        calls: int | None = int(more[0])
        spc, tpc = float(more[1]), float(more[2])
    else:
        calls, spc, tpc = None, math.nan, math.nan
        name = text[rest_at:].strip()
    name = _drop_bsd_index(name)
    why = _name_problem(name)
    if why:
        return why
    return float(nums[0]), float(nums[1]), float(nums[2]), calls, spc, tpc, name


def _drop_bsd_index(name: str) -> str:
    """BSD-derived gprofs (macOS, AIX) end a flat profile name with its call graph index,
    ``.fft [3]``, or ``_moncount (5191)`` where it would be; GNU prints the bare name."""
    if name[-1:] not in ("]", ")"):
        return name
    head, sep, tail = name.rpartition(" ")
    if sep and head and len(tail) > 2 and tail[0] + tail[-1] in ("[]", "()") \
            and tail[1:-1].isdigit():
        return head.rstrip()
    return name


def _cg_tail(text: str) -> tuple[str, str] | None:
    """``(body, index)`` of a call graph line ending in ``name [N]``, else None."""
    t = text.rstrip()
    if not t.endswith("]"):
        return None
    i = t.rfind("[")
    if i < 1 or not t[i - 1].isspace() or not _INT_TOK.fullmatch(t, i + 1, len(t) - 1):
        return None
    return t[:i], t[i + 1:-1]


def _cg_primary(text: str) -> dict | str:
    """Fields of a primary line ``[N] %time self children [called[+rec]] name [N]``."""
    tail = _cg_tail(text)
    lead = _CG_LEAD.match(text)
    if tail is None or lead is None:
        return "expected '[N] %time self children called name [N]'"
    body, index = tail
    if not index.startswith(lead["lead"]):
        return f"leading index [{lead['lead']}] does not match trailing index [{index}]"
    pos = lead.end()
    nums: list[str] = []
    for _ in range(3):
        t = _token(body, pos)
        if t is None or not _FLOAT_TOK.fullmatch(t[0]):
            return "expected '%time self children' after the index"
        nums.append(t[0])
        pos = t[1]
    called = recursive = None
    t = _token(body, pos)
    if t is not None:
        m = _CALLED_TOK.fullmatch(t[0])
        if m and body[t[1]:].strip():
            called, recursive = m["called"], m["recursive"]
            pos = t[1]
    name = body[pos:].strip()
    why = _name_problem(name)
    if why:
        return why
    return {"pct": float(nums[0]), "self": float(nums[1]), "children": float(nums[2]),
            "called": int(called) if called else None,
            "recursive": int(recursive) if recursive else None, "name": name,
            "index": int(index)}


def _cg_line(text: str) -> dict | str:
    """Fields of a parent/child line ``[self children] [called[/total]] name [N]``."""
    tail = _cg_tail(text)
    if tail is None or not text[:1].isspace():
        return "expected '[self children] called[/total] name [index]'"
    body, index = tail
    pos = 0
    self_s = children = None
    t = _token(body, pos)
    if t is not None and "." in t[0] and _FLOAT_TOK.fullmatch(t[0]):
        t2 = _token(body, t[1])
        if t2 is None or not ("." in t2[0] and _FLOAT_TOK.fullmatch(t2[0])):
            return "expected 'self children' seconds"
        self_s, children = t[0], t2[0]
        pos = t2[1]
    called = total = None
    t = _token(body, pos)
    if t is not None:
        m = _CALLED_TOTAL_TOK.fullmatch(t[0])
        if m and body[t[1]:].strip():
            called, total = m["called"], m["total"]
            pos = t[1]
    name = body[pos:].strip()
    why = _name_problem(name)
    if why:
        return why
    return {"self": float(self_s) if self_s else math.nan,
            "children": float(children) if children else math.nan,
            "called": int(called) if called else None, "total": int(total) if total else None,
            "name": name, "index": int(index)}


def _is_dashes(text: str) -> bool:
    t = text.rstrip()
    return len(t) >= 20 and t.count("-") == len(t)


def _is_form_feed(text: str) -> bool:
    return _FORM_FEED in text and not text.strip()


def _cg_end(text: str) -> bool:
    """A line that legitimately ends the call graph (gprof's own text after it)."""
    return (_is_form_feed(text) or text.startswith("Index by function name")
            or text.startswith(" This table describes the call tree"))


def parse_gprof(source: Source, *, run_id: str = "", build: str = "",
                module: str = "", strict: bool = True) -> GprofProfile:
    """Parse a gprof text report (path, file object or lines); see the module docstring.

    *module* (e.g. ``postgres``) fills the ``module`` column: gprof profiles one binary.
    ``strict``: gprof always ends a flat profile with its explanation or a form feed, and
    a call graph with a form feed, its explanation or the "Index by function name"
    section, so a report that stops without them is a truncated one and raises; pass
    ``strict=False`` for hand-trimmed excerpts and for ``gprof -b -p`` output (a brief
    flat profile ends with its last row, which a cut report cannot be told from).
    """
    where = describe(source)
    flat: list[dict] = []
    flat_order: dict[str, int] = {}
    primaries: dict[int, dict] = {}
    edges: list[dict] = []
    sample_s: float | None = None
    has_flat = has_cg = False
    time_unit = "seconds"
    flat_mult = cg_mult = 1.0  # cycles per printed unit of a cycles report ("(K)": 1000)
    want_mult = False        # a cycles header was the last line: its multipliers may follow
    cg_closed = False        # the call graph was ended by what gprof writes after it
    state = "scan"           # scan | flat | cg | cg_entry
    flat_gap = False         # a blank line since the last flat row
    per_call = math.nan
    entry_lines: list[tuple[int, str]] = []
    lineno = 0
    line = "\n"
    nonblank = 0
    for lineno, line in open_text(source):
        text = line.rstrip("\r\n")
        blank = not text.strip()
        if not blank:
            nonblank += 1
        if want_mult and not blank:
            want_mult = False
            m = _multiplier(text)
            if m is not None:
                if state == "flat":
                    flat_mult = per_call = m
                else:
                    cg_mult = m
                continue
        if state == "flat":
            if _is_form_feed(text):
                state = "scan"
                continue
            if blank:
                flat_gap = True
                continue
            row = _flat_row(text)
            if isinstance(row, tuple):
                pct, cum, self_s, calls, spc, tpc, name = row
                name, _cyc = _split_cycle(name)
                flat_order.setdefault(name, len(flat))
                flat.append({
                    "function": name, "calls": calls, "self_seconds": self_s,
                    "cumulative_seconds": cum, "percent_time": pct,
                    # rounded so that 250.38 us/call is 0.00025038, not ...97e-04
                    "self_s_per_call": round(spc * per_call, 12) if calls is not None
                    else math.nan,
                    "total_s_per_call": round(tpc * per_call, 12) if calls is not None
                    else math.nan,
                })
                continue
            stripped = text.strip()
            if flat_gap and (stripped.startswith("%") or _CG_COLS.match(stripped)
                             or stripped.startswith("Call graph")):
                state = "scan"  # gprof's explanation (or the call graph) follows
            else:
                why = "" if row == "not a row" else f" ({row})"
                raise parse_error(where, lineno, f"expected a flat profile row '%time "
                                  f"cumulative self [calls self/call total/call] name'"
                                  f"{why}, got {stripped[:120]!r}")
        elif state in ("cg", "cg_entry"):
            if _is_dashes(text):
                if state == "cg_entry":
                    _entry(entry_lines, primaries, edges, where)
                entry_lines = []
                state = "cg"
                continue
            if _is_form_feed(text) or blank:
                if state == "cg" and _is_form_feed(text):
                    state = "scan"
                    cg_closed = True
                elif state == "cg_entry" and not blank:
                    raise parse_error(where, lineno, "form feed inside a call graph entry "
                                      "(expected its lines, then a '-----' separator)")
                continue  # blank lines separate nothing in a call graph: skip them
            if state == "cg" and _cg_end(text):
                state = "scan"
                cg_closed = True
            elif state == "cg" and text.split() == ["called/total", "children"]:
                continue  # the BSD header's third line
            else:
                if state == "cg" and not (text.startswith("[") or text[:1].isspace()):
                    raise parse_error(where, lineno, f"expected a call graph entry line or "
                                      f"the end of the call graph, got {text.strip()[:120]!r}")
                state = "cg_entry"
                entry_lines.append((lineno, text))
                continue
        if state != "scan":
            continue
        # scanning between sections
        if "Each sample counts as" in text:
            m = _SAMPLE.search(text)
            if m:
                sample_s = float(m["s"]) * _UNIT_S.get(m["unit"].rstrip("."), 1.0)
                continue
        stripped = text.strip()
        if stripped.startswith("time"):
            m = _FLAT_COLS.fullmatch(stripped)
            if m:
                has_flat = True
                per_call = _unit(m.group("unit"), where, lineno) if m.group("unit") else math.nan
                state = "flat"
                flat_gap = False
                continue
        if stripped.startswith("%") and _FLAT_CYCLES.fullmatch(stripped):
            has_flat = True
            time_unit = "cycles"
            per_call = 1.0
            state = "flat"
            flat_gap = False
            want_mult = True
            continue
        if text.startswith("Index by function name"):
            cg_closed = True
            continue
        if stripped.startswith("index"):
            m = _CG_COLS.fullmatch(stripped)
            if m:
                has_cg = True
                state = "cg"
                entry_lines = []
                if m["time"] is None:
                    time_unit = "cycles"
                    want_mult = True
                continue
    if state == "cg_entry":
        raise parse_error(where, None, f"the gprof report is truncated: the call graph entry "
                          f"starting at line {entry_lines[0][0]} has no closing '-----' "
                          f"separator (file ends at line {lineno}). Regenerate it with "
                          f"`gprof BINARY gmon.out > report.txt`.")
    if lineno and not line.endswith("\n") and not (cg_closed and state == "scan"):
        # cut short; but a report whose last line, after its call graph (in the index,
        # gprof's last section, or the call graph's explanation), lost its newline, as a
        # pasted one may, is whole
        raise parse_error(where, lineno, "the gprof report is truncated: the line ends without "
                          "a newline. Regenerate it with `gprof BINARY gmon.out > report.txt`.")
    if nonblank and not (has_flat or has_cg):
        raise parse_error(where, None, "not a gprof report: no flat profile header (' time   "
                          "seconds   seconds    calls ...  name') and no call graph header "
                          "('index % time    self  children    called     name') found. Pass "
                          "the text output of `gprof BINARY gmon.out`, not gmon.out itself.")
    if strict and state == "flat":
        raise parse_error(where, lineno, "the gprof report may be truncated: the flat profile "
                          "ends at the end of the file, without gprof's explanation or a form "
                          "feed after it, so rows may be missing. Regenerate it with `gprof "
                          "BINARY gmon.out > report.txt`; for `gprof -b -p` output or a trimmed "
                          "excerpt pass --no-strict (strict=False).")
    if strict and has_cg and not cg_closed:
        # a call graph cut after an entry's '-----' separator looks whole; what gprof
        # writes after the call graph (the form feed that ends its section, its
        # explanation, the index) says it is
        raise parse_error(where, None, f"the gprof report is truncated: the call graph is not "
                          f"followed by a form feed or 'Index by function name' (file ends "
                          f"at line {lineno}). "
                          f"Regenerate it with `gprof BINARY gmon.out > report.txt`, or pass "
                          f"--no-strict (strict=False) for a trimmed excerpt.")
    # a cycles report prints thousands ("(K)"): its figures become cycles, once, here
    _scale(flat, ("self_seconds", "cumulative_seconds"), flat_mult)
    _scale(primaries.values(), ("self", "children"), cg_mult)
    _scale(edges, ("self_seconds", "children_seconds"), cg_mult)
    functions = _functions_table(flat, flat_order, primaries, run_id=run_id, build=build,
                                 module=module, time_unit=time_unit)
    call_edges = _edges_table(edges, run_id=run_id, build=build, time_unit=time_unit)
    return GprofProfile(functions=functions, call_edges=call_edges, sample_seconds=sample_s,
                        has_flat=has_flat, has_call_graph=has_cg, time_unit=time_unit)


def _scale(rows: Iterable[dict], keys: tuple[str, str], mult: float) -> None:
    if mult != 1.0:
        for r in rows:
            for k in keys:
                r[k] = round(r[k] * mult, 6)


def _multiplier(text: str) -> float | None:
    """The multiplier of a cycles report's unit line ("(K)   (K)" -> 1000), else None."""
    toks = text.split()
    if toks and all(t in _MULTIPLIER for t in toks) and len(set(toks)) == 1:
        return _MULTIPLIER[toks[0]]
    return None


def _entry(entry: list[tuple[int, str]], primaries: dict[int, dict], edges: list[dict],
           where: str) -> None:
    """One call graph entry: parents, the primary ``[N]`` line, children."""
    prim_at = next((i for i, (_, t) in enumerate(entry) if t.startswith("[")), None)
    if prim_at is None:
        raise parse_error(where, entry[0][0], "call graph entry without its '[index] %time "
                          "self children called name [index]' line")
    pl, pt = entry[prim_at]
    pm = _cg_primary(pt)
    if isinstance(pm, str):
        raise parse_error(where, pl, f"expected a call graph primary line '[N] %time self "
                          f"children called name [N]' ({pm}), got {pt.strip()[:120]!r}")
    whole = _CYCLE_WHOLE.fullmatch(pm["name"])
    name, cycle = _split_cycle(pm["name"])
    index = pm["index"]
    if whole is None:
        if index in primaries:
            raise parse_error(where, pl, f"call graph index [{index}] appears twice")
        primaries[index] = {
            "function": name, "index": index, "cycle": cycle,
            "self": pm["self"], "children": pm["children"], "cg_percent": pm["pct"],
            "called": pm["called"], "recursive": pm["recursive"],
        }
    for pos, (ln, t) in enumerate(entry):
        if pos == prim_at:
            continue
        if t.strip() == SPONTANEOUS:
            if pos > prim_at:
                raise parse_error(where, ln, "<spontaneous> below the primary line (only "
                                  "callers can be spontaneous)")
            if whole is None:
                edges.append({"caller": SPONTANEOUS, "callee": name, "calls": None,
                              "total_calls": None, "self_seconds": math.nan,
                              "children_seconds": math.nan, "callee_index": index,
                              "caller_index": None})
            continue
        m = _cg_line(t)
        if isinstance(m, str):
            raise parse_error(where, ln, f"expected a call graph line '[self children] "
                              f"called[/total] name [index]' ({m}), got {t.strip()[:120]!r}")
        if whole is not None:
            continue  # a cycle-as-a-whole's callers and members are not call edges
        if pos < prim_at:
            continue  # callers: the same edges appear as children of their own entries
        other, _ = _split_cycle(m["name"])
        edges.append({
            "caller": name, "callee": other, "calls": m["called"], "total_calls": m["total"],
            "self_seconds": m["self"], "children_seconds": m["children"],
            "caller_index": index, "callee_index": m["index"],
        })


def _functions_table(flat: list[dict], flat_order: dict[str, int], primaries: dict[int, dict],
                     *, run_id: str, build: str, module: str,
                     time_unit: str = "seconds") -> pd.DataFrame:
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
    df["unit"] = time_unit
    if time_unit == "cycles":  # the columns say what their numbers are
        df = df.rename(columns=_CYCLE_COLUMNS)
    schema = list(tables.SCHEMAS["functions"])
    df = df[schema + [c for c in df.columns if c not in schema]]
    return tables.validate(df, "functions")


def _edges_table(edges: list[dict], *, run_id: str, build: str,
                 time_unit: str = "seconds") -> pd.DataFrame:
    cols = ["caller", "callee", "calls", "total_calls", "self_seconds", "children_seconds",
            "caller_index", "callee_index"]
    df = pd.DataFrame(edges, columns=cols)
    df.insert(0, "run_id", run_id)
    df.insert(1, "build", build)
    for c in ("calls", "total_calls", "caller_index", "callee_index"):
        df[c] = pd.array(df[c].tolist(), dtype="Int64")
    for c in ("self_seconds", "children_seconds"):
        df[c] = df[c].astype("float64")
    if time_unit == "cycles":
        df = df.rename(columns=_CYCLE_COLUMNS)
    return tables.validate(df, "call_edges")


_CYCLE_COLUMNS = {"self_seconds": "self_cycles", "cumulative_seconds": "cumulative_cycles",
                  "self_s_per_call": "self_cycles_per_call",
                  "total_s_per_call": "total_cycles_per_call",
                  "children_seconds": "children_cycles"}


def read_gprof(path: str | os.PathLike[str], **kwargs: str) -> GprofProfile:
    """Parse the gprof report at *path* (same as :func:`parse_gprof`)."""
    return parse_gprof(path, **kwargs)
