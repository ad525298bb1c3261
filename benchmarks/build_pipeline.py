#!/usr/bin/env python3
"""What overlapping a list of builds saves: `profkit build A B C ...` of two checkouts,
one that makes each build whole before the next (the one before get_builds) and one
that copies, patches and configures the next build while this one compiles, and runs
this one's make install while the next compiles (profkit.pg.build.get_builds).

    .venv/bin/python benchmarks/build_pipeline.py --before /path/to/older/checkout \\
        [--builds vanilla,step1,step2,step3] [--rounds 2] [--ccache warm|empty]

Each (checkout, round) runs `profkit build LIST` in a child, with PROFKIT_CACHE in a
scratch folder (``profkit.paths.empty_cache``: the source download and apt lists are the
machine's, symlinked) and either the machine's ccache (``warm``: every object a hit,
the case of a second clone, so the single-threaded steps weigh most) or an empty one
(``empty``: a fresh machine).  The two checkouts alternate which goes first.  Prints per
run: the wall time of the whole list, the CPU time (user + system) of the child, the sum
of the builds' own wall times (copy, configure, make, install), and how long each
build's configure ended before the previous build's compile did (> 0: overlapped).
Take it with the machine otherwise idle.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from profkit import paths

HERE = Path(__file__).resolve().parent.parent


def run_list(checkout: Path, names: list[str], ccache: str) -> dict:
    cache = paths.empty_cache("build-pipeline-")
    cc = cache / "ccache" if ccache == "empty" else paths.cache_dir() / "ccache"
    env = {**os.environ, "PROFKIT_CACHE": str(cache), "CCACHE_DIR": str(cc),
           "PYTHONPATH": str(checkout)}
    try:
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        cp = subprocess.run([sys.executable, "-m", "profkit.cli", "build", *names], cwd=checkout,
                            env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        wall = time.monotonic() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cp.returncode != 0:
            sys.exit(f"{checkout}: profkit build failed:\n{cp.stdout[-2000:]}{cp.stderr[-2000:]}")
        timings = {}
        for d in (cache / "builds").iterdir():
            if (d / "COMPLETE").exists():
                b = json.loads((d / "build.json").read_text())
                timings[b["name"]] = b["timings"]
        own = sum(t["prepare_s"] + t["configure_s"] + t["make_s"] + t["install_s"]
                  for t in timings.values())
        overlap = []
        for prev, nxt in zip(names, names[1:], strict=False):
            tp, tn = timings[prev], timings[nxt]
            if "make_ended_at" in tp and "configured_at" in tn:
                overlap.append(tp["make_ended_at"] - tn["configured_at"])
        misses = sum(t["ccache"]["cache_miss"] for t in timings.values())
        return {"wall_s": wall, "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
                "own_s": own, "overlap_s": overlap, "misses": misses}
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True,
                    help="a checkout of profkit before get_builds (e.g. ff46e4f)")
    ap.add_argument("--after", type=Path, default=HERE, help="default: this checkout")
    ap.add_argument("--builds", default="vanilla,step1,step2,step3")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ccache", choices=("warm", "empty"), default="warm")
    a = ap.parse_args()
    names = a.builds.split(",")
    arms = {"before": a.before.resolve(), "after": a.after.resolve()}
    print(f"# {' '.join(sys.argv)}; {time.strftime('%Y-%m-%d %H:%M %Z')}; "
          f"{os.cpu_count()} CPUs; ccache {a.ccache}; builds {', '.join(names)}")
    res: dict[str, list[dict]] = {k: [] for k in arms}
    for r in range(a.rounds):
        order = list(arms) if r % 2 == 0 else list(arms)[::-1]
        for arm in order:
            m = run_list(arms[arm], names, a.ccache)
            res[arm].append(m)
            ov = ", ".join(f"{x:+.0f}" for x in m["overlap_s"])
            print(f"round {r + 1} {arm:6s}: wall {m['wall_s']:6.1f} s, CPU {m['cpu_s']:6.1f} s, "
                  f"builds' own {m['own_s']:6.1f} s, ccache misses {m['misses']}; "
                  f"configure ended before the previous compile did by [{ov}] s", flush=True)
    b = sorted(x["wall_s"] for x in res["before"])
    f = sorted(x["wall_s"] for x in res["after"])
    mb, mf = b[len(b) // 2], f[len(f) // 2]
    print(f"median wall: before {mb:.1f} s, after {mf:.1f} s; after/before {mf / mb:.3f} "
          f"(all walls: before {', '.join(f'{x:.1f}' for x in b)}; "
          f"after {', '.join(f'{x:.1f}' for x in f)})")


if __name__ == "__main__":
    main()
