#!/usr/bin/env python3
"""After its CPU idled and another program filled the caches, is the vCPU calibration
slower than just before?  And how many rounds does a median need to tell?

    .venv/bin/python benchmarks/vcpu_idle_gap.py [--repeats 6] [--rounds 101]
                                                 [--quarters 0,2,4,8]

The procedure of tests/test_vcpu.py::test_a_calibration_after_the_caches_were_filled_is_not_slower,
with the calibration helper (profkit/collect/vcpu_calib.c) compiled at several lengths of
its untimed walk (``WARMUP_QUARTERS``: 0 is one unit, 2 half the timed walk, profkit's
default, 4 all of it): this process and the helper pinned to the last CPU; per round a
calibration, 16 MB read and written, 20 ms asleep, a calibration (the ratio after/before),
then two calibrations back to back (the A/A ratio: nothing between them).  Each repeat runs
every variant in a fresh helper, the order reversed every other repeat.

Prints, per variant and repeat, the median ratio over all rounds and over the first 21
(what the test saw before it ran 101), and the A/A median; then per variant the range of
those medians.  The slow-vCPU rule (profkit.analyze.stats) counts a calibration as slow
from 3 % above the run's median, so a gap near 1.03 would reject executions for the gap
alone.  Take it with the machine idle.
"""
from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from profkit.collect import vcpu

DEFINE = re.compile(r"^#define WARMUP_QUARTERS \d+$", re.M)


def variant(src: str, quarters: int, work: Path) -> Path:
    text, n = DEFINE.subn(f"#define WARMUP_QUARTERS {quarters}", src)
    if n != 1:
        raise SystemExit("vcpu_calib.c has no '#define WARMUP_QUARTERS N' line to vary")
    p = work / f"q{quarters}" / "vcpu_calib.c"
    p.parent.mkdir()
    p.write_text(text)
    return p


def gap_round(p: vcpu.VcpuProbe, big: np.ndarray) -> float:
    """One round of the procedure (tests/test_vcpu.py runs it too): a calibration, every
    line of *big* (16 MB) read and written, 20 ms asleep, a calibration; after/before."""
    before = p.calibrate().cpu_ms
    big += 1.0
    time.sleep(0.02)
    return p.calibrate().cpu_ms / before


def one(src: Path, cpu: int, rounds: int, big: np.ndarray) -> tuple[list[float], list[float]]:
    vcpu.HELPER_SRC = src  # compiled once per source hash, as profkit does
    gap: list[float] = []
    aa: list[float] = []
    with vcpu.VcpuProbe(cpu) as p:
        for _ in range(rounds):
            gap.append(gap_round(p, big))
            first = p.calibrate().cpu_ms
            aa.append(p.calibrate().cpu_ms / first)
    return gap, aa


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=101)
    ap.add_argument("--quarters", default="0,2,4,8",
                    help="lengths of the untimed walk to compare, in quarters of the timed one")
    a = ap.parse_args()
    quarters = [int(q) for q in a.quarters.split(",")]
    src = vcpu.HELPER_SRC.read_text()
    cpu = max(os.sched_getaffinity(0))
    keep = os.sched_getaffinity(0)
    big = np.ones(2 * 1024 * 1024)
    medians: dict[int, list[tuple[float, float, float]]] = {q: [] for q in quarters}
    with tempfile.TemporaryDirectory(prefix="vcpu-idle-gap-") as tmp:
        srcs = {q: variant(src, q, Path(tmp)) for q in quarters}
        os.sched_setaffinity(0, {cpu})
        try:
            for r in range(a.repeats):
                for q in (quarters if r % 2 == 0 else quarters[::-1]):
                    gap, aa = one(srcs[q], cpu, a.rounds, big)
                    m = (float(np.median(gap)), float(np.median(gap[:21])), float(np.median(aa)))
                    medians[q].append(m)
                    print(f"repeat {r + 1}  quarters {q}:  median after/before {m[0]:.4f} "
                          f"(first 21: {m[1]:.4f})  A/A {m[2]:.4f}", flush=True)
        finally:
            os.sched_setaffinity(0, keep)
    print(f"\n{a.repeats} repeats of {a.rounds} rounds on CPU {cpu}; "
          "range of the medians (min .. max), mean in brackets:")
    print(f"{'quarters':>8}  {'after/before, all rounds':>26}  {'first 21 rounds':>26}  "
          f"{'A/A':>26}")
    for q in quarters:
        cols = []
        for i in range(3):
            v = [m[i] for m in medians[q]]
            cols.append(f"{min(v):.4f} .. {max(v):.4f} ({np.mean(v):.4f})")
        print(f"{q:>8}  {cols[0]:>26}  {cols[1]:>26}  {cols[2]:>26}")


if __name__ == "__main__":
    main()
