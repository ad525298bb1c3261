"""CLI: ``profkit observers`` — the slowdown each profiling method causes.

The work is :func:`profkit.experiments.observers.measure_observers` on a build
(``--build``, default vanilla): its session starts a throwaway cluster, loads the
workload, measures and stops it; the run (csv, markdown, provenance.json) is written
under ``profiles/<run_id>/``. Notebooks can call it with a Cluster of their own.
"""
from __future__ import annotations


import click

from profkit.cli.common import friendly as _friendly
from profkit.cli.common import say as _progress


def _fmt(v: float) -> str:
    return f"{v:.2f}"


@click.command("observers")
@click.argument("workload", default="join_sum")
@click.option("--scale", type=float, default=0.02, show_default=True,
              help="Workload scale factor.")
@click.option("--build", "build_name", default="vanilla", show_default=True,
              help="Build (preset) whose backend is observed.")
@click.option("--mode", "modes", multiple=True,
              type=click.Choice(["analyze_timing", "analyze_notiming", "plain"]),
              default=("analyze_timing", "plain"), show_default=True,
              help="How the query runs (repeatable).")
@click.option("--method", "methods", multiple=True, default=None,
              help="Observers (repeatable): ltrace, bcc-clock, bcc-nodes, bpftrace-clock, "
                   "bpftrace-nodes, perf-99, perf-999, perf-4999 (any perf-FREQ), callgrind. "
                   "Default: all but bpftrace-nodes.")
@click.option("--reps", type=int, default=5, show_default=True,
              help="Repetitions of the cheap observers.")
@click.option("--expensive-reps", type=int, default=2, show_default=True,
              help="Repetitions of observers the cost guard puts above 2 s (ltrace).")
@click.option("--force", is_flag=True,
              help="Run observers the cost guard estimates above --max-probe-s.")
@click.option("--max-probe-s", type=float, default=300.0, show_default=True,
              help="Cost guard: skip an observer estimated to take longer (see --force).")
@click.option("--out", default=None, help="Parent directory of the run (default profiles/).")
@_friendly
def observers_cmd(workload: str, scale: float, build_name: str, modes: tuple[str, ...],
                  methods: tuple[str, ...], reps: int, expensive_reps: int, force: bool,
                  max_probe_s: float, out: str | None) -> None:
    """Slowdown of the query under each observer (ltrace, bcc, bpftrace, perf, callgrind)."""
    from profkit.experiments.observers import DEFAULT_METHODS, measure_observers
    from profkit.pg.workloads import check_args, check_count
    from profkit.render.observers import slowdown_shown

    check_args(workload, scale=scale, reps=reps, modes=modes)
    check_count(expensive_reps, "--expensive-reps")
    res = measure_observers(build_name, workload=workload, scale=scale, modes=modes,
                            methods=methods or DEFAULT_METHODS, reps=reps,
                            expensive_reps=expensive_reps, force=force,
                            max_probe_s=max_probe_s, base=out, progress=_progress)
    la0 = " ".join(f"{x:.2f}" for x in res.loadavg_before)
    la1 = " ".join(f"{x:.2f}" for x in res.loadavg_after)
    click.echo(f"{workload} at scale {scale}; load average before {la0}, after {la1}")
    click.echo(slowdown_shown(res.slowdown).to_string(index=False, float_format=_fmt))
    if len(res.guard):
        click.echo("\ncost guard check (measured ns/hit vs profkit.collect.bpf defaults):")
        click.echo(res.guard.to_string(index=False, float_format=_fmt))
    if len(res.hit_costs):
        click.echo("\nns per hit by probe kind (vs profkit.collect.bpf.DEFAULT_COST_NS):")
        click.echo(res.hit_costs.to_string(index=False, float_format=_fmt))
    click.echo(f"written to {res.run_dir}")
