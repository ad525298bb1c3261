"""Time per plan node from sampled call stacks (no clock reads): the plan walk and the
attribution. Pure: no I/O, no tools; the stacks come from :mod:`profkit.parse.perf_callchains`.

**Stable API** (other attribution methods, e.g. a backend that names its running node to
an eBPF program, call these two and get the same table):

- :func:`plan_nodes` ``(plan_json) -> list[PlanNode]``: the plan tree of ``EXPLAIN (FORMAT
  JSON)`` (with or without ANALYZE); ``node_id`` = position in a depth-first pre-order walk
  of EXPLAIN's plan, root 0, children in EXPLAIN's order (InitPlans and SubPlans where
  EXPLAIN lists them, under ``"Plans"``). Not the executor's ``plan_node_id``.
- :func:`shares_from_node_samples` ``(nodes, node_samples, outside, ambiguous=None) ->
  DataFrame``: exclusive samples per node_id → one row per node: node_id, node_type,
  parent_id, depth, relation, alias, exclusive_share, inclusive_share, samples,
  ambiguous_samples, inclusive_samples, rows, loops. ``df.attrs`` holds
  ``outside_executor_share``, ``total_samples``, ``executor_samples``,
  ``outside_samples``.

**Shares.** exclusive share = a node's samples / the samples inside the plan's nodes
(they sum to 1); inclusive share = the samples of the node's subtree (itself, its
children, InitPlans/SubPlans listed under it) / the same denominator.
``outside_executor_share`` = samples in no plan node / all samples (parse, plan,
executor start-up and shut-down, sending rows, idle-in-CPU): beside the nodes, not in.

**The attribution rule** (:func:`attribute`). A sample's frames, root → leaf, are read
from the executor's entry (``ExecutorRun``/``ExecutePlan``; ``ParallelQueryMain`` in a
parallel worker) down to a nested executor's entry (a function running SQL inside a node
stays that node's time). Each executor node function (:data:`NODE_FUNCTIONS`, taken from
PostgreSQL 18's and 19's ``src/backend/executor/node*.c``: every function a node
installs as its ``ExecProcNode``, plus ``MultiExec*``) names a node type; ``ExecScan``
(a scan node's own function tail-calls it, so the scan's frame is gone) names "some
scan", and a scan's access callback (``IndexNext``, ``SubqueryNext`` ...) names its scan
type. A dispatch frame (:func:`is_dispatch`: ``ExecProcNodeInstr``,
``ExecProcNodeMarked`` ...) below the innermost node frame adds a last token of any
type: the sample is in a child of that node (the root, under ``ExecutePlan``). These
tokens, in order, are matched to a path down the plan tree: each token's node is a
descendant of the previous one's (or lies in an InitPlan/SubPlan whose parent is an
ancestor of it: a parameter evaluated below the node the plan is attached to); the first
starts below the root (the leader) or below a Gather/Gather Merge (a worker). A node the
stack skips (a frame lost to a tail call) costs 1; the matches of least cost win. Where
the frame above a child carries a call site (its return address resolved to the parent's
``outerPlan``/``innerPlan`` call, see :mod:`profkit.collect.callsites`), the child must
lie on that side. One winner: the sample belongs to its innermost node. Several (e.g. a
join whose two children have the same type and no call site told them apart), or a
sample whose lost caller frame was given back in copies that land on different nodes
(:func:`repair_lost_callers`): the sample is *ambiguous*; it is shared among the
candidates in proportion to their unambiguous samples (equally where none has any), and
each candidate's part is counted in its ``ambiguous_samples`` column. No node token, or
no path that fits: outside the plan's nodes, in a named category
(:data:`OUTSIDE_CATEGORIES`).
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from profkit.errors import ParseError
from profkit.parse.explain import load_explain
from profkit.parse.perf_callchains import iter_callchains

# --------------------------------------------------------------------------- executor functions

#: Executor function → EXPLAIN's "Node Type". From ``ExecProcNode = ...`` assignments in
#: src/backend/executor/node*.c of PostgreSQL 18 and 19 (the same set in both; 18 added
#: the ExecSeqScan* specialisations), plus the MultiExec* entry points of the nodes that
#: return a hash table or a bitmap.
NODE_FUNCTIONS: dict[str, str] = {
    "ExecAgg": "Aggregate",
    "ExecAppend": "Append",
    "ExecBitmapAnd": "BitmapAnd", "MultiExecBitmapAnd": "BitmapAnd",
    "ExecBitmapHeapScan": "Bitmap Heap Scan",
    "ExecBitmapIndexScan": "Bitmap Index Scan", "MultiExecBitmapIndexScan": "Bitmap Index Scan",
    "ExecBitmapOr": "BitmapOr", "MultiExecBitmapOr": "BitmapOr",
    "ExecCteScan": "CTE Scan",
    "ExecCustomScan": "Custom Scan",
    "ExecForeignScan": "Foreign Scan",
    "ExecFunctionScan": "Function Scan",
    "ExecGather": "Gather",
    "ExecGatherMerge": "Gather Merge",
    "ExecGroup": "Group",
    "ExecHash": "Hash", "MultiExecHash": "Hash",
    "ExecHashJoin": "Hash Join", "ExecParallelHashJoin": "Hash Join",
    "ExecIncrementalSort": "Incremental Sort",
    "ExecIndexOnlyScan": "Index Only Scan",
    "ExecIndexScan": "Index Scan",
    "ExecLimit": "Limit",
    "ExecLockRows": "LockRows",
    "ExecMaterial": "Materialize",
    "ExecMemoize": "Memoize",
    "ExecMergeAppend": "Merge Append",
    "ExecMergeJoin": "Merge Join",
    "ExecModifyTable": "ModifyTable",
    "ExecNamedTuplestoreScan": "Named Tuplestore Scan",
    "ExecNestLoop": "Nested Loop",
    "ExecProjectSet": "ProjectSet",
    "ExecRecursiveUnion": "Recursive Union",
    "ExecResult": "Result",
    "ExecSampleScan": "Sample Scan",
    "ExecSeqScan": "Seq Scan", "ExecSeqScanEPQ": "Seq Scan",
    "ExecSeqScanWithProject": "Seq Scan", "ExecSeqScanWithQual": "Seq Scan",
    "ExecSeqScanWithQualProject": "Seq Scan",
    "ExecSetOp": "SetOp",
    "ExecSort": "Sort",
    "ExecSubqueryScan": "Subquery Scan",
    "ExecTableFuncScan": "Table Function Scan",
    "ExecTidRangeScan": "Tid Range Scan",
    "ExecTidScan": "Tid Scan",
    "ExecUnique": "Unique",
    "ExecValuesScan": "Values Scan",
    "ExecWindowAgg": "WindowAgg",
    "ExecWorkTableScan": "WorkTable Scan",
}

#: Static helpers that continue their node's function (a frame of its own when not inlined).
CONTINUATIONS: dict[str, str] = {
    "MultiExecPrivateHash": "Hash", "MultiExecParallelHash": "Hash",
}

#: A scan's access callback (``ExecScan(&node->ss, IndexNext, ...)``) → its scan type.
#: ``Exec<X>Scan`` tail-calls ``ExecScan`` at -O2, so its own frame is usually gone and
#: the callback is what names the scan.
SCAN_CALLBACKS: dict[str, str] = {
    "BitmapHeapNext": "Bitmap Heap Scan", "CteScanNext": "CTE Scan",
    "ForeignNext": "Foreign Scan", "FunctionNext": "Function Scan",
    "IndexNext": "Index Scan", "IndexNextWithReorder": "Index Scan",
    "IndexOnlyNext": "Index Only Scan", "NamedTuplestoreScanNext": "Named Tuplestore Scan",
    "SampleNext": "Sample Scan", "SeqNext": "Seq Scan", "SubqueryNext": "Subquery Scan",
    "TableFuncNext": "Table Function Scan", "TidNext": "Tid Scan",
    "TidRangeNext": "Tid Range Scan", "ValuesNext": "Values Scan",
    "WorkTableScanNext": "WorkTable Scan",
}

#: Node types whose executor function runs through ``ExecScan`` (execScan.c).
SCAN_TYPES: frozenset[str] = frozenset(SCAN_CALLBACKS.values()) | {"Custom Scan"}
GENERIC_SCAN = ("ExecScan", "ExecScanExtended", "ExecScanFetch")

#: Where the executor proper starts: the leader/backend, and a parallel worker.
EXECUTOR_ENTRY: frozenset[str] = frozenset({"standard_ExecutorRun", "ExecutorRun",
                                            "ExecutePlan"})
WORKER_ENTRY: frozenset[str] = frozenset({"ParallelQueryMain"})
GATHER_TYPES: frozenset[str] = frozenset({"Gather", "Gather Merge"})

#: Categories of samples outside the plan's nodes (first match of the stack wins).
OUTSIDE_CATEGORIES: tuple[tuple[str, frozenset[str]], ...] = (
    ("executor start-up", frozenset({"standard_ExecutorStart", "ExecutorStart",
                                     "InitPlan", "ExecInitNode"})),
    ("executor shut-down", frozenset({"standard_ExecutorEnd", "ExecutorEnd",
                                      "standard_ExecutorFinish", "ExecutorFinish",
                                      "ExecEndNode", "ExecShutdownNode"})),
    ("executor, no plan node (sending rows, ExecutePlan)",
     EXECUTOR_ENTRY | WORKER_ENTRY),
    ("parallel worker start-up (connecting, caches)",
     frozenset({"ParallelWorkerMain", "BackgroundWorkerMain"})),
    ("planning", frozenset({"pg_plan_queries", "pg_plan_query", "planner",
                            "standard_planner"})),
    ("parse and rewrite", frozenset({"pg_parse_query", "raw_parser", "parse_analyze_fixedparams",
                                     "pg_analyze_and_rewrite_fixedparams",
                                     "pg_rewrite_query", "parse_analyze"})),
    ("waiting for the client / idle", frozenset({"ReadCommand", "pq_getbyte",
                                                 "secure_read", "WaitEventSetWait"})),
)
UNMATCHED = "executor, stack fits no path of this plan"
OTHER = "other"


def function_base(name: str) -> str:
    """A symbol without gcc's clone suffixes: ``ExecAgg.cold`` → ``ExecAgg``,
    ``MultiExecPrivateHash.isra.0`` → ``MultiExecPrivateHash``."""
    return name.split(".", 1)[0] if "." in name else name


# --------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class PlanNode:
    """One node of EXPLAIN's plan, numbered in its pre-order walk (root 0)."""

    node_id: int
    node_type: str
    parent_id: int | None
    depth: int
    children: tuple[int, ...] = ()
    relationship: str | None = None   # EXPLAIN's Parent Relationship: Outer/Inner/...
    subplan_name: str | None = None
    relation: str | None = None
    alias: str | None = None
    rows: float | None = None         # EXPLAIN ANALYZE's Actual Rows (per loop)
    loops: float | None = None        # EXPLAIN ANALYZE's Actual Loops
    plan_rows: float | None = None
    parallel_aware: bool = False

    @property
    def label(self) -> str:
        """``3 Seq Scan on test2 b``: the node's frame name in node-rooted flamegraphs."""
        out = f"{self.node_id} {self.node_type}"
        if self.relation:
            out += f" on {self.relation}"
            if self.alias and self.alias != self.relation:
                out += f" {self.alias}"
        elif self.subplan_name:
            out += f" ({self.subplan_name})"
        return out.replace(";", ":")


