"""Parse callgrind's profile data file into the ``functions`` table.

Producer: ``valgrind --tool=callgrind --callgrind-out-file=FILE [--toggle-collect=FN] PROG``
(format: valgrind's docs/callgrind-format, "Callgrind Format Specification"); also read:
``valgrind --tool=cachegrind`` files (no calls, no ``totals:``) and other producers'.

Example (two lines of input, one row of output)::

    fn=(3) ExecNestLoop
    1120 4000200021
    ->  function="ExecNestLoop", module="postgres", calls=<sum of calls= into it>,
        self=4000200021 (instructions), total=<inclusive>, self_share=self/totals

What is read:

- ``events:`` names the cost columns; the chosen event (``Ir`` = instructions executed)
  is summed. ``totals:`` (end of each part) gives the whole profile's cost;
  ``summary:`` (header) is the same number, kept for cross-checking.
- ``fn=`` opens a function's block; the cost lines that follow are its *self* cost.
  A cost line right after ``calls=N ...`` is the *inclusive* cost of that call arc
  and is not self cost.
- Name compression: ``(id) name`` defines an id, a later ``(id)`` reuses it; fn/cfn/jfn,
  ob/cob and fl/fi/fe/cfi/cfl/jfi keep separate tables, as the specification says. An
  object or file id used before it is defined (seen in files from other machines: an old
  callgrind's ``cob=(8)`` that no line names) reads as ``???``, callgrind's own name for an
  unknown object: costs and function names do not depend on it. A function id used before
  it is defined is an error (the file was cut at the start).
- ``--collect-jumps=yes`` output: ``jump=``/``jcnd=`` lines and the position line after
  each carry no cost; ``jfi=``/``jfn=`` name the target's file and function (read only to
  keep the name tables right).
- The event: ``Ir`` (instructions) when the file has it, else the first of ``events:``
  (an Xdebug or sampling profile: ``Time``, ``Ticks``); ``event=`` chooses another.
  ``unit`` is ``instructions`` for ``Ir``, else the event's name.
- Recursion: callgrind names the 2nd and deeper nested activations of a function
  ``name'2`` (``--separate-recs``, default 2). They are merged into ``name``.
- Caller contexts (``--separate-callers=N``): callgrind names a function once per chain of
  its last N callers, ``name'caller`` (``fib'2'work``: a nested fib in work's context).
  They are merged into ``name`` too, so the tables are the same as without the option;
  the call arcs keep who called whom. A suffix counts as a caller only when it names a
  function of the same profile: a name that holds a quote of its own stays whole.
- Call arcs (``cfn=`` + ``calls=``): the ``call_edges`` table, calls summed per caller and
  callee (recursion levels merged the same way), what ``callgrind_annotate --tree=caller``
  prints as ``(Nx)``. An arc with ``calls=0`` (a call already in progress when collection
  started: the callers of the ``--toggle-collect`` function) is not an edge.

Inclusive cost (``total``): the sum of the inclusive costs of call arcs into the
function's outermost activation (the un-suffixed name, which callgrind only uses when
no other activation of it is on the stack), so nested activations are not counted twice
— the usual pitfall of summing self + callees for recursive executor functions
(ExecProcNodeInstr -> ExecNestLoop -> ExecProcNodeInstr). A function with no recorded
incoming arc (the ``--toggle-collect`` root, ``main``) gets self + arcs to other
functions. ``calls`` counts every call into it, nested ones included (as gprof does).
"""
from __future__ import annotations

import glob
import itertools
import math
import os
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pandas as pd

from profkit import tables
from profkit.errors import ParseError
from profkit.parse._io import open_text

TOOL = "callgrind"
UNIT = "instructions"

_REC_SUFFIX = re.compile(r"'\d+$")
# C++ operators whose names hold brackets (masked when finding where a name ends)
_OPERATOR = re.compile(r"operator\s*(?:<<=|>>=|<=>|<<|>>|<=|>=|->\*|->|<|>|\(\)|\[\])")
_NAME = re.compile(r"^\((\d+)\)(?:\s(.*))?$")
# spec: position lines start with a number, "+", "-", "*" or "0x"
_COST_START = frozenset("0123456789+-*")


