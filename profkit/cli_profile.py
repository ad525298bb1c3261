"""CLI: ``profkit perf``, ``profkit gprof``, ``profkit py-spy``; and :func:`demo_flamegraphs`.

Standalone click commands (``perf_cmd``, ``gprof_cmd``, ``pyspy_cmd``) that
profkit.cli attaches to the main group. Each records into ``profiles/<run_id>/``
(raw artifacts + provenance + parquet tables), renders a flamegraph into
``flamegraphs/`` where the tool gives stacks, and prints a short summary.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
import pandas as pd

from profkit.errors import ProfkitError
from profkit.cli_common import Failed as _Failed
from profkit.cli_common import friendly as _friendly

F = TypeVar("F", bound=Callable[..., Any])

MODES = ("plain", "analyze_notiming", "analyze_timing", "analyze_buffers",
         "analyze_timing_buffers")
INSTR_FUNCTIONS = ("ExecProcNodeInstr", "InstrStartNode", "InstrStopNode", "InstrEndLoop",
                   "ExecProcNodeInstrLite", "PostExecProcNodeInstr", "InstrUpdateTupleCount")




def _say(msg: str) -> None:
    click.echo(f"• {msg}", err=True)


def _fmt_table(df: pd.DataFrame) -> str:
    return df.to_string(index=False) if len(df) else "(no rows)"


# --------------------------------------------------------------------------- flamegraphs

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


def _out_dir(out: str | None) -> Path:
    from profkit.paths import flamegraphs_dir

    p = Path(out) if out else flamegraphs_dir()
    p.mkdir(parents=True, exist_ok=True)
    return p


# --------------------------------------------------------------------------- perf

@click.command("perf")
@click.argument("build")
@click.option("--workload", default="nested_loop", show_default=True)
@click.option("--scale", type=float, default=0.05, show_default=True)
@click.option("--mode", type=click.Choice(MODES), default="analyze_timing", show_default=True)
@click.option("--freq", type=int, default=999, show_default=True, help="Samples per second.")
@click.option("--dwarf", is_flag=True, help="--call-graph dwarf instead of frame pointers.")
@click.option("--reps", type=int, default=1, show_default=True,
              help="Run the query this many times while recording.")
@click.option("--no-stat", is_flag=True, help="Skip perf stat.")
@click.option("--top", "top_n", type=int, default=10, show_default=True)
@click.option("--out", default=None, help="Flamegraph directory (default: flamegraphs/).")
@_friendly
def perf_cmd(build: str, workload: str, scale: float, mode: str, freq: int, dwarf: bool,
             reps: int, no_stat: bool, top_n: int, out: str | None) -> None:
    """Record a backend running a workload's query with perf; flamegraph + top functions."""
    from profkit.collect.perf import profile_workload

    prof = profile_workload(build, workload, scale=scale, mode=mode, reps=reps, freq=freq,
                            call_graph="dwarf" if dwarf else "fp", stat=not no_stat,
                            progress=_say)
    qname = prof.run.provenance.get("query_name") or mode
    svg = flamegraph_for(prof.counts, prof.run,
                         _out_dir(out) / f"perf-{build}-{workload}-{mode}.svg",
                         title=f"{build}: {workload} {qname} (perf)")
    top = prof.top(top_n)[["function", "self", "self_share", "total_share"]]
    click.echo(f"run {prof.run.run_id}: {prof.folding.samples} samples "
               f"({', '.join(prof.folding.events)})")
    click.echo(f"top {top_n} functions by self samples:")
    click.echo(_fmt_table(top.assign(self_share=top["self_share"].map("{:.1%}".format),
                                     total_share=top["total_share"].map("{:.1%}".format))))
    click.echo(f"instrumentation share (self): {prof.instrumentation_share:.1%}")
    if prof.stat is not None and len(prof.stat):
        st = prof.stat[prof.stat["supported"]][["event", "value", "unit"]]
        click.echo("perf stat: " + ", ".join(f"{r.event}={r.value:g}{r.unit and ' ' + r.unit}"
                                             for r in st.itertuples()))
    click.echo(f"artifacts: {prof.run.path}")
    click.echo(f"flamegraph: {svg}")


