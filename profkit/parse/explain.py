"""EXPLAIN (FORMAT JSON) output → the plan table; EXPLAIN's own times from any format.

Input: what ``EXPLAIN (ANALYZE, FORMAT JSON) <query>`` returns through psycopg (a list
holding one dict with a ``"Plan"`` key; a row ``(json,)``; or the JSON text).
Output: one row per plan node, numbered like the executor's ``plan_node_id`` (the main
tree in pre-order, then sub-plans by their plan id): what :mod:`profkit.analyze.predict`,
:mod:`profkit.pg.corpus`, the timing-accuracy analysis and the experiments use.

    [{"Plan": {"Node Type": "Aggregate", "Actual Rows": 1.0, "Actual Loops": 1, ...}}]
    → node_id=0 node_type=Aggregate parent_id=<NA> rows=1.0 loops=1.0 ...
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from profkit.errors import ParseError
from profkit.parse._io import read_text
from profkit.parse.explain_text import looks_like_text_explain, parse_text_explain

#: Node types whose children's plan_node_ids can skip numbers (flattened or pruned).
GAP_TYPES = frozenset({"Subquery Scan", "Append", "Merge Append"})

_EXEC_TIME = re.compile(r"Execution Time: ([0-9.]+) ms")
_PLAN_TIME = re.compile(r"Planning Time: ([0-9.]+) ms")


def explain_times(rows: Sequence[tuple[Any, ...]]) -> tuple[float, float]:
    """(Execution Time, Planning Time) in ms from EXPLAIN's result rows, text or JSON;
    NaN where absent.

    Input:  ``[("Seq Scan on t1 ...",), ("Planning Time: 0.1 ms",), ("Execution Time: 12.3 ms",)]``
    Output: ``(12.3, 0.1)``
    """
    ex = pl = math.nan
    for r in rows:
        v = r[0] if r else None
        if isinstance(v, str) and v.lstrip().startswith("["):
            try:
                v = json.loads(v)
            except ValueError:
                pass
        if isinstance(v, list) and v and isinstance(v[0], Mapping):
            top = v[0]
            if top.get("Execution Time") is not None:
                ex = float(top["Execution Time"])
            if top.get("Planning Time") is not None:
                pl = float(top["Planning Time"])
            continue
        line = str(v)
        m = _EXEC_TIME.search(line)
        if m:
            ex = float(m.group(1))
        m = _PLAN_TIME.search(line)
        if m:
            pl = float(m.group(1))
    return ex, pl


def execution_ms(rows: Sequence[tuple[Any, ...]]) -> float:
    """EXPLAIN's Execution Time (ms) from its text or JSON output; NaN if absent.

    Input:  ``[("Aggregate  (cost=...) (actual time=...)",), ..., ("Execution Time: 12.3 ms",)]``
    Output: ``12.3``
    """
    return explain_times(rows)[0]


def node_total_times(explain: Any) -> list[float]:
    """Actual Total Time of every node, in EXPLAIN's print order (pre-order)."""
    return [float(n.get("Actual Total Time", math.nan))
            for n in explain_order(load_explain(explain)["Plan"])]


def load_explain(explain: Any) -> dict[str, Any]:
    """The top object of an EXPLAIN (FORMAT JSON) result, its plan tree checked."""
    if isinstance(explain, (str, bytes, bytearray)):
        try:
            explain = json.loads(explain)
        except json.JSONDecodeError as e:
            text = explain if isinstance(explain, str) else bytes(explain).decode(
                "utf-8", "replace")
            if looks_like_text_explain(text):
                # EXPLAIN's default text format (pasted from psql or pgAdmin)
                top = parse_text_explain(text)
                _check_plan(top["Plan"])
                return top
            raise ParseError(f"EXPLAIN output, line {e.lineno} column {e.colno}: not JSON "
                             f"({e.msg}), and no plan line of EXPLAIN's text format; pass "
                             "EXPLAIN's output (FORMAT JSON or TEXT)") from None
        except ValueError as e:  # bytes that are not UTF-8/16/32
            raise ParseError(f"EXPLAIN output is not JSON text ({e}); use EXPLAIN "
                             "(FORMAT JSON)") from None
        except RecursionError:
            raise ParseError("EXPLAIN output: JSON nested too deeply to be a plan") from None
    if isinstance(explain, (list, tuple)):
        if not explain:
            raise ParseError("empty EXPLAIN result")
        explain = explain[0]
        if isinstance(explain, (list, tuple, str, bytes)):  # a row: (json,)
            return load_explain(explain)
    if not isinstance(explain, Mapping) or "Plan" not in explain:
        raise ParseError("not an EXPLAIN (FORMAT JSON) result: expected [{'Plan': ...}]")
    _check_plan(explain["Plan"])
    return dict(explain)


def read_explain(source: Any) -> dict[str, Any]:
    """:func:`load_explain` of a file (a path, ``.gz`` too, or a binary file object such
    as stdin's buffer) holding EXPLAIN's output in either format."""
    return load_explain(read_text(source))


_NUMERIC_KEYS = ("Actual Rows", "Actual Loops", "Plan Rows", "Startup Cost", "Total Cost")
_TEXT_KEYS = ("Node Type", "Parent Relationship", "Subplan Name", "Relation Name", "Join Type")
#: deeper than this is not a plan PostgreSQL made (and would overflow Python's stack)
MAX_PLAN_DEPTH = 400


