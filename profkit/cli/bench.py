"""CLI: ``profkit bench`` (any builds, any workload) and ``profkit reproduce`` (the demo).

Registered in :data:`profkit.cli.COMMANDS`. Library errors (ProfkitError) become one line on stderr and
exit status 2; Ctrl-C stops everything profkit started (exit 130).
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import click

from profkit.errors import ProfkitError
from profkit.cli.common import friendly as _friendly
from profkit.cli.common import emit_json, err_console, json_option, min_kept_option
from profkit.cli.common import say as _say


@functools.cache
def _out_console() -> Any:
    """rich's Console on stdout (imported here: the command line starts without rich)."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        # piped or in CI: the seed-style table is wider than rich's default 80 columns
        console = Console(width=150)
    return console

#: ``profkit reproduce`` defaults.  The instruction counts (callgrind, deterministic) carry
#: the ordering of the builds; CPU time on this kind of 2-core VM moves by more than the
#: differences between the patched builds' plain queries (bimodal vCPU speed, code layout),
#: so the benchmark is sized to show the large effects (TIMING on vs off vs plain) and
#: the report says what the time can resolve, not to chase 1 % differences.  At scale
#: 0.05 Query-1 takes ~0.26 s of backend CPU on vanilla and Query-3 ~3.9x that: one
#: repetition of 6 builds x 3 modes is ~9 s, 10 repetitions ~1.5 min (estimated from the
#: earlier measurement of 0.36 s at scale 0.07).  step4 and step5 go beyond the seed's
#: article.
REPRO_BUILDS = "vanilla,step1,step2,step3,step4,step5"
#: What ``profkit reproduce --pg19`` adds: PostgreSQL 19 rows, each measured against
#: pg19/vanilla's plain query (summary.csv's ref_build). Its source:
#: $PROFKIT_PG19_SOURCE, else debian:postgresql-19 (profkit.pg.source).
REPRO_PG19_BUILDS = "pg19/vanilla,pg19/step3,pg19/step5"
REPRO_SCALE = 0.05
REPRO_REPS = 10
REPRO_INSTR_SCALE = 0.01


def _report_after_failure(e: ProfkitError) -> None:
    from profkit.experiments.reproduce import report_after_failure

    report_after_failure(e, _say)


def _print_results(files: Any) -> None:
    from profkit.render.bench_report import console_report

    for part in console_report(files.summary, files.comparisons):
        _out_console().print(part, highlight=False)
    for line in getattr(files, "notes", ()):
        _out_console().print(line, highlight=False)
    _out_console().print(f"report: {files.report_md}\nsummary: {files.summary_csv}\n"
                      f"chart: {files.chart_png} (+ .svg)", highlight=False)


def _warn_instructions(prov: dict[str, Any]) -> None:
    if prov.get("instructions_error"):
        err_console.print(f"[yellow]instruction counts failed (the timings are complete): "
                          f"{prov['instructions_error']}[/]", highlight=False)


def _pin(text: str) -> int | str | None:
    if text in ("auto", "none"):
        return None if text == "none" else "auto"
    try:
        return int(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: give auto, none or a CPU number",
                                 param_hint="--pin-cpu") from None


def _mode_list(modes: str) -> list[str]:
    return [m.strip() for m in modes.split(",") if m.strip()]


def _backends(text: str) -> int | str:
    """--backends: 'auto' or a whole number (checked by check_request)."""
    if text.strip() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise click.BadParameter(f"{text!r}: give auto or a whole number >= 1",
                                 param_hint="--backends") from None


@click.command("bench")
@click.option("--builds", default="vanilla", show_default=True,
              metavar="[LABEL=]PRESET[:GUC=V,...],...",
              help="Comma-separated arms: build presets; label=preset runs a preset under "
                   "another name (a=vanilla,b=vanilla: an A/A check of the noise); "
                   ":GUC=V,... gives the arm's cluster its own settings, e.g. "
                   "pg19sys=pg19/vanilla:timing_clock_source=system,"
                   "pg19tsc=pg19/vanilla:timing_clock_source=tsc.")
@click.option("--workload", default="nested_loop", show_default=True,
              help="nested_loop, join_sum, count_star or a workload FILE.toml.")
