"""The single-build profile experiments' shared end: flamegraphs with a run's provenance,
and ``make demo``'s Query-2 flamegraphs (vanilla, step3, and the differential).

The recording itself is :func:`profkit.collect.perf.profile_workload` and
:func:`profkit.collect.gprof.profile_workload`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from profkit.errors import ProfkitError


def _say(msg: str) -> None:
    from profkit.progress import say

    say(msg)


def flamegraph_dir(out: str | Path | None = None) -> Path:
    """*out*, or flamegraphs/ (created)."""
    from profkit.paths import flamegraphs_dir

    p = Path(out) if out else flamegraphs_dir()
    p.mkdir(parents=True, exist_ok=True)
    return p


def flamegraph_for(counts: dict[str, float], run: Any, path: Path, *, title: str,
                   diff_against: dict[str, float] | None = None,
                   extra: dict[str, str] | None = None,
                   copy_name: str | None = "flamegraph.svg") -> Path:
    """Render *counts* with the run's provenance in the subtitle; a copy goes into the
    run directory as *copy_name* (None: no copy)."""
    from profkit.render.flamegraph import render, write_svg

    facts = run.subtitle_facts() if run is not None else {}
    facts["samples"] = f"{int(sum(counts.values())):,}"
    facts.update(extra or {})
    svg = render(counts, title=title, provenance=facts, diff_against=diff_against)
    out = write_svg(svg, path)
    if run is not None and copy_name:
        write_svg(svg, run.file(copy_name))
        run.add_artifact(copy_name, f"flamegraph (copy of {out})")
    return out


def demo_flamegraphs(out_dir: str | Path | None = None, *, scale: float = 0.05,
                     builds: Sequence[str] = ("vanilla", "step3"),
                     mode: str = "analyze_notiming", workload: str = "nested_loop",
                     reps: int = 3, progress: Callable[[str], None] | None = None
                     ) -> list[Path]:
    """`make demo`'s flamegraphs: Query-2 on *builds[0]* and *builds[1]*, and the
    differential builds[0] → builds[1] (red: more samples in builds[1], blue: fewer).

    Returns the SVG paths (``query2-vanilla.svg``, ``query2-step3.svg``,
    ``query2-vanilla-vs-step3.svg``, then ``query2-vanilla-icicle.svg`` and
    ``query2-merged.svg`` (both runs, each normalised) for the defaults).
    """
    from profkit.analyze.stacks import EXECUTOR_WRAPPERS, drop_frames
    from profkit.collect.perf import profile_workload
    from profkit.pg.workloads import SEED_QUERY_NAMES

    say = progress or _say
    if len(builds) != 2:
        raise ProfkitError(f"demo_flamegraphs needs two builds (before, after), got {builds}")
    out = flamegraph_dir(out_dir)
    qname = SEED_QUERY_NAMES.get(mode, mode) if workload == "nested_loop" else mode
    slug = qname.lower().replace("-", "")
    a_name, b_name = builds
    profs = [profile_workload(b, workload, scale=scale, mode=mode, reps=reps, progress=say)
             for b in builds]
    paths = []
    for name, prof in zip(builds, profs, strict=True):
        paths.append(flamegraph_for(
            prof.counts, prof.run, out / f"{slug}-{name}.svg",
            title=f"{name}: {workload} {qname} (perf)",
            extra={"instrumentation": f"{prof.instrumentation_share:.1%}"}))
        say(f"{name}: {prof.folding.samples} samples, instrumentation "
            f"{prof.instrumentation_share:.1%}")
    a, b = profs
    # Stacks are matched by their whole path: drop the executor's wrapper frames
    # (ExecProcNodeInstr...) inside the stacks of both builds so the plan nodes line up
    # even when one build has no wrapper (step3); leaf wrapper time is kept.
    diff = flamegraph_for(
        drop_frames(b.counts), b.run, out / f"{slug}-{a_name}-vs-{b_name}.svg",
        title=f"{a_name} → {b_name}: {workload} {qname} (differential, perf)",
        diff_against=drop_frames(a.counts),
        copy_name="flamegraph-diff-vs-" + a_name + ".svg",
        extra={"aligned": "wrapper frames " + "/".join(sorted(EXECUTOR_WRAPPERS))
                          + " removed inside stacks",
               "before (A)": f"{a_name} run {a.run.run_id}",
               "after (B)": f"{b_name} run {b.run.run_id}",
               "instrumentation A→B": f"{a.instrumentation_share:.1%} → "
                                      f"{b.instrumentation_share:.1%}"})
    paths.append(diff)
    from profkit.render.flamegraph import demo_views  # icicle and merged views (issue 12)

    paths += demo_views([(n, p.counts) for n, p in zip(builds, profs, strict=True)], out,
                        slug=slug, what=f"{workload} {qname} (perf)")
    return paths


INSTR_FUNCTIONS = ("ExecProcNodeInstr", "InstrStartNode", "InstrStopNode", "InstrEndLoop",
                   "ExecProcNodeInstrLite", "PostExecProcNodeInstr", "InstrUpdateTupleCount")


def instrumentation_calls(res: Any, pred: Any, reps: int) -> tuple[Any, list[str]]:
    """gprof's call counts of the instrumentation functions beside the plan's prediction.

    *res* is a gprof profile (``calls(fn)``, ``run``), *pred* a prediction or None.
    Returns (one row per function: calls, predicted, gprof_artifact, unexplained; notes).
    """
    import pandas as pd

    from profkit.collect.gprof import gprof_artifact, merged_into, predicted_calls

    binary = str(res.run.get("gprof_binary") or res.run.get("build.postgres"))
    rows, notes = [], []
    for fn in INSTR_FUNCTIONS:
        c = res.calls(fn)
        if c is None:
            continue
        p = predicted_calls(pred, fn, reps) if pred is not None else None
        merged = merged_into(binary, fn)
        extra = gprof_artifact(pred, fn, merged, reps) if pred is not None else 0
        if merged:
            notes.append(f"gprof counts {', '.join(merged)} (symbols it drops) as {fn}"
                         + (f": +{extra}, one per plan node at ExecShutdownNode" if extra
                            else ""))
        rows.append({"function": fn, "calls": c,
                     "predicted": p if p is not None else "",
                     "gprof_artifact": extra if p is not None else "",
                     "unexplained": (c - p - extra) if p is not None else ""})
    if pred is not None and not pred.totals.get("exact", True):
        inexact = pred.nodes[~pred.nodes["exact"]]
        why = "; ".join(f"node {r.node_id} {r.node_type}: {r.exact_reason}"
                        for r in inexact.itertuples())
        notes.append("the prediction is an upper bound, by at most one call per loop of "
                     f"these nodes (a loop may end without its NULL-returning call): {why}")
    return pd.DataFrame(rows), notes
