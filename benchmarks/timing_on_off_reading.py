"""How notebook 04 reads "TIMING on costs time": two readings of the same runs.

Notebook 04 runs ``bench.run_bench([vanilla], join_sum, 0.02, 5)`` and derives what one
clock read costs inside the backend from TIMING on minus TIMING off.  Until December 2026
it took the difference of the two modes' medians of ``server_ms``; a fresh clone's
``make test`` once measured −0.04 ms that way (the assertion ``timing > notiming``
failed).  This VM switches between two speeds about as far apart as TIMING on is from
TIMING off, so a median over 5 executions of one mode taken mostly in the slow spell
meets one of the other taken in the fast one.  The notebook now reads the median of the
per-repetition differences (the modes of one repetition run back to back in one backend)
of ``cpu_kept_ms`` (backend CPU, the executions the vCPU calibration caught in a slow
spell left out).

This script runs the notebook's bench N times and prints both readings per run, their
spread over the runs and how many runs each would have failed (difference ≤ 0).

Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/timing_on_off_reading.py --runs 40
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profkit.analyze import correction, stats  # noqa: E402
from profkit.experiments import bench  # noqa: E402


def readings(timings) -> tuple[float, float, int]:
    """(old: difference of server_ms medians, new: median of paired cpu_kept_ms
    differences, repetitions paired) in ms."""
    med = timings.groupby("mode")["server_ms"].median()
    old = float(med["analyze_timing"] - med["analyze_notiming"])
    kept, col = stats.metric_frame(timings, "cpu_kept_ms")
    d = correction.paired_differences(kept, col, "analyze_timing", "analyze_notiming")
    return old, float(d.median()), len(d)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--build", default="vanilla")
    ap.add_argument("--workload", default="join_sum")
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    print(f"# {a.runs} runs of bench.run_bench([{a.build}], {a.workload}, {a.scale}, "
          f"{a.reps}), TIMING on − off in ms")
    print(f"{'run':>4} {'old: server_ms medians':>22} {'new: paired cpu_kept':>21} {'pairs':>5}")
    olds, news = [], []
    # the runs go to a temporary folder, removed at the end: hundreds of them are no
    # user's profiles
    with tempfile.TemporaryDirectory(prefix="timing-on-off-") as tmp:
        for i in range(a.runs):
            r = bench.run_bench([a.build], a.workload, a.scale, a.reps, progress=None,
                                instructions="none", out_dir=Path(tmp) / f"run{i}")
            old, new, n = readings(r.timings)
            olds.append(old)
            news.append(new)
            print(f"{i + 1:>4} {old:>22.3f} {new:>21.3f} {n:>5}", flush=True)
    for name, xs in (("old", olds), ("new", news)):
        q = statistics.quantiles(xs, n=20) if len(xs) >= 2 else [xs[0]] * 19
        print(f"{name}: median {statistics.median(xs):.3f} ms, 5th percentile {q[0]:.3f}, "
              f"min {min(xs):.3f}, max {max(xs):.3f}; runs with a difference <= 0: "
              f"{sum(x <= 0 for x in xs)} of {len(xs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