def plan_nodes(plan_json: Any) -> list[PlanNode]:
    """The plan tree of ``EXPLAIN (FORMAT JSON)`` as nodes in pre-order (see module doc).

    Input: EXPLAIN's result as psycopg returns it (``[{"Plan": ...}]``, a row, or text).
    """
    top = load_explain(plan_json)
    out: list[dict[str, Any]] = []
    stack: list[tuple[Mapping[str, Any], int | None, int]] = [(top["Plan"], None, 0)]
    while stack:
        node, parent, depth = stack.pop()
        nid = len(out)
        rows = node.get("Actual Rows")
        loops = node.get("Actual Loops")
        out.append({"node_id": nid, "node_type": str(node.get("Node Type", "?")),
                    "parent_id": parent, "depth": depth, "children": [],
                    "relationship": node.get("Parent Relationship"),
                    "subplan_name": node.get("Subplan Name"),
                    "relation": node.get("Relation Name") or node.get("CTE Name")
                    or node.get("Function Name"),
                    "alias": node.get("Alias"),
                    "rows": float(rows) if rows is not None else None,
                    "loops": float(loops) if loops is not None else None,
                    "plan_rows": (float(node["Plan Rows"]) if node.get("Plan Rows") is not None
                                  else None),
                    "parallel_aware": bool(node.get("Parallel Aware", False))})
        if parent is not None:
            out[parent]["children"].append(nid)
        for child in reversed(node.get("Plans", []) or []):
            stack.append((child, nid, depth + 1))
    return [PlanNode(**{**d, "children": tuple(d["children"])}) for d in out]


