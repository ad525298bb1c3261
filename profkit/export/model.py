"""What the exporters read: folded stacks grouped into profiles, with the facts a
profile format has room for (build, mode, unit, sampling frequency, start and length,
the binary) and what a folded frame says about itself (module annotations, a source
file) and about the plan node that was running.
"""
from __future__ import annotations

import functools
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from profkit.errors import ProfkitError

if TYPE_CHECKING:
    import pandas as pd


class ExportError(ProfkitError):
    """Stacks that a format cannot hold faithfully, or an input that holds no stacks."""


@dataclass(frozen=True)
class ProfileFacts:
    """The facts of one profile that the formats carry besides its stacks.

    ``unit``: what a stack's weight counts (the ``stacks`` table's unit: ``samples``,
    ``instructions``, ``period``...); ``event``: the perf event whose periods were summed
    when ``unit`` is ``period``; ``freq_hz``: the sampling frequency (perf ``-F``), which
    turns samples into CPU time; ``started_ns``/``duration_ns``: when the recording began
    (UTC nanoseconds since the epoch) and how long it lasted; ``binary``: the build's
    program (``.../bin/postgres``), the module of frames no module annotation names;
    ``modules``: frame name → module as the profiler printed it (a perf run's functions
    table); ``root_is_process``: the first frame is the process name (stackcollapse-perf's
    comm), not a function; ``name``: a title (the run id).
    """

    build: str = ""
    mode: str = ""
    tool: str = ""
    unit: str = "samples"
    event: str = ""
    freq_hz: float | None = None
    started_ns: int | None = None
    duration_ns: int | None = None
    binary: str = ""
    modules: Mapping[str, str] = field(default_factory=dict)
    root_is_process: bool = True
    name: str = ""

    def with_overrides(self, **given: Any) -> ProfileFacts:
        """These facts with every *given* value that is not None put in."""
        return replace(self, **{k: v for k, v in given.items() if v is not None})

    @property
    def title(self) -> str:
        """``vanilla analyze_notiming (perf)``: how a viewer names this profile."""
        words = " ".join(w for w in (self.build, self.mode) if w) or self.name or "profile"
        return f"{words} ({self.tool})" if self.tool else words


@dataclass(frozen=True)
class StackProfile:
    """One profile: ``(stack, plan node or "") → weight`` and its facts."""

    facts: ProfileFacts
    weights: Mapping[tuple[str, str], float]

    def counts(self) -> dict[str, float]:
        """Weight per stack (plan nodes summed)."""
        out: dict[str, float] = {}
        for (stack, _node), w in self.weights.items():
            out[stack] = out.get(stack, 0.0) + w
        return out

    @property
    def total(self) -> float:
        return float(sum(self.weights.values()))


# --------------------------------------------------------------------------- input

StacksInput = Any  # a stacks DataFrame, a {stack: weight} mapping, or StackProfiles


def profiles_of(stacks: StacksInput, facts: ProfileFacts | None = None,
                *, plan_nodes: bool = True) -> list[StackProfile]:
    """The profiles in *stacks*, each with *facts* (its build/tool/unit/mode from the table).

    *stacks*: a ``stacks`` table (:mod:`profkit.tables`; one profile per distinct
    build, tool, unit, run id and, where the table has that column, mode; a ``plan_node``
    column, where present, names each row's plan node), a ``{stack: weight}`` mapping
    (one profile), a :class:`StackProfile` or a list of them. With *plan_nodes* a stack
    without an explicit plan node gets the one its frames show
    (:func:`plan_node_of`).
    """
    base = facts or ProfileFacts()
    if isinstance(stacks, StackProfile):
        found = [stacks]
    elif isinstance(stacks, list | tuple) and all(isinstance(p, StackProfile) for p in stacks):
        found = list(stacks)
    elif _is_frame(stacks):
        found = _from_table(stacks, base)
    elif isinstance(stacks, Mapping):
        found = [StackProfile(base, {(str(k), ""): float(v) for k, v in stacks.items()})]
    else:
        raise ExportError(f"cannot export {type(stacks).__name__}: give a stacks table, a "
                          "{stack: weight} mapping or StackProfile objects")
    if plan_nodes:
        found = [_with_plan_nodes(p) for p in found]
    for p in found:
        _check_weights(p)
    return found