@dataclass(frozen=True)
class CallgrindProfile:
    """One parsed callgrind output file (all its parts combined)."""

    events: tuple[str, ...]
    event: str  # the event the table's costs are in
    totals: int  # cost of the chosen event over the whole profile
    summary: int | None  # the header's summary: value, if present
    parts: int
    header: dict[str, str] = field(default_factory=dict)
    functions: pd.DataFrame = field(default_factory=lambda: tables.empty("functions"))
    #: one row per caller -> callee pair: ``calls`` (every ``calls=`` line of the pair,
    #: recursion levels merged as in ``functions``), ``caller_module``/``callee_module``
    call_edges: pd.DataFrame = field(default_factory=lambda: _edges_table([], "", "",
                                                                          _Activations([])))

    def inclusive(self, function: str) -> int:
        """Inclusive cost of *function* (see module doc); KeyError if absent."""
        rows = self.functions[self.functions["function"] == function]
        if rows.empty:
            raise KeyError(function)
        return int(rows["total"].sum())

    def self_cost(self, function: str) -> int:
        rows = self.functions[self.functions["function"] == function]
        return int(rows["self"].sum()) if not rows.empty else 0


class _Names:
    """A callgrind name-compression table."""

    def __init__(self, kind: str, *, unknown: str | None = None) -> None:
        self.kind = kind
        self.by_id: dict[str, str] = {}
        self.unknown = unknown  # the name of an id never defined; None: an error

    def resolve(self, value: str, lineno: int) -> str:
        m = _NAME.match(value)
        if not m:  # uncompressed name
            return value
        ident, name = m.group(1), m.group(2)
        if name is not None:
            self.by_id[ident] = name
            return name
        try:
            return self.by_id[ident]
        except KeyError:
            if self.unknown is not None:
                return self.unknown
            raise ParseError(
                f"callgrind output line {lineno}: {self.kind} id ({ident}) used before it was "
                "defined; the file is corrupt or was cut at the start"
            ) from None


def _int(tok: str, lineno: int) -> int:
    try:
        return int(tok, 16) if tok.startswith("0x") else int(tok)
    except ValueError:
        raise ParseError(f"callgrind output line {lineno}: {tok!r} is not a number") from None


def parse_callgrind(
    text: str,
    *,
    run_id: str = "",
    build: str = "",
    event: str | None = None,
    strict: bool = True,
) -> CallgrindProfile:
    """Parse callgrind output *text*; see the module docstring for the format.

    With *strict* (default) a file written by valgrind's callgrind without ``totals:``
    (valgrind killed while writing, disk full) raises :class:`ParseError`; with
    ``strict=False`` what was written is returned and ``totals`` is the sum of the self
    costs read. Another producer's file without ``totals:`` (the format makes it optional)
    gets that sum too. *event*: ``None`` reads ``Ir`` when the file has it, else its first.
    """
    return _parse(enumerate(text.splitlines(), 1), "<callgrind output>", run_id=run_id,
                  build=build, event=event, strict=strict)


def _parse(numbered: Iterable[tuple[int, str]], where: str, *, run_id: str = "",
           build: str = "", event: str | None = None, strict: bool = True) -> CallgrindProfile:
    it = iter(numbered)
    head = list(itertools.islice(it, 200))
    first = next((ln for _, ln in head if ln.strip()), None)
    if first is None and not any(True for _ in itertools.islice(it, 1)):
        raise ParseError(
            f"{where}: callgrind output is empty: valgrind did not write a profile (killed "
            "before the program exited?). Re-run the collection; the valgrind log says why "
            "it stopped."
        )
    if not (head and head[0][1].startswith("# callgrind format")) and not any(
        ln.startswith("events:") for _, ln in head
    ):
        raise ParseError(
            f"{where}: not a callgrind output file (no '# callgrind format' / 'events:' "
            "header): pass the file written by valgrind --tool=callgrind "
            "--callgrind-out-file=FILE"
        )
    lines = itertools.chain(head, it)
    try:
        return _body(lines, run_id=run_id, build=build, event=event, strict=strict)
    except ParseError as e:
        if str(e).startswith(where):
            raise
        raise ParseError(f"{where}: {e}") from None