def _check_plan(plan: Any) -> None:
    """Reject a plan tree whose shape or values are not EXPLAIN's, naming the node.

    Iterative, so a hostile nesting depth is an error, not a RecursionError."""
    stack: list[tuple[Any, str, int]] = [(plan, "Plan", 0)]
    while stack:
        node, where, depth = stack.pop()
        if not isinstance(node, Mapping):
            raise ParseError(f"EXPLAIN JSON, {where}: expected a plan node object, got "
                             f"{type(node).__name__}")
        if depth > MAX_PLAN_DEPTH:
            raise ParseError(f"EXPLAIN JSON: the plan is nested deeper than {MAX_PLAN_DEPTH} "
                             "nodes; not a plan PostgreSQL made")
        for k in _NUMERIC_KEYS:
            v = node.get(k)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v < 0:
                raise ParseError(f"EXPLAIN JSON, {where}: {k!r} should be a finite number >= 0, "
                                 f"got {v!r}"[:300])
        for k in _TEXT_KEYS:
            v = node.get(k)
            if v is not None and not isinstance(v, str):
                raise ParseError(f"EXPLAIN JSON, {where}: {k!r} should be text, got {v!r}"[:300])
        children = node.get("Plans")
        if children is None:
            continue
        if not isinstance(children, (list, tuple)):
            raise ParseError(f"EXPLAIN JSON, {where}: 'Plans' should be a list of nodes, got "
                             f"{type(children).__name__}")
        for i in range(len(children) - 1, -1, -1):
            stack.append((children[i], f"{where} > Plans[{i}]", depth + 1))


_SUBPLAN_NUM = re.compile(r"^(InitPlan|SubPlan)\s+(\d+)")


def flatten_plan(explain: Any) -> pd.DataFrame:
    """One row per plan node, numbered like ``plan_node_id`` (see module docstring).

    Input:  ``[{"Plan": {"Node Type": "Aggregate", "Actual Rows": 1.0, "Actual Loops": 1,
    "Plans": [...]}}]``
    Output: columns node_id, node_type, parent_id, relationship, subplan_name, depth,
    rows_per_loop, loops, rows (= total rows), analyzed, relation, join_type, order
    (EXPLAIN's print order), id_reliable.
    """
    top = load_explain(explain)
    rows: list[dict[str, Any]] = []
    subplans: list[tuple[tuple[int, int, int], dict, int | None, int]] = []
    reliable = True
    seen_sub: set[str] = set()

    def visit(node: Mapping[str, Any], parent: int | None, rel: str | None, depth: int,
              sub_name: str | None, tree: str) -> None:
        nonlocal reliable
        ntype = str(node.get("Node Type", "?"))
        if ntype in GAP_TYPES or "Subplans Removed" in node:
            reliable = False
        if ntype in ("Gather", "Gather Merge"):
            reliable = False
        nid = len(rows)
        loops = node.get("Actual Loops")
        per_loop = node.get("Actual Rows")
        analyzed = loops is not None
        total = float(per_loop) * float(loops) if analyzed and per_loop is not None else None
        if total is not None and not math.isfinite(total):
            raise ParseError(f"EXPLAIN JSON: node {nid} ({ntype}): Actual Rows x Actual Loops "
                             "is not a finite number")
        rows.append({
            "node_id": nid, "node_type": ntype, "parent_id": parent, "relationship": rel,
            "subplan_name": sub_name, "depth": depth, "plan_tree": tree,
            "rows_per_loop": float(per_loop) if per_loop is not None else float("nan"),
            "loops": float(loops) if loops is not None else float("nan"),
            # PG18 prints Actual Rows per loop with two decimals: round the product.
            "rows": float(round(total)) if total is not None else float("nan"),
            "analyzed": analyzed,
            "relation": node.get("Relation Name"), "join_type": node.get("Join Type"),
            "inner_unique": node.get("Inner Unique"),
            "_json": node,
        })
        for child in node.get("Plans", []) or []:
            crel = child.get("Parent Relationship")
            if crel in ("InitPlan", "SubPlan"):
                name = str(child.get("Subplan Name", ""))
                if name in seen_sub:
                    continue
                seen_sub.add(name)
                m = _SUBPLAN_NUM.match(name)
                # CTE plans are made before sublinks are: lowest plan_ids
                key = (1, int(m.group(2)), len(subplans)) if m else (0, 0, len(subplans))
                if not m:
                    reliable = False
                subplans.append((key, child, nid, depth + 1))
            else:
                visit(child, nid, crel, depth + 1, None, tree)

    visit(top["Plan"], None, None, 0, None, "main")
    # Sub-plans after the main tree; nested sub-plans are appended while visiting,
    # so keep taking the lowest key until none is left.
    while subplans:
        subplans.sort(key=lambda s: s[0])
        _key, child, parent, depth = subplans.pop(0)
        visit(child, parent, child.get("Parent Relationship"), depth,
              str(child.get("Subplan Name", "")), "subplan")
    order = {id(n): i for i, n in enumerate(explain_order(top["Plan"]))}
    df = pd.DataFrame(rows)
    df["order"] = [order.get(id(j), -1) for j in df["_json"]]
    df = df.drop(columns=["_json"])
    df["parent_id"] = df["parent_id"].astype("Int64")
    df["id_reliable"] = reliable
    df.attrs["planning_ms"] = top.get("Planning Time")
    df.attrs["execution_ms"] = top.get("Execution Time")
    return df


def explain_order(plan: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Nodes in EXPLAIN's print order (pre-order), without recursion."""
    out: list[Mapping[str, Any]] = []
    stack = [plan]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(node.get("Plans", []) or []))
    return out