def _check_nodes(nodes: Sequence[PlanNode]) -> None:
    for i, n in enumerate(nodes):
        if n.node_id != i:
            raise ParseError(f"plan nodes must be numbered 0..{len(nodes) - 1} in order "
                             f"(plan_nodes does): node {i} has node_id {n.node_id}")


# --------------------------------------------------------------------------- stacks

@dataclass(frozen=True)
class Frame:
    """One frame of a sampled stack: the symbol (as perf names it), the offset of the
    return address (or the sampled ip, for the leaf) within it, the module."""

    name: str
    offset: int | None = None
    module: str | None = None


@dataclass(frozen=True)
class Sample:
    """One sampled call stack, frames root → leaf."""

    pid: int
    tid: int
    frames: tuple[Frame, ...]
    comm: str = ""
    weight: float = 1.0
    #: a copy made by :func:`repair_lost_callers` when the donors had several callers:
    #: its weight is shared, so it counts as ambiguous unless every copy of the same
    #: sample (same *origin*) lands on one node
    shared: bool = False
    #: for such copies: the index of the recorded sample they were made from
    origin: int = -1


def samples_from_script(source: Any, pids: Iterable[int] | None = None) -> list[Sample]:
    """The samples of a ``perf script`` text with symbol offsets
    (:func:`profkit.parse.perf_callchains.iter_callchains`), frames root → leaf; only
    those of *pids* when given."""
    keep = set(pids) if pids is not None else None
    out = []
    for pid, tid, comm, frames in iter_callchains(source):
        if keep is not None and pid not in keep:
            continue
        out.append(Sample(pid, tid, tuple(Frame(n, o, m) for n, o, m, _ip in reversed(frames)),
                          comm))
    return out