def _body(lines: Iterable[tuple[int, str]], *, run_id: str, build: str, event: str | None,
          strict: bool) -> CallgrindProfile:
    fn_names = _Names("fn")
    ob_names, fl_names = _Names("ob", unknown="???"), _Names("file", unknown="???")
    header: dict[str, str] = {}
    events: tuple[str, ...] = ()
    ev_idx = -1
    npos = 1
    totals = 0
    saw_totals = False
    summary: int | None = None
    parts = 0

    cur_fn: tuple[str, str] | None = None  # (object, raw name)
    cur_ob = ""
    cfn: str | None = None
    cob: str | None = None
    pending_call: int | None = None  # calls count waiting for its cost line

    self_cost: dict[tuple[str, str], int] = defaultdict(int)
    # (caller object, caller raw name) -> list of (callee object, callee raw, calls, cost)
    arcs: list[tuple[tuple[str, str], tuple[str, str], int, int]] = []

    prev_cost: int | None = None  # the event's cost on the cost line before

    def costs_of(tokens: list[str], lineno: int) -> int:
        nonlocal prev_cost
        # Trailing zero costs may be omitted (spec); missing event column = 0.
        vals = tokens[npos:]
        tok = vals[ev_idx] if ev_idx < len(vals) else "0"
        if tok == "*" or tok[:1] in "+-":
            # valgrind compresses positions only (its format), but speedscope's sample
            # compresses costs the same way: '*' the cost line before's cost, '+N'/'-N'
            # that plus or minus N.  speedscope reads them so, and only so do that file's
            # costs add up (its self costs sum to main's inclusive cost)
            if prev_cost is None:
                raise ParseError(
                    f"callgrind output line {lineno}: event cost {tok!r} is relative to the "
                    "cost line before it, and there is none: was the file cut at its start?")
            cost = prev_cost if tok == "*" else prev_cost + _int(tok, lineno)
            if cost < 0:
                raise ParseError(
                    f"callgrind output line {lineno}: event cost {tok!r} takes the cost line "
                    f"before's {prev_cost} below 0: the file is corrupt")
        else:
            cost = _int(tok, lineno)
        prev_cost = cost
        return cost

    for lineno, raw in lines:
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        c0 = line[0]
        if c0 in _COST_START or line.startswith("0x"):
            if not events:
                raise ParseError(f"callgrind output line {lineno}: cost line before 'events:'")
            tokens = line.split()
            cost = costs_of(tokens, lineno)
            if pending_call is not None:
                if cur_fn is None or cfn is None:
                    raise ParseError(f"callgrind output line {lineno}: call cost outside a fn")
                arcs.append((cur_fn, (cob if cob is not None else cur_ob, cfn),
                             pending_call, cost))
                pending_call = None
                cob = None
            else:
                if cur_fn is None:
                    raise ParseError(
                        f"callgrind output line {lineno}: cost line before any 'fn=' line"
                    )
                self_cost[cur_fn] += cost
            continue
        key, sep, value = line.partition("=")
        if sep and key in ("fn", "cfn", "ob", "cob", "fl", "fi", "fe", "cfi", "cfl", "calls",
                           "jump", "jcnd", "jfi", "jfn"):
            if key == "fn":
                cur_fn = (cur_ob, fn_names.resolve(value, lineno))
                self_cost.setdefault(cur_fn, 0)
            elif key == "cfn":
                cfn = fn_names.resolve(value, lineno)
            elif key == "jfn":
                fn_names.resolve(value, lineno)  # a jump target: only the table
            elif key == "ob":
                cur_ob = ob_names.resolve(value, lineno)
            elif key == "cob":
                cob = ob_names.resolve(value, lineno)
            elif key in ("fl", "fi", "fe", "cfi", "cfl", "jfi"):
                fl_names.resolve(value, lineno)  # keep the table consistent
            elif key == "calls":
                parts_ = value.split()
                if not parts_:
                    raise ParseError(f"callgrind output line {lineno}: 'calls=' without count")
                pending_call = _int(parts_[0], lineno)
            # jump=/jcnd= (--collect-jumps) carry no cost of their own here
            continue
        hkey, hsep, hval = line.partition(":")
        if hsep:
            hkey, hval = hkey.strip(), hval.strip()
            if hkey == "events":
                events = tuple(hval.split())
                if event is None and events:
                    event = "Ir" if "Ir" in events else events[0]
                if event not in events:
                    raise ParseError(
                        f"callgrind output has events {list(events)}, not {event!r}: "
                        "choose one of those"
                    )
                ev_idx = events.index(event)
            elif hkey == "positions":
                npos = len(hval.split()) or 1
            elif hkey == "summary":
                if ev_idx >= 0:
                    toks = hval.split()
                    summary = (summary or 0) + (_int(toks[ev_idx], lineno)
                                                if ev_idx < len(toks) else 0)
            elif hkey == "totals":
                toks = hval.split()
                totals += _int(toks[ev_idx], lineno) if 0 <= ev_idx < len(toks) else 0
                saw_totals = True
            elif hkey == "part":
                parts += 1
                cur_fn, cfn, cob, pending_call = None, None, None, None
            elif hkey not in header:
                header[hkey] = hval
            continue
        raise ParseError(f"callgrind output line {lineno}: cannot parse {line[:80]!r}")

    if not events:
        raise ParseError("callgrind output has no 'events:' line: the file was cut in its header")
    self_sum = sum(self_cost.values())
    # ``totals:`` is optional in the format: valgrind's callgrind always ends a complete file
    # with it, other producers (lsprofcalltree, pyprof2calltree, Xdebug) may not
    by_valgrind = header.get("creator", "").startswith("callgrind")
    if not saw_totals and (summary == self_sum or not by_valgrind):
        saw_totals, totals = True, self_sum
    if not saw_totals:
        if strict:
            raise ParseError(
                "callgrind output is truncated (no 'totals:' line at the end): valgrind was "
                "stopped while writing, or the disk is full. The file is kept; re-run the "
                "collection, or read what was written with --no-strict (strict=False)."
            )
        totals = self_sum
    elif strict and totals != self_sum:
        raise ParseError(
            f"callgrind output inconsistent: totals {totals} but function self costs sum to "
            f"{self_sum}; the file is corrupt"
        )
    assert event is not None  # set with events
    names = _Activations(itertools.chain((fn for _, fn in self_cost),
                                         (a[0][1] for a in arcs), (a[1][1] for a in arcs)))
    df = _functions_table(self_cost, arcs, totals, names, run_id=run_id, build=build,
                          unit=UNIT if event == "Ir" else event)
    return CallgrindProfile(
        events=events, event=event, totals=totals, summary=summary, parts=max(parts, 1),
        header=header, functions=df, call_edges=_edges_table(arcs, run_id, build, names),
    )


