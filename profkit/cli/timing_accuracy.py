"""CLI: ``profkit timing-accuracy`` — per-node accuracy and cost of the clock-source variants.

Registered in :data:`profkit.cli.COMMANDS`.  Library errors (ProfkitError) become one line on stderr and
exit status 2; Ctrl-C stops everything profkit started (exit 130).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from profkit.cli.common import friendly as _friendly
from profkit.cli.common import min_kept_option
from profkit.cli.common import say as _say


def _print(res: Any) -> None:
    from profkit.render.timing_accuracy import ta_table

    click.echo(ta_table(res.summary))
    for r in res.verdicts.itertuples():
        click.echo(f"- {r.workload} / {r.arm}: {r.verdict} — {r.text}")
    if res.vcpu_note:
        click.echo(res.vcpu_note)
    for odd in res.suspects:
        click.echo(f"SUSPECT: {odd}")
    if not res.mismatches.empty:
        click.echo(f"\n{len(res.mismatches)} row/loop MISMATCHES against the baseline: "
                   f"{res.run_dir / 'mismatches.csv'}")
    click.echo(f"\nreport: {res.report_md}\nrun: {res.run_dir}")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: give auto or a whole number >= 1",
                                 param_hint="--backends") from None


@click.command("timing-accuracy")
@click.option("--arm", "arms", multiple=True, metavar="[LABEL=]PRESET[:GUC=V,...]",
              help="An arm to measure (repeatable). Default: vanilla, coarse_clock, tsc_clock, "
                   "sampled_timing, sampled_timing_n1=sampled_timing:"
                   "explain_timing_sample_rate=1.")
@click.option("--workloads", default="nested_loop,join_sum,count_star", show_default=True,
              help="Comma-separated seed workloads.")
@click.option("--nl-scale", type=float, default=0.05, show_default=True,
              help="nested_loop scale (work grows with scale²).")
@click.option("--js-scale", type=float, default=0.2, show_default=True, help="join_sum scale.")
@click.option("--cs-scale", type=float, default=0.1, show_default=True,
              help="count_star scale.")
@click.option("--reps", type=int, default=9, show_default=True,
              help="Interleaved repetitions of every (arm, mode).")
@click.option("--warmup", type=int, default=1, show_default=True,
              help="Unrecorded executions before the measured ones.")
@click.option("--baseline", default="vanilla", show_default=True,
              help="Arm whose TIMING TRUE per-node times are the yardstick.")
@click.option("--build-missing", is_flag=True,
              help="Build arms whose build is not cached (else they are skipped).")
@click.option("--no-clock-cost", is_flag=True, help="Skip measuring ns per clock read.")
@click.option("--tol", type=float, default=10.0, show_default=True,
              help="Verdict: % error allowed on nodes >= --min-node-ms.")
@click.option("--min-node-ms", type=float, default=1.0, show_default=True,
              help="Nodes faster than this are left out of the verdict.")
@click.option("--reference", default="tsc_clock", show_default=True,
              help="Second yardstick arm for the per-node errors ('' for none).")
@click.option("--nice", "nice", default="auto", show_default=True,
              help="Priority for the measured backends: -20..19, 'none', or 'auto' (-20 as "
                   "root): keeps them on the CPU on a shared, loaded machine.")
@click.option("--seed", type=int, default=None, help="Order seed (default: random, recorded).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run directory (default: profiles/<timestamp>-timing_accuracy).")
@click.option("--report", "report_dir", type=click.Path(file_okay=False, exists=True,
                                                         path_type=Path), default=None,
              help="Only (re)analyse an existing run directory.")
@click.option("--backends", default="auto", show_default=True, metavar="auto|K",
              help="Independent backends per arm, each on a fresh cluster; the repetitions "
                   "are split between them (auto: 1 below 8 repetitions, else one per "
                   "repetition, at most 12).")
@click.option("--no-calibration", is_flag=True,
              help="Skip the vCPU calibration before and after every execution (and so the "
                   "rule that leaves out the executions a slow vCPU disturbed).")
@min_kept_option("(workload, arm, mode)")
@_friendly
def timing_accuracy_cmd(arms: tuple[str, ...], workloads: str, nl_scale: float,
                        js_scale: float, cs_scale: float, reps: int, warmup: int,
                        baseline: str, build_missing: bool, no_clock_cost: bool, tol: float,
                        min_node_ms: float, reference: str, nice: str, seed: int | None,
                        out: Path | None,
                        report_dir: Path | None, backends: str, no_calibration: bool,
                        min_kept: int | str) -> None:
    """How far coarse_clock/tsc_clock/sampled_timing's per-node times are from vanilla's,
    and what TIMING TRUE costs on each.

    Takes a few minutes with the default scales and 5 arms on 2 cores.
    """
    from profkit.experiments.timing_accuracy import DEFAULT_ARMS, analyze_run, run_timing_accuracy

    if report_dir is not None:
        _print(analyze_run(report_dir, baseline=baseline, tol_pct=tol,
                           min_node_ms=min_node_ms, reference=reference))
        return
    per = {"nested_loop": nl_scale, "join_sum": js_scale, "count_star": cs_scale}
    names = [w.strip() for w in workloads.split(",") if w.strip()]
    unknown = [w for w in names if w not in per]
    if unknown:
        raise click.UsageError(f"unknown workload(s) {', '.join(unknown)}; known: "
                               f"{', '.join(per)}")
    nice_v: int | None | str
    if nice in ("auto", "none"):
        nice_v = None if nice == "none" else "auto"
    else:
        try:
            nice_v = int(nice)
        except ValueError:
            raise click.BadParameter(f"{nice!r}: give -20..19, 'none' or 'auto'",
                                     param_hint="--nice") from None
    res = run_timing_accuracy(list(arms) or list(DEFAULT_ARMS), {w: per[w] for w in names},
                              reps=reps, warmup=warmup, baseline=baseline,
                              build_missing=build_missing, out_dir=out, seed=seed,
                              clock_cost=not no_clock_cost, nice=nice_v, tol_pct=tol,
                              min_node_ms=min_node_ms, progress=_say,
                              backends=backends if backends == "auto" else _int(backends),
                              calibrate=not no_calibration, min_kept=min_kept)
    if reference != "tsc_clock":
        res = analyze_run(res.run_dir, baseline=baseline, tol_pct=tol,
                          min_node_ms=min_node_ms, reference=reference)
    _print(res)
