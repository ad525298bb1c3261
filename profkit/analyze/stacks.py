"""Folded-stack transformations that make two builds' profiles comparable.

A differential flamegraph (FlameGraph's difffolded, profkit.render.flamegraph with
``diff_against``) matches frames by their whole path from the root. EXPLAIN ANALYZE's
wrapper, ``ExecProcNodeInstr``, sits between every plan node and its parent in a vanilla
build and is gone in a build that counts rows inside the nodes (step3), so no path of
one build matches a path of the other: every frame looks new, and the graph is all red.
:func:`drop_frames` removes such wrapper frames from the *inside* of stacks so the plan
nodes line up; time spent in the wrapper itself (where it is the leaf) is kept, so
nothing is lost from the totals.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping

# Frames that only forward to the next plan node: dropped inside stacks before a diff.
EXECUTOR_WRAPPERS: frozenset[str] = frozenset({
    "ExecProcNodeInstr", "ExecProcNodeInstrLite", "ExecProcNodeFirst",
})


def drop_frames(counts: Mapping[str, float], names: Collection[str] = EXECUTOR_WRAPPERS,
                *, keep_leaf: bool = True) -> dict[str, float]:
    """Folded stacks with the frames in *names* removed where they are not the leaf.

    Input: ``{"postgres;ExecutorRun;ExecProcNodeInstr;ExecAgg;ExecProcNodeInstr;
    InstrStartNode": 3, "postgres;ExecutorRun;ExecProcNodeInstr": 1}``
    Output: ``{"postgres;ExecutorRun;ExecAgg;InstrStartNode": 3,
    "postgres;ExecutorRun;ExecProcNodeInstr": 1}``

    Stacks that become equal are summed; the total is unchanged. With
    ``keep_leaf=False`` a leaf wrapper frame goes too (its samples move to its caller).
    """
    drop = frozenset(names)
    out: dict[str, float] = {}
    for stack, w in counts.items():
        frames = stack.split(";")
        last = len(frames) - 1
        kept = [f for i, f in enumerate(frames)
                if f not in drop or (keep_leaf and i == last) or i == 0]
        key = ";".join(kept)
        out[key] = out.get(key, 0.0) + w
    return out