def _parts(name: str) -> tuple[str, str | None]:
    """*name* → (what comes before its first ``'`` outside brackets, the suffix up to the
    next one), or (*name*, None) when it has no such quote. Quotes inside brackets belong
    to the name (``<method 'read' of 'file' objects>``, ``foo<'a'>``); ``operator<`` and
    friends do not count as brackets."""
    masked = _OPERATOR.sub(lambda m: "o" * len(m.group(0)), name)
    cut = None
    depth = 0
    for i, ch in enumerate(masked):
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth = max(depth - 1, 0)
        elif ch == "'" and depth == 0 and i > 0:
            if cut is not None:
                return name[:cut], name[cut + 1:i]
            cut = i
    if cut is not None:
        return name[:cut], name[cut + 1:]
    m = _REC_SUFFIX.search(name)  # unbalanced brackets: the recursion suffix still counts
    return (name[:m.start()], name[m.start() + 1:]) if m else (name, None)


class _Activations:
    """How a profile's function names resolve to functions.

    callgrind appends ``'N`` to the Nth nested activation of a function
    (``--separate-recs``) and ``'caller`` for each caller of a context
    (``--separate-callers=N``), recursion level first: ``fib'2'work`` is a nested fib
    called in work's context. A suffix is taken as a caller only when it names a function
    of the same profile, so a name that merely holds a quote (an OCaml ``x'``) stays whole.
    """

    def __init__(self, names: Iterable[str]) -> None:
        parts = {n: _parts(n) for n in set(names)}
        known = {base for base, _ in parts.values()}
        self._resolved: dict[str, tuple[str, bool]] = {}
        for n, (base, first) in parts.items():
            if first is None:
                self._resolved[n] = (n, False)
            elif first.isdigit():
                self._resolved[n] = (base, True)
            elif first in known:
                self._resolved[n] = (base, False)
            else:  # the quote is the name's own; a recursion suffix may still follow it
                m = _REC_SUFFIX.search(n)
                self._resolved[n] = (n[:m.start()], True) if m else (n, False)

    def function(self, name: str) -> str:
        return self._resolved[name][0]

    def nested(self, name: str) -> bool:
        return self._resolved[name][1]


