"""EXPLAIN's text format → the structure EXPLAIN (FORMAT JSON) returns.

What people paste is EXPLAIN's default output, often copied out of psql (its "QUERY PLAN"
header, the rule under it, "(12 rows)" at the end, a "+" where psql wrapped a cell) or
out of pgAdmin (each line in quotes).  :func:`parse_text_explain` reads such text into
``{"Plan": {...}, "Planning Time": ..., "Execution Time": ...}`` with the keys EXPLAIN's
JSON gives a node: ``Node Type`` (``Aggregate`` with its ``Strategy`` for HashAggregate,
``Hash Join`` with its ``Join Type`` for Hash Left Join, ``ModifyTable`` with its
``Operation`` for Insert on t...), ``Relation Name``, ``Alias``, ``Index Name``, costs,
``Plan Rows``, ``Actual Rows``/``Actual Loops`` (0 and 0 for "never executed"), actual
times, ``Parent Relationship`` and ``Subplan Name`` (InitPlan, SubPlan, CTE), ``Plans``.
A node's other lines (Filter, Buffers, Sort Method...) are left out, but ``Workers
Planned``, ``Workers Launched`` and (VERBOSE) ``Inner Unique``; without the last, a
nested loop's inner side may stop at its first match, and the predictions say that
their count there is not exact.  So :func:`profkit.parse.explain.flatten_plan`, the
predictions and the per-node analyses read a plan in either format.

Checked against what PostgreSQL itself prints in JSON for the same execution
(tests/test_explain_text.py) and against pev2's test plans (benchmarks/peer_inputs.py).
"""
from __future__ import annotations

import re
from typing import Any

from profkit.errors import ParseError

# Every pattern here is linear in the line's length (possessive quantifiers, each
# anchored at a literal): a pasted plan may hold a 60 kB line, or garbage.
_NUM = r"\d++(?:\.\d++)?+"
_COST_END = re.compile(rf"\(cost=({_NUM})\.\.({_NUM}) rows=(\d++) width=(\d++)\)$")
_ACTUAL_END = re.compile(rf"\((?:actual(?: time=({_NUM})\.\.({_NUM}))? rows=({_NUM}) "
                         rf"loops=(\d++)|(never executed))\)$")
_SUBPLAN = re.compile(r"^(?:(?:InitPlan|SubPlan)(?: \d++)?(?: \(returns .*\))?|CTE \S.*)$")
_FOOTER = re.compile(r"^\(\d++ \w++\)$")  # psql's "(12 rows)", "(5 lignes)"
_RULE = re.compile(r"[-\u2500+\u253c]{3,}")  # psql's rule under the title, ASCII or Unicode
_WRAP_MARK = re.compile(r"\s\+$")  # psql's mark of a cell that goes on on the next line
_NUMBERS = re.compile(r"\(cost=\d|\(actual (?:time|rows)=|\(never executed\)")
_TIME = re.compile(rf"^(Planning Time|Execution Time|Total runtime): ({_NUM}) ms$")
_JOIN = re.compile(r"^(Nested Loop|Hash|Merge)(?: (Left|Right|Full|Semi|Anti|Right Semi|"
                   r"Right Anti))?(?: Join)?$")
_AGG = {"Aggregate": "Plain", "HashAggregate": "Hashed", "GroupAggregate": "Sorted",
        "MixedAggregate": "Mixed"}
_MODIFY = ("Insert", "Update", "Delete", "Merge")
#: "<type> on <object> [alias]": the JSON key the object goes to
_ON = {"Seq Scan": "Relation Name", "Bitmap Heap Scan": "Relation Name",
       "Tid Scan": "Relation Name", "Tid Range Scan": "Relation Name",
       "Sample Scan": "Relation Name", "Foreign Scan": "Relation Name",
       "Bitmap Index Scan": "Index Name", "CTE Scan": "CTE Name",
       "Function Scan": "Function Name", "WorkTable Scan": "CTE Name",
       "Named Tuplestore Scan": "Tuplestore Name", "Table Function Scan": "Table Function Name",
       "Subquery Scan": None, "Values Scan": None}
#: one name as EXPLAIN prints it: quoted where it must be ("*VALUES*", "my table"),
#: schema-qualified under VERBOSE (public.t)
_PART = r'(?:"(?:[^"]|"")*+"|[^\s".]++)'
_NAME = rf"{_PART}(?:\.{_PART})*"
_NAMES = re.compile(_NAME)
_SCAN_USING = re.compile(rf"^(Index Scan|Index Only Scan)( Backward)? using ({_NAME}) on (.+)$")
_MAX_DEPTH = 400  # as profkit.parse.explain.MAX_PLAN_DEPTH
#: the relationship every child of these has (else Outer, then Inner)
_MEMBERS = {"Append": "Member", "Merge Append": "Member", "BitmapAnd": "Member",
            "BitmapOr": "Member", "Subquery Scan": "Subquery"}


