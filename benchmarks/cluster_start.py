#!/usr/bin/env python3
"""How long a throwaway cluster takes to start and stop, three ways, interleaved, on one
build: initdb for each cluster; a copy of the build's initdb template (made once per
build) into a plain folder; the same copy into a folder whose subfolders the filesystem
spreads over its block groups (``paths.spread_subfolders``, what profkit's own clusters
folder has).  Each way has a new folder of its own in the cache, and every cluster is
removed when it stops, as profkit's are.

    .venv/bin/python benchmarks/cluster_start.py [--build vanilla] [--n 20]

Prints each way's median and range of the whole start-connect-stop (s), the system CPU
time of its child processes (the copy or initdb, and postgres), and the ratios.  Take it with the
machine idle.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from profkit import paths
from profkit.pg.build import get_build
from profkit.pg.cluster import Cluster

WAYS = (("initdb", "initdb per cluster"), ("plain", "template copy, plain folder"),
        ("spread", "template copy, spread folder"))


def once(build, from_template: bool, base: Path) -> tuple[float, float]:
    sys0 = resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
    t0 = time.monotonic()
    with Cluster(build, name="bench-start", from_template=from_template,
                 base_dir=base) as cl, cl.connect() as conn:
        conn.execute("SELECT 1")
    return time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime - sys0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="vanilla")
    ap.add_argument("--n", type=int, default=20)
    a = ap.parse_args()
    b = get_build(a.build)
    bases = {}
    for way, _ in WAYS:
        bases[way] = Path(tempfile.mkdtemp(prefix=f"cluster-start-{way}-",
                                           dir=paths.cache_dir()))
        os.chmod(bases[way], 0o755)
    try:
        spread = paths.spread_subfolders(bases["spread"])
        print(f"the spread folder has the flag: {spread}; the plain one: "
              f"{paths.topdir_flag(bases['plain'])}")
        once(b, True, bases["plain"])  # the template exists from here on
        times: dict[str, list[tuple[float, float]]] = {w: [] for w, _ in WAYS}
        for i in range(a.n):
            order = WAYS if i % 2 == 0 else WAYS[::-1]
            for way, _ in order:
                times[way].append(once(b, way != "initdb", bases[way]))
        med = {}
        for way, label in WAYS:
            wall = [t for t, _ in times[way]]
            sys_s = [s for _, s in times[way]]
            med[way] = statistics.median(wall)
            print(f"{label:30s} median {med[way]:.3f} s  (min {min(wall):.3f}, max "
                  f"{max(wall):.3f}; n={len(wall)}); children's system CPU median "
                  f"{statistics.median(sys_s):.3f} s")
        print(f"ratio (template copy, plain folder / initdb): {med['plain'] / med['initdb']:.2f}")
        print(f"ratio (spread folder / plain folder): {med['spread'] / med['plain']:.2f}")
    finally:
        for base in bases.values():
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
