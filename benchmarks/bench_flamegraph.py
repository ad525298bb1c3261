"""Flamegraph rendering at scale: a very deep stack and a million distinct stacks.

Each case is rendered by ``profkit flamegraph FILE -o OUT.svg`` in its own process (wall
time including start-up and reading the folded file; peak RSS from ``/usr/bin/time``),
and, as the peer measured in the same run, by the renderer profkit had before its
rewrite for big and deep profiles
(``git show BEFORE:profkit/render/flamegraph.py``: a stack tree with one path tuple per
frame), on the same file:

1. **deep**: one stack of ``--depth`` frames (20,000: FlameGraph users' recursion case)
   plus a short one; memory must be linear in the frames (< 300 MB);
2. **wide**: ``--stacks`` distinct stacks (1,000,000), PostgreSQL-like names, depth 6-24,
   weights from a long-tailed distribution; must render in well under a minute, and the
   SVG stays light in a browser because frames narrower than ``--minwidth`` px are merged
   (flamegraph.pl's --minwidth). With ``--chromium`` the SVG is also opened in headless
   Chromium (a screenshot) and that time printed.

Usage::

    .venv/bin/python benchmarks/bench_flamegraph.py                  # both cases, with peer
    .venv/bin/python benchmarks/bench_flamegraph.py --no-peer --chromium
"""
from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "1559350"          # the last commit before the rewritten renderer

NAMES = ("ExecProcNodeInstr ExecNestLoop ExecHashJoin ExecAgg ExecSort ExecMaterial "
         "ExecSeqScan ExecIndexScan ExecInterpExpr fetch_input_tuple tuplestore_gettupleslot "
         "heap_getnextslot heapgettup_pagemode InstrStartNode InstrStopNode clock_gettime "
         "__vdso_clock_gettime hash_search LWLockAcquire palloc pfree MemoryContextReset "
         "slot_deform_heap_tuple ExecScan ExecStoreBufferHeapTuple ReadBuffer_common "
         "standard_ExecutorRun PortalRun exec_simple_query PostgresMain").split()


