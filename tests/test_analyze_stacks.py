"""drop_frames: aligning two builds' stacks for a differential flamegraph."""
from __future__ import annotations

from profkit.analyze.stacks import drop_frames


def test_drop_wrappers_inside_keeps_leaf_and_total() -> None:
    vanilla = {
        "postgres;ExecutorRun;ExecProcNodeInstr;ExecAgg;ExecProcNodeInstr;InstrStartNode": 3,
        "postgres;ExecutorRun;ExecProcNodeInstr;ExecAgg;ExecProcNodeInstr;ExecNestLoop": 5,
        "postgres;ExecutorRun;ExecProcNodeInstr": 1,
        "postgres;ExecutorRun;ExecProcNodeInstr;ExecAgg": 2,
    }
    out = drop_frames(vanilla)
    assert out == {
        "postgres;ExecutorRun;ExecAgg;InstrStartNode": 3,
        "postgres;ExecutorRun;ExecAgg;ExecNestLoop": 5,
        "postgres;ExecutorRun;ExecProcNodeInstr": 1,
        "postgres;ExecutorRun;ExecAgg": 2,
    }
    assert sum(out.values()) == sum(vanilla.values())
    # a step3-like profile (no wrapper) now shares its paths with vanilla's
    step3 = {"postgres;ExecutorRun;ExecAgg;ExecNestLoop": 4}
    assert set(drop_frames(step3)) <= set(out)


def test_drop_leaf_too_and_merge() -> None:
    c = {"p;a;ExecProcNodeInstr": 1, "p;a": 2, "p;ExecProcNodeInstr;a": 3}
    assert drop_frames(c, keep_leaf=False) == {"p;a": 6}
    assert drop_frames({}) == {}
    # the root (process name) is never dropped
    assert drop_frames({"ExecProcNodeInstr;x": 1}) == {"ExecProcNodeInstr;x": 1}