# --------------------------------------------------------------------------- gprof

@click.command("gprof")
@click.argument("build")
@click.option("--workload", default="nested_loop", show_default=True)
@click.option("--scale", type=float, default=0.05, show_default=True)
@click.option("--mode", type=click.Choice(MODES), default="analyze_notiming",
              show_default=True)
@click.option("--reps", type=int, default=1, show_default=True)
@click.option("--top", "top_n", type=int, default=15, show_default=True)
@_friendly
def gprof_cmd(build: str, workload: str, scale: float, mode: str, reps: int,
              top_n: int) -> None:
    """Run a query in one backend of a -pg build (BUILD vanilla → gprof, step3 →
    step3+gprof); print gprof's flat profile top and the instrumentation call counts
    next to what the plan predicts."""
    from profkit.collect.gprof import gprof_artifact, merged_into, predicted_calls

    from profkit.collect.gprof import profile_workload_with_prediction

    res, pred = profile_workload_with_prediction(build, workload, scale=scale, mode=mode,
                                                 reps=reps, progress=_say)
    click.echo(f"run {res.run.run_id}: gprof of backend {res.run.get('backend_pid')}")
    click.echo(f"flat profile, top {top_n}:")
    click.echo(_fmt_table(res.top(top_n)))
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
    click.echo("instrumentation calls (predicted from the plan's rows and loops):")
    click.echo(_fmt_table(pd.DataFrame(rows)))
    if pred is not None and not pred.totals.get("exact", True):
        inexact = pred.nodes[~pred.nodes["exact"]]
        why = "; ".join(f"node {r.node_id} {r.node_type}: {r.exact_reason}"
                        for r in inexact.itertuples())
        notes.append("the prediction is an upper bound, by at most one call per loop of "
                     f"these nodes (a loop may end without its NULL-returning call): {why}")
    for n in notes:
        click.echo(f"note: {n}")
    click.echo(f"artifacts: {res.run.path}")


# --------------------------------------------------------------------------- py-spy

@click.command("py-spy", context_settings={"ignore_unknown_options": True})
@click.option("--pid", type=int, default=None, help="Python process to sample.")
@click.option("--duration", type=float, default=10.0, show_default=True,
              help="Seconds to sample a --pid.")
@click.option("--rate", type=int, default=100, show_default=True)
@click.option("--native", is_flag=True, help="Include C frames (--native).")
@click.option("--idle", is_flag=True, help="Keep idle samples.")
@click.option("--label", default=None, help="Name of the run and flamegraph.")
@click.option("--out", default=None, help="Flamegraph directory (default: flamegraphs/).")
@click.option("--top", "top_n", type=int, default=10, show_default=True)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@_friendly
def pyspy_cmd(pid: int | None, duration: float, rate: int, native: bool, idle: bool,
              label: str | None, out: str | None, top_n: int, command: tuple[str, ...]) -> None:
    """Sample a Python process (--pid PID) or command (-- python script.py) with py-spy;
    flamegraph + top functions."""
    from profkit.collect import pyspy

    if (pid is None) == (not command):
        raise _Failed("give either --pid PID or a command after --")
    if pid is not None:
        rec, _ = pyspy.record_pid(pid, duration=duration, rate=rate, native=native, idle=idle,
                                  label=label)
    else:
        rec = pyspy.record_command(list(command), rate=rate, native=native, idle=idle,
                                   label=label)
    prof = pyspy.fold_run(rec.run_dir)
    name = label or (f"pid{pid}" if pid is not None else Path(command[-1]).stem)
    svg = flamegraph_for(prof.counts, prof.run, _out_dir(out) / f"py-spy-{name}.svg",
                         title=f"py-spy: {name}")
    click.echo(f"run {prof.run.run_id}: {rec.samples} samples")
    click.echo(_fmt_table(prof.top(top_n)))
    click.echo(f"artifacts: {prof.run.path}")
    click.echo(f"flamegraph: {svg}")


# --------------------------------------------------------------------------- demo

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
    out = _out_dir(str(out_dir) if out_dir else None)
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