def _time_child(argv: list[str], timeout: float) -> tuple[float, float, str]:
    """(wall s, peak RSS MB, status) of one process."""
    gnu_time = shutil.which("time") or "/usr/bin/time"
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        t0 = time.perf_counter()
        try:
            cp = subprocess.run([gnu_time, "-f", "%M", "-o", tf.name, *argv],
                                capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return time.perf_counter() - t0, float("nan"), f"killed after {timeout:.0f} s"
        wall = time.perf_counter() - t0
        m = re.findall(r"^(\d+)$", Path(tf.name).read_text(), re.M)
        rss = int(m[-1]) / 1024 if m else float("nan")
    status = "ok" if cp.returncode == 0 else f"failed ({cp.returncode}): " \
        f"{cp.stderr.decode(errors='replace').strip().splitlines()[-1:]}"
    return wall, rss, status


def _deep(path: Path, depth: int) -> None:
    with open(path, "w") as f:
        f.write(";".join(f"frame_{i}" for i in range(depth)) + " 7\n")
        f.write("frame_0;frame_1;short 1\n")


def _wide(path: Path, n: int, seed: int) -> None:
    rnd = random.Random(seed)
    seen: set[str] = set()
    with open(path, "w") as f:
        while len(seen) < n:
            d = rnd.randint(6, 24)
            frames = ["postgres", "main", "PostgresMain"] + [
                f"{rnd.choice(NAMES)}" + (f"_{rnd.randint(0, 40)}" if rnd.random() < 0.5 else "")
                for _ in range(d - 3)]
            s = ";".join(frames)
            if s in seen:
                continue
            seen.add(s)
            f.write(f"{s} {max(1, int(rnd.paretovariate(1.2)))}\n")


def _peer_module(tmp: Path) -> Path | None:
    try:
        src = subprocess.run(["git", "-C", str(ROOT), "show",
                              f"{BEFORE}:profkit/render/flamegraph.py"],
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    (tmp / "flamegraph_before.py").write_bytes(src)
    return tmp


def _frames_in(svg: Path) -> tuple[int, int]:
    text = svg.read_text(encoding="utf-8", errors="replace")
    return text.count("<g class="), sum(int(m) for m in re.findall(r'data-m="(\d+)"', text))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depth", type=int, default=20_000)
    ap.add_argument("--stacks", type=int, default=1_000_000)
    ap.add_argument("--minwidth", type=float, default=0.1)
    ap.add_argument("--no-peer", action="store_true", help="skip the before-issue-12 renderer")
    ap.add_argument("--peer-timeout", type=float, default=600)
    ap.add_argument("--chromium", action="store_true", help="time a headless screenshot")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=12)
    args = ap.parse_args()

    profkit = Path(sys.executable).parent / "profkit"
    with tempfile.TemporaryDirectory(prefix="bench-flamegraph-") as tmpd:
        tmp = Path(tmpd)
        work = args.workdir or tmp
        work.mkdir(parents=True, exist_ok=True)
        peer_dir = None if args.no_peer else _peer_module(tmp)
        deep, wide = work / "deep.folded", work / "wide.folded"
        t = time.perf_counter()
        _deep(deep, args.depth)
        _wide(wide, args.stacks, args.seed)
        print(f"inputs: deep {deep.stat().st_size / 1e3:.0f} KB ({args.depth:,} frames), "
              f"wide {wide.stat().st_size / 1e6:.1f} MB ({args.stacks:,} distinct stacks), "
              f"made in {time.perf_counter() - t:.1f} s")
        print(f"{'case':6s} {'renderer':26s} {'wall s':>8s} {'peak RSS MB':>12s} "
              f"{'SVG MB':>7s} {'boxes':>9s} {'merged':>9s}  status")
        for case, src in (("deep", deep), ("wide", wide)):
            runs = [("profkit (this branch)",
                     [str(profkit), "flamegraph", str(src), "--minwidth", str(args.minwidth),
                      "-o", str(work / f"{case}.svg")], work / f"{case}.svg")]
            if peer_dir is not None:
                code = ("import sys; sys.path.insert(0, sys.argv[1]); import flamegraph_before "
                        "as fg; from profkit.parse.folded import read_folded; "
                        "open(sys.argv[3], 'w').write(fg.render(read_folded(sys.argv[2]), "
                        f"min_width_px={args.minwidth}))")
                runs.append((f"before the rewrite ({BEFORE})",
                             [sys.executable, "-c", code, str(peer_dir), str(src),
                              str(work / f"{case}-before.svg")], work / f"{case}-before.svg"))
            results = {}
            for label, argv, out in runs:
                out.unlink(missing_ok=True)
                wall, rss, status = _time_child(argv, args.peer_timeout)
                results[label] = (wall, rss)
                size = out.stat().st_size / 1e6 if out.exists() else float("nan")
                boxes, merged = _frames_in(out) if out.exists() else (0, 0)
                print(f"{case:6s} {label:26s} {wall:8.2f} {rss:12.1f} {size:7.1f} {boxes:9,d} "
                      f"{merged:9,d}  {status}")
            if len(results) == 2:
                (w1, r1), (w2, r2) = results.values()
                print(f"{case:6s} ratio (before / this)       {w2 / w1:8.1f}x {r2 / r1:11.1f}x")
            if args.chromium and shutil.which("chromium"):
                png = work / f"{case}.png"
                # a profile and a TMPDIR of its own under the work folder: without a
                # profile, Debian's chromium wrapper makes ~/.config/chromium-headless
                chrome = work / f"chromium-{case}"
                (chrome / "tmp").mkdir(parents=True, exist_ok=True)
                t0 = time.perf_counter()
                subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                                f"--user-data-dir={chrome / 'profile'}",
                                "--window-size=1220,900", f"--screenshot={png}",
                                (work / f"{case}.svg").resolve().as_uri()],
                               capture_output=True, timeout=600,
                               env={**os.environ, "TMPDIR": str(chrome / "tmp")})
                print(f"{case:6s} headless Chromium screenshot of the SVG: "
                      f"{time.perf_counter() - t0:.1f} s ({png})")
        if args.workdir:
            print(f"files kept in {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