def _is_frame(obj: object) -> bool:
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(obj, pd.DataFrame)


def _from_table(df: pd.DataFrame, base: ProfileFacts) -> list[StackProfile]:
    missing = {"stack", "weight"} - set(df.columns)
    if missing:
        raise ExportError(f"a stacks table needs the columns stack and weight; it lacks "
                          f"{', '.join(sorted(missing))}")
    keys = [c for c in ("build", "tool", "unit", "mode", "run_id") if c in df.columns]
    cols = [_strings(df[c]) for c in keys]
    nodes = _strings(df["plan_node"]) if "plan_node" in df.columns else [""] * len(df)
    groups: dict[tuple[str, ...], dict[tuple[str, str], float]] = {}
    for i, (stack, w) in enumerate(zip(df["stack"].tolist(), df["weight"].tolist(),
                                       strict=True)):
        g = groups.setdefault(tuple(c[i] for c in cols), {})
        k = (str(stack), nodes[i])
        g[k] = g.get(k, 0.0) + float(w)
    if not groups:  # an empty table is one empty profile, not none
        return [StackProfile(base, {})]
    # the table's own build/tool/unit/mode/run id win over *base*; an empty cell does not
    field_of = {"run_id": "name"}
    return [StackProfile(replace(base, **{field_of.get(k, k): v
                                          for k, v in zip(keys, gk, strict=True) if v}),
                         weights) for gk, weights in groups.items()]


def _strings(col: Any) -> list[str]:
    """A column as str, missing values (None, NaN, NA) as ""."""
    return [str(v) for v in col.astype("string").fillna("").tolist()]


def _check_weights(p: StackProfile) -> None:
    for (stack, _n), w in p.weights.items():
        if not math.isfinite(w) or w < 0:
            raise ExportError(f"stack {stack[:80]!r} has weight {w}: weights must be finite "
                              "and not negative")
        if not stack or not stack.strip():
            raise ExportError("a stack without frames cannot be exported: name its frame "
                              "(py-spy's empty stacks are '[no Python frame]')")


def _with_plan_nodes(p: StackProfile) -> StackProfile:
    out: dict[tuple[str, str], float] = {}
    for (stack, node), w in p.weights.items():
        k = (stack, node or plan_node_of(stack.split(";")))
        out[k] = out.get(k, 0.0) + w
    return StackProfile(p.facts, out)


# --------------------------------------------------------------------------- frames

#: PostgreSQL executor functions → the plan node they run, as EXPLAIN names it. The
#: node's ExecProcNode callback (nodeXxx.c), its MultiExec entry, and, for scans, the
#: access-method callback ExecScan calls (gcc inlines ExecSeqScan into ExecScan's caller
#: at -O2, so a Seq Scan's own frame is SeqNext).
EXECUTOR_NODES: dict[str, str] = {
    "ExecAgg": "Aggregate", "ExecAppend": "Append", "MultiExecBitmapAnd": "BitmapAnd",
    "MultiExecBitmapOr": "BitmapOr", "ExecBitmapHeapScan": "Bitmap Heap Scan",
    "BitmapHeapNext": "Bitmap Heap Scan", "MultiExecBitmapIndexScan": "Bitmap Index Scan",
    "ExecCteScan": "CTE Scan", "CteScanNext": "CTE Scan", "ExecCustomScan": "Custom Scan",
    "ExecForeignScan": "Foreign Scan", "ExecFunctionScan": "Function Scan",
    "FunctionNext": "Function Scan", "ExecGather": "Gather",
    "ExecGatherMerge": "Gather Merge", "ExecGroup": "Group", "ExecHash": "Hash",
    "MultiExecHash": "Hash", "ExecHashJoin": "Hash Join",
    "ExecIncrementalSort": "Incremental Sort", "ExecIndexOnlyScan": "Index Only Scan",
    "IndexOnlyNext": "Index Only Scan", "ExecIndexScan": "Index Scan",
    "IndexNext": "Index Scan", "IndexNextWithReorder": "Index Scan",
    "ExecLimit": "Limit", "ExecLockRows": "LockRows", "ExecMaterial": "Materialize",
    "ExecMemoize": "Memoize", "ExecMergeAppend": "Merge Append",
    "ExecMergeJoin": "Merge Join", "ExecModifyTable": "ModifyTable",
    "ExecNamedTuplestoreScan": "Named Tuplestore Scan", "ExecNestLoop": "Nested Loop",
    "ExecProjectSet": "ProjectSet", "ExecRecursiveUnion": "Recursive Union",
    "ExecResult": "Result", "ExecSampleScan": "Sample Scan", "SampleNext": "Sample Scan",
    "ExecSeqScan": "Seq Scan", "ExecSeqScanWithQual": "Seq Scan",
    "ExecSeqScanWithProject": "Seq Scan", "ExecSeqScanWithQualProject": "Seq Scan",
    "ExecSeqScanEPQ": "Seq Scan", "SeqNext": "Seq Scan", "ExecSetOp": "SetOp",
    "ExecSort": "Sort", "ExecSubqueryScan": "Subquery Scan",
    "SubqueryNext": "Subquery Scan", "ExecTableFuncScan": "Table Function Scan",
    "ExecTidRangeScan": "Tid Range Scan", "ExecTidScan": "Tid Scan", "TidNext": "Tid Scan",
    "ExecUnique": "Unique", "ExecValuesScan": "Values Scan", "ValuesNext": "Values Scan",
    "ExecWindowAgg": "WindowAgg", "ExecWorkTableScan": "WorkTable Scan",
}