@dataclass
class Repair:
    """What :func:`repair_lost_callers` did."""

    lost: float = 0.0            # samples whose leaf had lost its caller's frame
    repaired: float = 0.0        # of them, given the callers of complete stacks
    shared: float = 0.0          # of those, shared among several callers
    foreign_leaf: float = 0.0    # leaf in a library without frame pointers: not repaired


def repair_lost_callers(samples: Sequence[Sample], lost: Callable[[Frame], bool | None]
                        ) -> tuple[list[Sample], Repair]:
    """Give back the frame a frame-pointer walk loses when the leaf is caught before it
    set up its frame (its first instructions) or after it tore it down (``leave``/``pop
    %rbp`` before ``ret``): the walk then skips the leaf's caller. *lost(leaf)*: True in
    such a place, None for a leaf in a library without frame pointers (its caller is
    always lost and complete stacks cannot tell it: kept as is, counted), else False.

    Rule: a sample ``P;L`` whose leaf *L* lost its caller is replaced by ``P;C;L`` for
    every caller *C* seen in the complete stacks that go through ``P;C;L``, weighted by
    how often each is seen; no such stack: kept as is. Several callers: the copies are
    marked ``shared`` and carry the sample's index as ``origin`` (the attribution counts
    them as ambiguous unless all of them land on one node)."""
    ids: dict[tuple[int, str], int] = {}
    callers: dict[tuple[int, str], dict[Frame, float]] = defaultdict(lambda: defaultdict(float))
    flags = [lost(s.frames[-1]) if s.frames else False for s in samples]
    for s, flag in zip(samples, flags, strict=True):
        if flag is not False:
            continue
        pid = -1
        fr = s.frames
        for i in range(len(fr) - 1):
            if i >= 1:
                callers[(pid, fr[i + 1].name)][fr[i]] += s.weight
            pid = ids.setdefault((pid, fr[i].name), len(ids))
    out: list[Sample] = []
    rep = Repair()
    for k, (s, flag) in enumerate(zip(samples, flags, strict=True)):
        if flag is False:
            out.append(s)
            continue
        if flag is None:
            rep.foreign_leaf += s.weight
            out.append(s)
            continue
        rep.lost += s.weight
        pid = -1
        for f in s.frames[:-1]:
            pid = ids.get((pid, f.name), -2)
            if pid == -2:
                break
        found = callers.get((pid, s.frames[-1].name)) if pid != -2 else None
        if not found:
            out.append(s)
            continue
        total = sum(found.values())
        rep.repaired += s.weight
        many = len(found) > 1
        if many:
            rep.shared += s.weight
        for c, w in found.items():
            out.append(Sample(s.pid, s.tid, (*s.frames[:-1], c, s.frames[-1]), s.comm,
                              s.weight * w / total, shared=many, origin=k if many else -1))
    return out, rep


