#!/usr/bin/env python3
"""How long a throwaway cluster takes to start and stop: initdb for each cluster against a
copy of the build's initdb template (made once per build), interleaved, on one build.

    .venv/bin/python benchmarks/cluster_start.py [--build vanilla] [--n 20]

Prints each way's median and range (s) and their ratio.  Take it with the machine idle.
"""
from __future__ import annotations

import argparse
import statistics
import time

from profkit.pg.build import get_build
from profkit.pg.cluster import Cluster


def once(build, from_template: bool) -> float:
    t0 = time.monotonic()
    with Cluster(build, name="bench-start", from_template=from_template) as cl, \
            cl.connect() as conn:
        conn.execute("SELECT 1")
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="vanilla")
    ap.add_argument("--n", type=int, default=20)
    a = ap.parse_args()
    b = get_build(a.build)
    once(b, True)  # the template exists from here on
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(a.n):
        for way in (False, True):
            times[way].append(once(b, way))
    for way, label in ((False, "initdb per cluster"), (True, "template copy")):
        t = times[way]
        print(f"{label:20s} median {statistics.median(t):.3f} s  "
              f"(min {min(t):.3f}, max {max(t):.3f}; n={len(t)})")
    print(f"ratio (template / initdb): "
          f"{statistics.median(times[True]) / statistics.median(times[False]):.2f}")


if __name__ == "__main__":
    main()