def looks_like_text_explain(text: str) -> bool:
    """Whether *text* holds an EXPLAIN node line in the text format."""
    return bool(_NUMBERS.search(text) or re.search(r"^[ \t]*+->\s", text, re.M))


def parse_text_explain(text: str) -> dict[str, Any]:
    """EXPLAIN's text output → ``{"Plan": {...}, "Planning Time": ms, "Execution Time": ms}``
    (the times only where printed), as EXPLAIN (FORMAT JSON) holds it; see the module
    docstring.  A text with no plan node in it raises :class:`ParseError`."""
    lines = _plan_lines(text)
    top: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = []  # (indent of the node's text, node)
    # the InitPlan/SubPlan/CTE line a node last had: the child under it is that sub-plan
    subplan_of: dict[int, str] = {}
    for lineno, raw in lines:
        body = raw.strip()
        indent = len(raw) - len(raw.lstrip())
        if body.startswith("->"):
            body = body[2:].strip()
            indent += 2
        elif stack:
            t = _TIME.match(body)
            if t:
                key = "Execution Time" if t.group(1) == "Total runtime" else t.group(1)
                top[key] = float(t.group(2))
                continue
            if _SUBPLAN.match(body):
                # sub-plans print after a node's children: back to the node they are of
                while len(stack) > 1 and stack[-1][0] >= indent:
                    stack.pop()
                subplan_of[id(stack[-1][1])] = body
            else:
                # a node's own line (Filter, Buckets...) or one a terminal or psql wrapped
                # (less indented than the node): no node ends here
                owner = next((n for i, n in reversed(stack) if i < indent), stack[0][1])
                _property(owner, body)
            continue
        node = _node(body, lineno)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if stack:
            parent = stack[-1][1]
            name = subplan_of.get(id(parent))
            if name is not None and name not in ("InitPlan", "SubPlan"):
                # "InitPlan 1", "CTE m": the one node under it (init plans print before
                # the node's own children); PostgreSQL 8's bare "SubPlan" heads them all
                del subplan_of[id(parent)]
            if name is not None:
                node["Parent Relationship"] = "InitPlan" if name.startswith(
                    ("InitPlan", "CTE")) else "SubPlan"
                node["Subplan Name"] = name
            parent.setdefault("Plans", []).append(node)
        elif "Plan" in top:
            raise ParseError(f"EXPLAIN text, line {lineno}: a second plan tree starts "
                             f"here ({body[:60]!r}); give one EXPLAIN's output")
        else:
            top["Plan"] = node
        stack.append((indent, node))
        if len(stack) > _MAX_DEPTH:
            raise ParseError(f"EXPLAIN text, line {lineno}: the plan is nested deeper than "
                             f"{_MAX_DEPTH} nodes; not a plan PostgreSQL made")
    if "Plan" not in top:
        raise ParseError("EXPLAIN text: no plan node found (expected lines such as "
                         "'Seq Scan on t  (cost=0.00..35.50 rows=2550 width=4)'); "
                         "is it EXPLAIN's output?")
    _relationships(top["Plan"])
    return {"Plan": top.pop("Plan"), **top}