@click.option("--query", default=None, help="One of the workload file's named queries "
              "(default: its first).")
@click.option("--scale", type=float, default=0.05, show_default=True,
              help="Workload scale (nested_loop: work grows with scale²).")
@click.option("--reps", type=int, default=10, show_default=True,
              help="Repetitions of every (build, mode), interleaved.")
@click.option("--warmup", type=int, default=1, show_default=True,
              help="Unrecorded executions of every (build, mode) first.")
@click.option("--modes", default="plain,analyze_notiming,analyze_timing", show_default=True,
              help="Comma-separated; also analyze_buffers, analyze_timing_buffers.")
@click.option("--set", "sets", multiple=True, metavar="NAME=VALUE",
              help="Server setting for every cluster (repeatable).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Profiles folder (default: ./profiles or $PROFKIT_PROFILES); the run goes "
                   "to OUT/<run_id>/ and OUT/latest points at it.")
@click.option("--instructions", type=click.Choice(["auto", "callgrind", "perf_stat", "none"]),
              default="auto", show_default=True,
              help="Count instructions of one execution per build and mode (auto: perf stat "
                   "where the CPU counts instructions, else callgrind).")
@click.option("--instr-scale", type=float, default=None,
              help="Scale for callgrind (default: the bench scale if it fits the budget, "
                   "else smaller).")
@click.option("--seed", "order_seed", type=int, default=None,
              help="Seed of the interleaving order (default: random, recorded).")
@click.option("--metric", type=click.Choice(["cpu_kept_ms", "cpu_norm_ms", "cpu_ms", "server_ms",
                                            "client_ms"]), default=None,
              help="Time the report's overheads use (default: cpu_kept_ms, the backend's "
                   "on-CPU time without the executions the vCPU calibration found slow, where "
                   "recorded; else cpu_ms; else server_ms).")
@click.option("--pin-cpu", default="auto", show_default=True, metavar="auto|none|N",
              help="CPU the backends (and the vCPU calibration) are pinned to; auto: the "
                   "last one.")
@click.option("--no-calibration", is_flag=True,
              help="Skip the vCPU calibration before and after every execution.")
@min_kept_option("(build, mode)")
@click.option("--backends", default="auto", show_default=True, metavar="auto|K",
              help="Independent backends per build, each on a fresh cluster; the repetitions "
                   "are split between them and the intervals resample backends, then "
                   "repetitions (auto: 1 below 8 repetitions, else one per repetition, at "
                   "most 12).")
@click.option("--layouts", type=int, default=0, show_default=True, metavar="L",
              help="Run every build in L code layouts (the same code linked in other "
                   "function orders, built as BUILD@layout1..L), one backend each: the "
                   "intervals then carry layout effects (0: the build itself).")
@click.option("--aa", is_flag=True,
              help="Add an A/A arm (vanilla again, on clusters of its own): the report states "
                   "the smallest difference the run could detect.")
@click.option("--allow-plan-differences", is_flag=True,
              help="Measure even when the builds chose different plans (every table is "
                   "marked); by default such a run stops and shows the plans.")
@json_option
@_friendly
def bench_cmd(builds: str, workload: str, query: str | None, scale: float, reps: int, warmup: int, modes: str,
              sets: tuple[str, ...], out: Path | None, instructions: str,
              instr_scale: float | None, order_seed: int | None, metric: str | None,
              pin_cpu: str, no_calibration: bool, min_kept: int | str, backends: str, layouts: int,
              aa: bool, allow_plan_differences: bool, as_json: bool) -> None:
    """Benchmark plain vs EXPLAIN ANALYZE on builds, interleaved; report with CIs.

    Example: profkit bench --builds vanilla,step1 --workload nested_loop --scale 0.05 --reps 10
    """
    from profkit.experiments.bench import check_request, run_bench, write_report

    from profkit.pg.workloads import workload_spec

    workload = workload_spec(workload, query)
    req = check_request(builds, workload, scale, reps, _mode_list(modes), warmup, list(sets),
                        backends=_backends(backends), aa=aa,
                        allow_plan_differences=allow_plan_differences, layouts=layouts)
    try:
        res = run_bench(req, root=out, progress=True,
                        instructions=instructions,  # type: ignore[arg-type]
                        instr_scale=instr_scale, order_seed=order_seed,
                        command_line=["profkit", *sys.argv[1:]],
                        pin_cpu=_pin(pin_cpu), calibrate=not no_calibration,
                        min_kept=min_kept)
    except ProfkitError as e:
        _report_after_failure(e)
        raise
    files = write_report(res, metric=metric)
    _warn_instructions(res.provenance)
    if as_json:
        emit_json({"run_dir": str(res.out_dir), "run_id": res.run_id,
                   "report": str(files.report_md), "summary_csv": str(files.summary_csv),
                   "summary": files.summary,
                   "comparisons": files.comparisons if files.comparisons is not None else []})
        return
    _print_results(files)
    _out_console().print(f"run: {res.out_dir} (latest → {res.run_id})", highlight=False)