def _functions_table(
    self_cost: dict[tuple[str, str], int],
    arcs: list[tuple[tuple[str, str], tuple[str, str], int, int]],
    totals: int,
    names: _Activations,
    *,
    run_id: str,
    build: str,
    unit: str = UNIT,
) -> pd.DataFrame:
    def key(ob: str, fn: str) -> tuple[str, str]:
        return (os.path.basename(ob), names.function(fn))

    selfs: dict[tuple[str, str], int] = defaultdict(int)
    for (ob, fn), c in self_cost.items():
        selfs[key(ob, fn)] += c
    calls: dict[tuple[str, str], int] = defaultdict(int)
    incoming_outer: dict[tuple[str, str], int] = defaultdict(int)
    outgoing_other: dict[tuple[str, str], int] = defaultdict(int)
    has_outer_arc: set[tuple[str, str]] = set()
    for (cob_, cfn_), (tob, tfn), n, cost in arcs:
        callee = key(tob, tfn)
        caller = key(cob_, cfn_)
        selfs.setdefault(callee, 0)
        calls[callee] += n
        if not names.nested(tfn):  # outermost activation of the callee (in any context)
            incoming_outer[callee] += cost
            has_outer_arc.add(callee)
        if callee != caller:
            outgoing_other[caller] += cost

    rows = []
    for k, s in selfs.items():
        total = incoming_outer[k] if k in has_outer_arc else s + outgoing_other[k]
        rows.append({
            "run_id": run_id, "build": build, "tool": TOOL, "function": k[1], "module": k[0],
            "calls": calls.get(k, pd.NA), "self": float(s), "total": float(total),
            "self_share": (s / totals) if totals else math.nan, "unit": unit,
        })
    if not rows:
        df = tables.empty("functions")
        df["unit"] = pd.Series(dtype="string")
        return df
    df = pd.DataFrame(rows).sort_values(["self", "function"], ascending=[False, True])
    df = df.reset_index(drop=True)
    return tables.validate(df, "functions")


def _edges_table(arcs: list[tuple[tuple[str, str], tuple[str, str], int, int]],
                 run_id: str, build: str, names: _Activations) -> pd.DataFrame:
    """The ``call_edges`` table: calls summed per (caller, callee), each keyed like the
    functions table (object's base name, recursion suffix merged: ``fib'2 -> fib'3`` and
    ``fib -> fib'2`` are both ``fib -> fib``, as gprof counts recursive calls)."""
    calls: dict[tuple[str, str, str, str], int] = defaultdict(int)
    for (cob_, cfn_), (tob, tfn), n, _cost in arcs:
        if n == 0:  # a call in progress when collection started (the toggle's callers)
            continue
        calls[(os.path.basename(cob_), names.function(cfn_), os.path.basename(tob),
               names.function(tfn))] += n
    df = pd.DataFrame(
        [{"run_id": run_id, "build": build, "caller": c, "callee": t, "calls": n,
          "caller_module": cm, "callee_module": tm}
         for (cm, c, tm, t), n in calls.items()],
        columns=["run_id", "build", "caller", "callee", "calls", "caller_module",
                 "callee_module"])
    df = df.sort_values(["calls", "caller", "callee"], ascending=[False, True, True],
                        kind="stable").reset_index(drop=True)
    df[["caller_module", "callee_module"]] = df[["caller_module", "callee_module"]].astype(
        "string")
    return tables.validate(df, "call_edges")