def _plan_lines(text: str) -> list[tuple[int, str]]:
    """The lines of the plan itself, (line number, text): pgAdmin's quotes, psql's frame
    (a title, a rule, "(12 rows)"), psql's "+" at a wrapped cell's line ends and what
    comes before the plan (a prompt, a comment, the query) taken off; a node line that a
    terminal wrapped (its parentheses left open) joined again."""
    raw = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    rows = [(i + 1, ln) for i, ln in enumerate(raw)]
    lines = [ln.strip() for _, ln in rows if ln.strip()]
    for q in "\"'":
        lead = bool(lines) and all(ln.startswith(q) for ln in lines)
        if lead or (lines and all(ln.endswith(q) for ln in lines)):
            # pgAdmin: each line in quotes (a long one may have lost its closing quote)
            unq = []
            for lineno, ln in rows:
                if lead and ln.strip():
                    ln = ln.strip()[1:]
                if ln.rstrip().endswith(q):
                    ln = ln.rstrip()[:-1]
                unq.append((lineno, ln.replace(q + q, q)))
            rows = unq
            break
    # psql: a title line ("QUERY PLAN"), a rule under it (wrapped: more rules); the plan
    # follows
    for k in range(1, len(rows)):
        if _RULE.fullmatch(rows[k][1].strip()) and rows[k - 1][1].strip():
            rows = rows[k + 1:]
            while rows and _RULE.fullmatch(rows[0][1].strip()):
                rows = rows[1:]
            break
    numbers = any(_NUMBERS.search(ln) for _, ln in rows)
    kept: list[tuple[int, str]] = []
    cur: _Line | None = None
    for lineno, ln in rows:
        ln = _WRAP_MARK.sub("", ln)
        body = ln.strip()
        if not body or _FOOTER.match(body):
            continue
        if cur is not None and not body.startswith("->") and cur.cut(numbers):
            cur.add(ln)  # a terminal wrapped that line
            continue
        if cur is not None:
            kept.append(cur.done())
        cur = _Line(lineno, ln)
    if cur is not None:
        kept.append(cur.done())
    # what comes before the plan: with costs or actuals printed, the plan starts at the
    # first line that has them; else after comments and statements
    with_numbers = [i for i, (_, ln) in enumerate(kept) if _NUMBERS.search(ln)]
    if with_numbers:
        return kept[with_numbers[0]:]
    i = 0
    while i < len(kept) and (kept[i][1].lstrip().startswith(("#", "--"))
                             or kept[i][1].rstrip().endswith(";")):
        i += 1
    return kept[i:]


def _paren_depth(text: str, quote: str) -> tuple[int, str]:
    """How many parentheses *text* leaves open, outside SQL's quoted literals and
    identifiers ('x(', "a(b"); *quote* is the quote a previous part left open ("" for
    none), and the second value the one this part leaves open.  A doubled quote inside a
    literal ('it''s') closes and reopens it: the same count.  An open quote alone does not
    make a line wrapped (a comment pasted above the plan: "-- don't"): it is carried into
    the next part only of a line joined for its parentheses."""
    depth = 0
    for ch in text:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
    return depth, quote


class _Line:
    """One line of the plan as the terminal may have wrapped it over several: its parts,
    whether its parentheses are left open, whether it has its costs or actuals yet (kept
    as it grows: joining stays linear)."""

    def __init__(self, lineno: int, text: str) -> None:
        self.lineno, self.parts = lineno, [text]
        self.depth, self.quote = _paren_depth(text, "")
        self.node = text.lstrip().startswith("->")
        self.numbers = bool(_NUMBERS.search(text))

    def add(self, text: str) -> None:
        seam = self.parts[-1][-20:] + text[:20]  # "(co" + "st=1.0" across the cut
        self.numbers = self.numbers or bool(_NUMBERS.search(seam) or _NUMBERS.search(text))
        self.parts.append(text)
        depth, self.quote = _paren_depth(text, self.quote)
        self.depth += depth

    def cut(self, numbers: bool) -> bool:
        """Whether a terminal cut it short: a parenthesis left open, or a node line
        ("->  ...") without its costs or actuals where the plan prints them."""
        return self.depth > 0 or (numbers and self.node and not self.numbers)

    def done(self) -> tuple[int, str]:
        return self.lineno, "".join(self.parts).rstrip()


def _node(body: str, lineno: int) -> dict[str, Any]:
    """A node line: its words, then "(cost=...)", then "(actual ...)" or "(never
    executed)", each where the options print them."""
    rest = body.rstrip()
    a = _ACTUAL_END.search(rest)
    if a:
        rest = rest[:a.start()].rstrip()
    c = _COST_END.search(rest)
    if c:
        rest = rest[:c.start()].rstrip()
    if not rest:
        raise ParseError(f"EXPLAIN text, line {lineno}: expected a plan node, got "
                         f"{body[:80]!r}")
    node: dict[str, Any] = _describe(rest)
    if c:
        node["Startup Cost"] = float(c.group(1))
        node["Total Cost"] = float(c.group(2))
        node["Plan Rows"] = int(c.group(3))
        node["Plan Width"] = int(c.group(4))
    if a and a.group(5):
        node["Actual Rows"] = 0
        node["Actual Loops"] = 0
    elif a:
        if a.group(1) is not None:
            node["Actual Startup Time"] = float(a.group(1))
            node["Actual Total Time"] = float(a.group(2))
        rows = a.group(3)
        node["Actual Rows"] = float(rows) if "." in rows else int(rows)
        node["Actual Loops"] = int(a.group(4))
    return node