@click.command("reproduce")
@click.option("--builds", default=REPRO_BUILDS, show_default=True,
              help="Comma-separated builds (presets), built when missing.")
@click.option("--scale", type=float, default=REPRO_SCALE, show_default=True,
              help="nested_loop scale factor.")
@click.option("--reps", type=int, default=REPRO_REPS, show_default=True,
              help="Interleaved repetitions per build and mode.")
@click.option("--warmup", type=int, default=1, show_default=True,
              help="Unrecorded executions before the measured ones.")
@click.option("--instr-scale", type=float, default=REPRO_INSTR_SCALE, show_default=True,
              help="Scale at which callgrind counts one execution per build and mode.")
@click.option("--pg19", is_flag=True,
              help=f"Add the PostgreSQL 19 rows ({REPRO_PG19_BUILDS}); source: "
                   "$PROFKIT_PG19_SOURCE, else debian:postgresql-19 (see the README).")
@click.option("--no-callgrind", is_flag=True, help="Skip the instruction counts.")
@click.option("--no-flamegraphs", is_flag=True, help="Skip the flamegraph demo at the end.")
@click.option("--seed", "order_seed", type=int, default=None,
              help="Order seed (default: random, recorded).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Profiles folder (default: ./profiles).")
@_friendly
def reproduce_cmd(builds: str, scale: float, reps: int, warmup: int, instr_scale: float,
                  pg19: bool, no_callgrind: bool, no_flamegraphs: bool,
                  order_seed: int | None, out: Path | None) -> None:
    """Reproduce explain-analyze-87pct-overhead-cut.txt (vanilla, step1–3) and go beyond
    it (step4, step5); --pg19 adds PostgreSQL 19's vanilla, step3 and step5.

    Builds the variants (cached after the first time), runs nested_loop's Query-1/2/3
    interleaved across builds, counts instructions with callgrind, prints the seed-style
    table beside the seed's figures and every build against vanilla's plain query of the
    same major, and writes report.md, overheads.png/svg and summary.csv under
    profiles/<run>/ (profiles/latest points at it). Defaults: scale 0.05 (Query-1 ≈ 0.26 s
    of CPU on vanilla here), 10 repetitions, callgrind at scale 0.01: the instruction
    counts carry the comparison between builds; the time columns show the large effects
    and say what the time can resolve on this machine.
    """
    from profkit.experiments.reproduce import add_builds, reproduce

    def shown(res: Any, files: Any) -> None:
        _warn_instructions(res.provenance)
        err_console.rule("result")
        _print_results(files)
        _out_console().print(f"run: {res.out_dir} (profiles/latest → {res.run_id})",
                          highlight=False)

    done = reproduce(add_builds(builds, REPRO_PG19_BUILDS) if pg19 else builds, scale=scale, reps=reps,
                     warmup=warmup, instr_scale=instr_scale, callgrind=not no_callgrind,
                     flamegraphs=not no_flamegraphs, order_seed=order_seed, out=out,
                     stage=err_console.rule, progress=_say, on_result=shown)
    if done.flamegraphs:
        _out_console().print("flamegraphs: " + ", ".join(str(p) for p in done.flamegraphs),
                          highlight=False)
    t = done.seconds
    _out_console().print(f"wall time: builds {t['builds']:.0f} s, benchmark + instruction counts "
                      f"{t['benchmark']:.0f} s, flamegraphs {t['flamegraphs']:.0f} s; total "
                      f"{t['total']:.0f} s", highlight=False)