def parse_callgrind_file(path: str | Path | BinaryIO, **kwargs: object) -> CallgrindProfile:
    """:func:`parse_callgrind` on a file; gzip-compressed files (``*.gz``) are read too.
    *path* may also be an open binary stream (``sys.stdin.buffer``), read as it comes.

    The file streams through :func:`profkit.parse._io.open_text`: a directory, an
    unreadable file, a broken gzip stream or an endless line is one :class:`ParseError`.
    callgrind writes ASCII; bytes that are not UTF-8 (odd symbol names) are read as
    Latin-1, so distinct names stay distinct.
    """
    if hasattr(path, "read"):
        lines = ((n, ln.rstrip("\r\n")) for n, ln in open_text(path))
        return _parse(lines, "<stdin>", **kwargs)  # type: ignore[arg-type]
    p = Path(path)
    if not p.exists():
        raise ParseError(
            f"callgrind output {p} does not exist: did valgrind run, and could its user write "
            "to that directory?"
        )
    # --separate-threads=yes: callgrind leaves the file it was given empty and writes
    # one profile per thread, FILE-01 (the main thread), FILE-02, ...
    threads = (sorted(p.parent.glob(glob.escape(p.name) + "-[0-9][0-9]*"))
               if p.is_file() and p.stat().st_size == 0 else [])
    if threads:
        raise ParseError(
            f"{p} is empty, and {len(threads)} files beside it ({threads[0].name} ... "
            f"{threads[-1].name}) are callgrind's profiles of one thread each "
            "(--separate-threads=yes): read each of those, or record again without "
            "--separate-threads for one profile of the whole process")
    lines = ((n, ln.rstrip("\r\n")) for n, ln in open_text(p))
    return _parse(lines, str(p), **kwargs)  # type: ignore[arg-type]


#: function whose inclusive cost is the executor-only count (all modes call it once)
EXECUTOR_FUNCTION = "standard_ExecutorRun"


def instr_counts_from_session(
    session: object,
    *,
    run_id: str = "",
    build: str = "",
    workload: str = "",
) -> pd.DataFrame:
    """The ``instr_counts`` table of a callgrind session (one row per measured query).

    *session* is a :class:`profkit.collect.callgrind.CallgrindSession`, or the directory /
    ``callgrind-session.json`` it wrote (so a notebook can start again from profiles/).
    ``instructions`` is the whole ``--toggle-collect`` scope (``scope`` column, normally
    exec_simple_query); extra columns: ``executor_instructions`` (inclusive cost of
    standard_ExecutorRun: executor only, no parse/plan/EXPLAIN output), ``seconds``
    (wall time under callgrind) and ``out_file``.

    Example: callgrind.analyze_notiming.out with ``totals: 2780988128`` ->
    ``mode=analyze_notiming, instructions=2780988128, tool=callgrind``.
    """
    import json

    if isinstance(session, (str, Path)):
        p = Path(session)
        if p.is_dir():
            p = p / "callgrind-session.json"
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise ParseError(f"no callgrind session file at {p}") from None
        toggle = data["toggle"]
        queries = [(q["mode"], q["sql"], q["out_file"], q["seconds"]) for q in data["queries"]]
    else:
        toggle = session.toggle  # type: ignore[attr-defined]
        queries = [(q.mode, q.sql, q.out_file, q.seconds)
                   for q in session.queries]  # type: ignore[attr-defined]
    rows = []
    for mode, sql, out_file, seconds in queries:
        prof = parse_callgrind_file(out_file, run_id=run_id, build=build)
        if prof.totals == 0:
            raise ParseError(
                f"callgrind counted 0 instructions for {mode!r} ({out_file}): the toggle "
                f"function {toggle!r} never ran; check the function name and the query"
            )
        try:
            executor = prof.inclusive(EXECUTOR_FUNCTION)
        except KeyError:
            executor = None
        rows.append({
            "run_id": run_id, "build": build, "workload": workload, "query": sql,
            "mode": mode, "instructions": prof.totals, "tool": TOOL, "scope": toggle,
            "executor_instructions": executor, "seconds": seconds, "out_file": str(out_file),
        })
    if not rows:
        return tables.empty("instr_counts")
    df = pd.DataFrame(rows)
    df["executor_instructions"] = df["executor_instructions"].astype("Int64")
    return tables.validate(df, "instr_counts")