def _describe(desc: str) -> dict[str, Any]:
    """A node line's words → Node Type and what they name (see the module docstring)."""
    d: dict[str, Any] = {}
    if desc.startswith("Async "):
        d["Async Capable"] = True
        desc = desc.removeprefix("Async ")
    if desc.startswith("Parallel "):
        d["Parallel Aware"] = True
        desc = desc.removeprefix("Parallel ")
    for mode in ("Partial", "Finalize"):
        if desc.startswith(mode + " "):
            d["Partial Mode"] = mode
            desc = desc.removeprefix(mode + " ")
    m = _SCAN_USING.match(desc)
    if m:
        d.update({"Node Type": m.group(1), "Index Name": _unquote(m.group(3))})
        d["Scan Direction"] = "Backward" if m.group(2) else "Forward"
        d.update(_object(m.group(4), "Relation Name"))
        return d
    word, on, rest = desc.partition(" on ")
    if on and word in _ON:
        d["Node Type"] = word
        key = _ON[word]
        if key == "Index Name":
            d[key] = _unquote(rest.strip())
        else:
            d.update(_object(rest, key))
        return d
    if on and word.startswith("Custom Scan ("):
        d["Node Type"] = "Custom Scan"
        d["Custom Plan Provider"] = word[len("Custom Scan ("):].rstrip(")")
        d.update(_object(rest, "Relation Name"))
        return d
    if on and word in _MODIFY:
        d.update({"Node Type": "ModifyTable", "Operation": word})
        d.update(_object(rest, "Relation Name"))
        return d
    j = _JOIN.match(desc)
    if j and (desc.endswith("Join") or j.group(1) == "Nested Loop"):
        d["Node Type"] = "Nested Loop" if j.group(1) == "Nested Loop" else f"{j.group(1)} Join"
        d["Join Type"] = j.group(2) or "Inner"
        return d
    if desc in _AGG:
        d.update({"Node Type": "Aggregate", "Strategy": _AGG[desc]})
        return d
    s = re.match(r"^(Hash)?SetOp (\w+(?: All)?)$", desc)
    if s:
        d.update({"Node Type": "SetOp", "Strategy": "Hashed" if s.group(1) else "Sorted",
                  "Command": s.group(2)})
        return d
    if desc.startswith("Custom Scan ("):
        d.update({"Node Type": "Custom Scan",
                  "Custom Plan Provider": desc[len("Custom Scan ("):].rstrip(")")})
        return d
    d["Node Type"] = desc
    return d


def _unquote(name: str) -> str:
    """A name as EXPLAIN's JSON holds it: ``"*VALUES*"`` → ``*VALUES*``."""
    if len(name) >= 2 and name[0] == name[-1] == '"':
        return name[1:-1].replace('""', '"')
    return name


def _object(rest: str, key: str | None) -> dict[str, str]:
    """``t``, ``t x``, ``public.t x`` (VERBOSE), ``"*VALUES*"`` → *key* (the relation, CTE
    or function; None: the alias only), ``Schema`` and ``Alias``, as the JSON names them."""
    names = _NAMES.findall(rest)
    if not names:
        return {}
    out: dict[str, str] = {}
    if key is not None:
        parts = re.findall(_PART, names[0])
        if len(parts) > 1:
            out["Schema"] = _unquote(".".join(parts[:-1]))
        out[key] = _unquote(parts[-1])
    out["Alias"] = _unquote(names[-1]) if len(names) > 1 or key is None else out[key]
    return out


def _property(node: dict[str, Any], body: str) -> None:
    key, sep, value = body.partition(":")
    value = value.strip()
    if sep and key in ("Workers Planned", "Workers Launched") and value.isdigit():
        node[key] = int(value)
    elif sep and key == "Inner Unique" and value in ("true", "false"):  # VERBOSE
        node[key] = value == "true"


def _relationships(plan: dict[str, Any]) -> None:
    """Parent Relationship of the children that are not sub-plans, as EXPLAIN (FORMAT
    JSON) names them: Member under Append & co., Subquery under a Subquery Scan, else
    Outer then Inner."""
    todo = [plan]
    while todo:
        node = todo.pop()
        kids = node.get("Plans", [])
        plain = [k for k in kids if "Parent Relationship" not in k]
        member = _MEMBERS.get(node.get("Node Type", ""))
        for i, k in enumerate(plain):
            k["Parent Relationship"] = member or ("Outer" if i == 0 else "Inner")
        todo.extend(kids)