#: (frame) → "outer", "inner" or None: which child a parent's call site runs.
CallSide = Callable[[Frame], str | None]


@dataclass(frozen=True)
class _Token:
    types: frozenset[str]     # node types this frame group can be
    first: int                # index of its first frame in the stack
    last: int                 # index of its last frame
    kind: str                 # main, scan, next, cont


def _classify(name: str) -> tuple[str, frozenset[str]] | None:
    base = function_base(name)
    t = NODE_FUNCTIONS.get(base)
    if t is not None:
        return "main", frozenset({t})
    t = CONTINUATIONS.get(base)
    if t is not None:
        return "cont", frozenset({t})
    if base in GENERIC_SCAN:
        return "scan", SCAN_TYPES
    t = SCAN_CALLBACKS.get(base)
    if t is not None:
        return "next", frozenset({t})
    return None


class _AnyNodeType(frozenset):  # type: ignore[type-arg]
    """The types of a dispatch token: every node type (the child is found by the tree)."""

    def __contains__(self, item: object) -> bool:
        return True

    def __repr__(self) -> str:
        return "ANY_NODE_TYPE"


ANY_NODE_TYPE: frozenset[str] = _AnyNodeType()


def is_dispatch(name: str) -> bool:
    """A function that runs between a parent and its child: ``ExecProcNodeFirst``, the
    instrumentation and marker wrappers (``ExecProcNodeInstr``, ``ExecProcNodeInstrTsc``,
    ``ExecProcNodeMarked`` ...) and ``MultiExecProcNode``. A sample in one of them (or in
    what it calls, before the child's own function) is the child's time: EXPLAIN ANALYZE
    counts its wrapper in the child's time, and the node marker names the child there."""
    b = function_base(name)
    return b.startswith("ExecProcNode") or b == "MultiExecProcNode"


def node_tokens(frames: Sequence[Frame], *, dispatch: bool = True
                ) -> tuple[list[_Token], bool, bool]:
    """(the node tokens of a stack, whether it is a parallel worker's, whether it entered
    the executor). Tokens are read after the first executor entry and stop at a nested
    executor's entry (see the module docstring). With *dispatch*, a dispatch frame
    (:func:`is_dispatch`) below the innermost node's frames adds a last token of any type
    (kind ``child``): the sample is in a child of that node, or in the plan's root when no
    node frame came before."""
    start = None
    worker = False
    for i, f in enumerate(frames):
        b = function_base(f.name)
        if b in EXECUTOR_ENTRY or b in WORKER_ENTRY:
            start = i
            worker = b in WORKER_ENTRY
            break
    entered = start is not None
    i0 = start + 1 if start is not None else 0
    tokens: list[_Token] = []
    wrapper: int | None = None
    for i in range(i0, len(frames)):
        b = function_base(frames[i].name)
        if tokens and b in EXECUTOR_ENTRY:
            break  # a nested executor (SQL run inside a node): that node's time
        c = _classify(frames[i].name)
        if c is None:
            if dispatch and entered and wrapper is None and is_dispatch(b):
                wrapper = i
            continue
        wrapper = None
        kind, types = c
        if tokens:
            prev = tokens[-1]
            merge = None
            if kind == "scan" and prev.kind == "main" and prev.types <= SCAN_TYPES:
                merge = prev.types
            elif kind == "next" and prev.kind in ("main", "scan") and types & prev.types:
                merge = types & prev.types
            elif kind == "cont" and prev.kind in ("main", "cont") and types == prev.types:
                merge = types
            if merge is not None:
                tokens[-1] = _Token(merge, prev.first, i, kind)
                continue
        tokens.append(_Token(types, i, i, kind))
    if wrapper is not None:
        tokens.append(_Token(ANY_NODE_TYPE, wrapper, wrapper, "child"))
    return tokens, worker, entered


