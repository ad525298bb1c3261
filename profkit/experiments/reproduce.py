"""``profkit reproduce``: the seed's benchmark again, then beyond it.

Builds the variants (cached after the first time), runs nested_loop's Query-1/2/3
interleaved across them with instruction counts (:func:`profkit.experiments.bench.run_bench`),
writes the report, and draws the Query-2 flamegraphs
(:func:`profkit.experiments.profile.demo_flamegraphs`). The command shows each stage as
it starts (*stage*) and the benchmark's result as soon as it is written (*on_result*);
its defaults (builds, scale, repetitions) are the command's, in :mod:`profkit.cli.bench`.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profkit.errors import ProfkitError
from profkit.experiments.bench import BenchError, check_request, run_bench, write_report
from profkit.experiments.profile import demo_flamegraphs
from profkit.pg.build import get_builds

Say = Callable[[str], None]


@dataclass
class Reproduction:
    """What ``profkit reproduce`` made: the benchmark, its report files, the flamegraphs,
    and the wall time of each stage (seconds)."""

    result: Any  # experiments.bench.BenchResult
    files: Any  # experiments.bench.ReportFiles
    flamegraphs: list[Path] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def add_builds(builds: str, more: str) -> str:
    """*builds* and those of *more* not in it yet (comma-separated lists)."""
    have = builds.split(",")
    return ",".join([*(b for b in have if b.strip()),
                     *(b for b in more.split(",") if b not in have)])


def report_after_failure(e: ProfkitError, say: Say) -> None:
    """A benchmark that stopped half-way still gets its report from the rows it kept."""
    if isinstance(e, BenchError) and e.run_dir is not None and e.rows > 0:
        try:
            files = write_report(e.run_dir)
            say(f"report of the {e.rows} rows measured before the failure: {files.report_md}")
        except (ProfkitError, OSError) as e2:
            say(f"no report from the partial run ({e2})")


def reproduce(builds: str, *, scale: float, reps: int, instr_scale: float,
              warmup: int = 1, callgrind: bool = True,
              flamegraphs: bool = True, order_seed: int | None = None,
              out: Path | None = None, stage: Say | None = None, progress: Say | None = None,
              on_result: Callable[[Any, Any], None] | None = None) -> Reproduction:
    """Build *builds*, benchmark them (nested_loop at *scale*, *reps* interleaved
    repetitions), write the report, draw the flamegraphs. *stage* is told each stage's
    title as it starts, *on_result* gets (result, report files) as soon as they exist."""
    say = progress or (lambda _m: None)
    begin = stage or (lambda _m: None)
    t_all = time.monotonic()
    req = check_request(builds, "nested_loop", scale, reps, warmup=warmup)
    seconds: dict[str, float] = {}

    begin("builds")
    t0 = time.monotonic()
    say(f"builds {', '.join(ref.preset for ref in req.refs)} (cached after the first time; "
        "each one's configure runs while the one before it compiles)")
    labels = iter(ref.label for ref in req.refs)
    get_builds([ref.preset for ref in req.refs], progress=say,
               on_built=lambda b: say(f"{next(labels)}: {b.version}, "
                                      f"{', '.join(p['name'] for p in b.patches) or 'no patches'}"
                                      f" ({b.key[:12]})"))
    seconds["builds"] = time.monotonic() - t0

    begin(f"benchmark: nested_loop at scale {scale}, {reps} repetitions")
    t0 = time.monotonic()
    try:
        res = run_bench(req, root=out, progress=True,
                        instructions="auto" if callgrind else "none",
                        instr_scale=instr_scale, order_seed=order_seed,
                        command_line=["profkit", *sys.argv[1:]])
    except ProfkitError as e:
        report_after_failure(e, say)
        raise
    seconds["benchmark"] = time.monotonic() - t0
    files = write_report(res)
    if on_result is not None:
        on_result(res, files)

    svgs: list[Path] = []
    seconds["flamegraphs"] = 0.0
    if flamegraphs:
        begin("flamegraphs")
        t0 = time.monotonic()
        # Query-2 on vanilla, on step3, and the vanilla→step3 differential, in flamegraphs/
        # the differential's run (its recordings) goes with the benchmark's, under *out*
        svgs = demo_flamegraphs(profiles=out, progress=say)
        seconds["flamegraphs"] = time.monotonic() - t0
    seconds["total"] = time.monotonic() - t_all
    return Reproduction(res, files, svgs, seconds)