_CLONE = re.compile(r"\.(?:isra|part|constprop|cold|lto_priv)\.\d+")


def plan_node_of(frames: Iterable[str]) -> str:
    """The plan node running in a stack: its innermost executor node frame, as EXPLAIN
    names the node (``ExecNestLoop`` → ``Nested Loop``); "" outside the executor."""
    node = ""
    for f in frames:
        name = _node_of_frame(f)
        if name:
            node = name
    return node


@functools.lru_cache(maxsize=1 << 16)
def _node_of_frame(frame: str) -> str:
    return EXECUTOR_NODES.get(_CLONE.sub("", frame), "")


_PYSPY = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_ANNOTATION = re.compile(r"_\[(?P<tag>[kjiw])\]$")
#: stackcollapse-perf.pl's frame annotations (--kernel, --jit, --inline; waker: [w])
ANNOTATION_MODULES = {"k": "[kernel.kallsyms]", "j": "[jit]"}


@dataclass(frozen=True)
class Frame:
    """What a folded frame says: the function (as the flamegraph shows it), its symbol
    without annotations, a module, a source file and line (py-spy)."""

    name: str
    system_name: str
    module: str = ""
    file: str = ""
    line: int = 0


def describe_frame(frame: str, facts: ProfileFacts, *, is_root: bool = False) -> Frame:
    """A folded frame and its module: from the profiler's module map (a perf run's
    functions table), else an annotation in the frame (``[postgres]`` — perf's unnamed
    frame in that module — ``_[k]`` kernel, ``_[j]`` JIT), else the build's binary. The
    process-name root frame has no module. py-spy's ``name (file.py[:line])`` gives the
    function, file and line."""
    symbol, module, file, line = frame, "", "", 0
    m = _ANNOTATION.search(frame)
    if m:
        symbol = frame[:m.start()]
        module = ANNOTATION_MODULES.get(m["tag"], "")
    elif facts.tool == "py-spy" or (" (" in frame and frame.endswith(")")):
        p = _PYSPY.match(frame)
        if p is not None:
            symbol, file = p["name"], p["file"]
            line = int(p["line"]) if p["line"] else 0
    known = facts.modules.get(frame) or facts.modules.get(symbol)
    if known:
        module = known
    elif not module and len(frame) > 2 and frame[0] == "[" and frame[-1] == "]":
        inner = frame[1:-1]
        if inner in ("unknown", "no Python frame"):  # perf knew no module: neither do we
            return Frame(frame, symbol, "", file, line)
        module = "[vdso]" if inner == "vdso" else inner
    if module and facts.binary and module == facts.binary.rsplit("/", 1)[-1]:
        module = facts.binary
    if not module and not file and not (is_root and facts.root_is_process):
        module = facts.binary
    if is_root and facts.root_is_process and not known:
        module = ""
    return Frame(frame, symbol, module, file, line)