def outside_category(frames: Sequence[Frame]) -> str:
    """The category (:data:`OUTSIDE_CATEGORIES`) of a stack in no plan node."""
    names = {function_base(f.name) for f in frames}
    for cat, fns in OUTSIDE_CATEGORIES:
        if names & fns:
            return cat
    return OTHER


class _Tree:
    def __init__(self, nodes: Sequence[PlanNode]) -> None:
        self.nodes = list(nodes)
        self.depth = [n.depth for n in nodes]
        n = len(nodes)
        # pre-order: a subtree is a contiguous id range [i, end[i])
        self.end = list(range(1, n + 1))
        for node in reversed(self.nodes):
            if node.parent_id is not None:
                self.end[node.parent_id] = max(self.end[node.parent_id], self.end[node.node_id])
        self.roots_main = [0] if n else []
        # InitPlans/SubPlans: run from an expression of their parent or of any node
        # below it (a parameter evaluated in a scan's qual)
        self.subplan_roots = [(node.node_id, node.parent_id) for node in self.nodes
                              if node.relationship in ("InitPlan", "SubPlan")
                              and node.parent_id is not None]
        self.roots_worker = [c for node in self.nodes if node.node_type in GATHER_TYPES
                             for c in node.children
                             if self.nodes[c].relationship not in ("InitPlan", "SubPlan")][:]

    def under(self, a: int, b: int) -> bool:
        """b in a's subtree (b == a included)."""
        return a <= b < self.end[a]

    def side_child(self, a: int, side: str) -> int | None:
        want = "Outer" if side == "outer" else "Inner"
        for c in self.nodes[a].children:
            if self.nodes[c].relationship == want:
                return c
        return None

    def path(self, b: int) -> list[int]:
        out = [b]
        while self.nodes[out[-1]].parent_id is not None:
            out.append(self.nodes[out[-1]].parent_id)  # type: ignore[arg-type]
        return out[::-1]


def match_tokens(tree: _Tree, types: Sequence[frozenset[str]], sides: Sequence[str | None],
                 worker: bool) -> tuple[list[int], int]:
    """The innermost nodes of the least-cost paths that fit *types* (see the module
    docstring), and that cost; ([], -1) when no path fits."""
    roots = tree.roots_worker if worker else tree.roots_main
    if not types or not roots:
        return [], -1
    inf = math.inf
    # cost[b]: least cost of a path matching tokens[0..i] with token i on node b
    cost: dict[int, float] = {}
    for b, node in enumerate(tree.nodes):
        if node.node_type not in types[0]:
            continue
        best = inf
        for r in roots:
            if tree.under(r, b):
                best = min(best, tree.depth[b] - tree.depth[r])
        if best < inf:
            cost[b] = best
    for i in range(1, len(types)):
        side = sides[i - 1]
        nxt: dict[int, float] = {}
        for a, ca in cost.items():
            lo, hi = a + 1, tree.end[a]
            if side is not None:
                c = tree.side_child(a, side)
                if c is not None:
                    lo, hi = c, tree.end[c]
            for b in range(lo, hi):
                if tree.nodes[b].node_type in types[i]:
                    v = ca + tree.depth[b] - tree.depth[a] - 1
                    if v < nxt.get(b, inf):
                        nxt[b] = v
            if side is None:
                for r, p in tree.subplan_roots:
                    if not tree.under(p, a) or tree.under(r, a) or tree.under(a, r):
                        continue
                    for b in range(r, tree.end[r]):
                        if tree.nodes[b].node_type in types[i]:
                            v = ca + tree.depth[b] - tree.depth[r]
                            if v < nxt.get(b, inf):
                                nxt[b] = v
        cost = nxt
        if not cost:
            return [], -1
    if not cost:
        return [], -1
    best = min(cost.values())
    return sorted(b for b, v in cost.items() if v == best), int(best)


