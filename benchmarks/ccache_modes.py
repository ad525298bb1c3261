#!/usr/bin/env python3
"""What ccache's depend mode saves a cold build: vanilla into an empty build cache and an
empty ccache, then a variant (step4 by default) on top of that ccache, once with ccache's
default mode (CCACHE_NODEPEND=1) and once with depend mode, profkit's setting (no
preprocessor run on a miss; the key comes from the compiler's own -MMD output, which
PostgreSQL's --enable-depend asks for).

    .venv/bin/python benchmarks/ccache_modes.py [--variant step4] [--rounds 1] [--first default|depend]

Each (mode, build) runs `profkit build` in a child with PROFKIT_CACHE and CCACHE_DIR in a
scratch folder (``profkit.paths.empty_cache``: the source download and apt lists are the
machine's, symlinked).  Rounds alternate which mode goes first.  Prints, per build:
make's wall time, the CPU time (user + system) of the whole child, ccache's misses and
hits, and the ratio depend / default.  Take it with the machine idle (2 cores: a cold
vanilla build takes minutes).
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

# profkit's builds use depend mode (profkit.pg.build.ccache_env) unless CCACHE_NODEPEND is
# set, which gives ccache's default mode (direct mode, then the preprocessor on a miss)
MODES = {"default": {"CCACHE_NODEPEND": "1"}, "depend": {}}


def build(name: str, cache: Path, extra: dict[str, str]) -> dict:
    env = {**os.environ, "PROFKIT_CACHE": str(cache), "CCACHE_DIR": str(cache / "ccache"),
           **extra}
    for k in ("CCACHE_DEPEND", "CCACHE_NODEPEND"):
        if k not in extra:
            env.pop(k, None)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "profkit.cli", "build", name],
                        env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cp.returncode != 0:
        sys.exit(f"build {name} failed:\n{cp.stdout[-2000:]}{cp.stderr[-2000:]}")
    d = next(p for p in (cache / "builds").iterdir()
             if p.name.startswith(name + "-") and (p / "COMPLETE").exists())
    t = json.loads((d / "build.json").read_text())["timings"]
    c = t["ccache"]
    return {"wall_s": wall, "make_s": t["make_s"],
            "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
            "miss": c["cache_miss"],
            "hit": c["direct_cache_hit"] + c["preprocessed_cache_hit"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="step4")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--first", choices=list(MODES), default="default",
                    help="the mode of round 0's first pair (the next round starts with the other)")
    a = ap.parse_args()
    rows: list[tuple[int, str, str, dict]] = []
    for r in range(a.rounds):
        order = list(MODES) if (r % 2 == 0) == (a.first == "default") else list(MODES)[::-1]
        for mode in order:
            cache = paths.empty_cache(f"ccache-{mode}-")
            try:
                for name in ("vanilla", a.variant):
                    res = build(name, cache, MODES[mode])
                    rows.append((r, mode, name, res))
                    print(f"round {r} {mode:8s} {name:10s} make {res['make_s']:6.1f} s  "
                          f"wall {res['wall_s']:6.1f} s  cpu {res['cpu_s']:7.1f} s  "
                          f"misses {res['miss']:5d}  hits {res['hit']:5d}", flush=True)
            finally:
                shutil.rmtree(cache, ignore_errors=True)
    print()
    for name in ("vanilla", a.variant):
        for key in ("make_s", "cpu_s"):
            per = {m: [x[key] for (_r, mm, n, x) in rows if mm == m and n == name]
                   for m in MODES}
            d, b = sum(per["depend"]), sum(per["default"])
            print(f"{name:10s} {key:6s} default {b / len(per['default']):7.1f}  "
                  f"depend {d / len(per['depend']):7.1f}  ratio depend/default {d / b:.3f}")


if __name__ == "__main__":
    main()