@dataclass
class Attribution:
    """What :func:`attribute` found: exclusive samples per node (ambiguous parts
    included), the ambiguous parts alone, samples outside the nodes by category, and the
    node-rooted folded stacks."""

    nodes: list[PlanNode]
    node_samples: dict[int, float]
    ambiguous: dict[int, float]
    outside: dict[str, float]
    folded: dict[str, float] = field(default_factory=dict)
    worker_samples: float = 0.0
    skipped_frames_samples: float = 0.0   # samples whose path skipped a node (a lost frame)
    call_sites_used: float = 0.0           # samples where a call site chose a join's side

    @property
    def outside_total(self) -> float:
        return float(sum(self.outside.values()))

    def table(self) -> pd.DataFrame:
        return shares_from_node_samples(self.nodes, self.node_samples, self.outside_total,
                                        self.ambiguous)


def attribute(nodes: Sequence[PlanNode], samples: Iterable[Sample], *,
              call_side: CallSide | None = None, outside_root: str = "outside executor",
              ) -> Attribution:
    """Attribute sampled stacks to plan nodes by the rule of the module docstring."""
    _check_nodes(nodes)
    tree = _Tree(nodes)
    unamb: dict[int, float] = defaultdict(float)
    outside: dict[str, float] = defaultdict(float)
    pending: list[tuple[Sample, list[_Token], list[int]]] = []
    resolved: list[tuple[Sample, list[_Token], int, float]] = []
    cache: dict[tuple[Any, ...], tuple[list[int], int]] = {}
    worker_w = skipped_w = sided_w = 0.0
    folded: dict[str, float] = defaultdict(float)
    shared_direct: dict[int, float] = defaultdict(float)
    matched: list[tuple[Sample, list[_Token], list[int]]] = []
    # the copies repair_lost_callers made of one sample: the one node all of them land
    # on (then the sample is not ambiguous), or None
    one_node: dict[int, int | None] = {}

    def land(s: Sample, node: int | None) -> None:
        if s.shared and s.origin >= 0:
            before = one_node.get(s.origin, node)
            one_node[s.origin] = node if before == node else None
    for s in samples:
        tokens, worker, _entered = node_tokens(s.frames)
        if not tokens:
            land(s, None)
            cat = outside_category(s.frames)
            outside[cat] += s.weight
            folded[_fold([f"{outside_root}: {cat}"], s.frames, 0)] += s.weight
            continue
        sides: list[str | None] = []
        for k in range(len(tokens) - 1):
            side = None
            if call_side is not None:
                side = call_side(s.frames[tokens[k + 1].first - 1])
            sides.append(side)
        key = (tuple(t.types for t in tokens), tuple(sides), worker)
        if key not in cache:
            cache[key] = match_tokens(tree, [t.types for t in tokens], sides, worker)
        cands, cost = cache[key]
        if not cands and any(sides):
            # a call site that contradicts the tree (a misread line): match without it
            cands, cost = match_tokens(tree, [t.types for t in tokens],
                                       [None] * len(sides), worker)
        if not cands:
            land(s, None)
            outside[UNMATCHED] += s.weight
            folded[_fold([f"{outside_root}: {UNMATCHED}"], s.frames, 0)] += s.weight
            continue
        if worker:
            worker_w += s.weight
        if cost > 0:
            skipped_w += s.weight
        if any(sides):
            sided_w += s.weight
        land(s, cands[0] if len(cands) == 1 else None)
        matched.append((s, tokens, cands))
    for s, tokens, cands in matched:
        if len(cands) == 1 and s.shared and (s.origin < 0 or one_node.get(s.origin) is None):
            shared_direct[cands[0]] += s.weight
            resolved.append((s, tokens, cands[0], s.weight))
        elif len(cands) == 1:
            unamb[cands[0]] += s.weight
            resolved.append((s, tokens, cands[0], s.weight))
        else:
            pending.append((s, tokens, cands))
    amb: dict[int, float] = defaultdict(float, shared_direct)
    for s, tokens, cands in pending:
        base = [unamb.get(c, 0.0) for c in cands]
        tot = sum(base)
        parts = ([b / tot for b in base] if tot > 0 else [1.0 / len(cands)] * len(cands))
        for c, p in zip(cands, parts, strict=True):
            if p > 0:
                amb[c] += s.weight * p
                resolved.append((s, tokens, c, s.weight * p))
    node_samples: dict[int, float] = defaultdict(float)
    for n, w in unamb.items():
        node_samples[n] += w
    for n, w in amb.items():
        node_samples[n] += w
    for s, tokens, c, w in resolved:
        labels = [nodes[i].label for i in tree.path(c)]
        last = tokens[-1]  # a dispatch frame stays in the folded stack, under its child
        folded[_fold(labels, s.frames, last.first if last.kind == "child" else last.last + 1)
               ] += w
    return Attribution(list(nodes), dict(node_samples), dict(amb), dict(outside),
                       dict(folded), worker_samples=worker_w, skipped_frames_samples=skipped_w,
                       call_sites_used=sided_w)


def _fold(head: list[str], frames: Sequence[Frame], start: int) -> str:
    rest = [f.name.replace(";", ":") for f in frames[start:]]
    return ";".join(head + rest)


# --------------------------------------------------------------------------- the table

COLUMNS: tuple[str, ...] = ("node_id", "node_type", "parent_id", "depth", "relation", "alias",
                            "exclusive_share", "inclusive_share", "samples",
                            "ambiguous_samples", "inclusive_samples", "rows", "loops")


def shares_from_node_samples(nodes: Sequence[PlanNode], node_samples: Mapping[int, float],
                             outside: float, ambiguous: Mapping[int, float] | None = None,
                             ) -> pd.DataFrame:
    """Exclusive samples per node_id → the per-node table (see the module docstring).

    *node_samples*: exclusive samples (ambiguous parts included) per node_id; node ids
    not in *nodes* raise. *outside*: samples in no plan node. *ambiguous*: of each
    node's samples, how many came from sharing ambiguous stacks.
    """
    _check_nodes(nodes)
    n = len(nodes)
    amb = dict(ambiguous or {})
    for k in list(node_samples) + list(amb):
        if not (isinstance(k, int) and 0 <= k < n):
            raise ParseError(f"node_samples names node {k!r}, but the plan has nodes 0..{n - 1}")
    for k, v in list(node_samples.items()) + list(amb.items()) + [("outside", outside)]:
        if not math.isfinite(float(v)) or float(v) < 0:
            raise ParseError(f"samples must be finite and >= 0: {k}: {v!r}")
    excl = [float(node_samples.get(i, 0.0)) for i in range(n)]
    incl = list(excl)
    for node in reversed(nodes):  # children come after their parent in pre-order
        if node.parent_id is not None:
            incl[node.parent_id] += incl[node.node_id]
    inside = sum(excl)
    total = inside + float(outside)
    rows = []
    for i, node in enumerate(nodes):
        rows.append({
            "node_id": i, "node_type": node.node_type, "parent_id": node.parent_id,
            "depth": node.depth, "relation": node.relation, "alias": node.alias,
            "exclusive_share": excl[i] / inside if inside > 0 else math.nan,
            "inclusive_share": incl[i] / inside if inside > 0 else math.nan,
            "samples": excl[i], "ambiguous_samples": float(amb.get(i, 0.0)),
            "inclusive_samples": incl[i],
            "rows": node.rows if node.rows is not None else math.nan,
            "loops": node.loops if node.loops is not None else math.nan,
        })
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df["parent_id"] = df["parent_id"].astype("Int64")
    df.attrs.update(outside_executor_share=float(outside) / total if total > 0 else math.nan,
                    total_samples=total, executor_samples=inside,
                    outside_samples=float(outside))
    return df


def node_types_table(samples: Iterable[Sample]) -> pd.DataFrame:
    """Without a plan (a statement EXPLAIN cannot plan: parameters, utility commands):
    exclusive samples per innermost node TYPE, and samples outside any node.
    Columns: node_type, samples, exclusive_share; attrs as :func:`shares_from_node_samples`."""
    per: dict[str, float] = defaultdict(float)
    outside = 0.0
    for s in samples:
        tokens, _w, _e = node_tokens(s.frames, dispatch=False)
        if not tokens:
            outside += s.weight
            continue
        types = tokens[-1].types
        per[next(iter(types)) if len(types) == 1 else "some scan (ExecScan)"] += s.weight
    inside = sum(per.values())
    df = pd.DataFrame([{"node_type": t, "samples": w,
                        "exclusive_share": w / inside if inside else math.nan}
                       for t, w in sorted(per.items(), key=lambda kv: -kv[1])],
                      columns=["node_type", "samples", "exclusive_share"])
    total = inside + outside
    df.attrs.update(outside_executor_share=outside / total if total else math.nan,
                    total_samples=total, executor_samples=inside, outside_samples=outside)
    return df
