"""How fast the command line starts: ``profkit --version``, ``--help`` and a completion
request, median of N runs each, for this tree and for a git ref (default ``main``).

Each run is ``python -m profkit ...`` in a fresh interpreter, from an empty folder, with
``PYTHONPATH`` pointing at the tree under test (a ``git archive`` of the ref, so its own
modules are imported, not this tree's). Measures per run: wall time, CPU time (user +
system of the child: less sensitive than wall time to other work on the machine), and
how many modules the command imported (counted in a separate run: deterministic); with
``--callgrind``, the instructions each command executes (valgrind's callgrind, one run:
the figure that holds on a busy machine). Both trees are byte-compiled first, as pip
does when it installs a wheel (with PYTHONDONTWRITEBYTECODE set, an uncompiled tree
would be compiled again on every run). The runs of the two trees are interleaved, so a
change in the machine's load hits both.

Usage::

    .venv/bin/python benchmarks/bench_cli_startup.py            # this tree vs main, 15 runs
    .venv/bin/python benchmarks/bench_cli_startup.py --ref HEAD~3 --runs 30
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: what is timed: (label, argv after `python -m profkit`, extra environment)
CASES: list[tuple[str, list[str], dict[str, str]]] = [
    ("--version", ["--version"], {}),
    ("--help", ["--help"], {}),
    ("completion 'profkit clo<TAB>'", [], {"_PROFKIT_COMPLETE": "bash_complete",
                                           "COMP_WORDS": "profkit clo", "COMP_CWORD": "1"}),
]

#: the goal: each of these starts in less than this (wall, median)
GOAL_S = 0.2


@dataclass
class Samples:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    modules: int = 0


def _export(ref: str, dest: Path) -> Path:
    """The tree of *ref* (``git archive``), with this tree's compiled folding core copied in
    (the ref's own is not built; --version, --help and completion never load it)."""
    tar = dest / "tree.tar"
    with open(tar, "wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref, "profkit"],
                       stdout=f, check=True)
    tree = dest / "tree"
    tree.mkdir()
    with tarfile.open(tar) as tf:
        tf.extractall(tree, filter="data")
    return tree


def _env(tree: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("_PROFKIT_COMPLETE")}
    env.update(extra)
    env["PYTHONPATH"] = str(tree)
    return env


def _compile(python: str, tree: Path) -> None:
    subprocess.run([python, "-m", "compileall", "-q", str(tree / "profkit")], check=True,
                   stdout=subprocess.DEVNULL)


def _instructions(argv: list[str], env: dict[str, str], cwd: Path) -> int:
    """Instructions executed by *argv* (callgrind's total, whole process)."""
    cp = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                         *argv], env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE, text=True, timeout=600)
    for line in cp.stderr.splitlines():
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1])
    raise SystemExit(f"callgrind gave no total: {cp.stderr[-500:]}")


def _one(python: str, tree: Path, argv: list[str], extra: dict[str, str], cwd: Path
         ) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    cp = subprocess.run([python, "-m", "profkit", *argv], env=_env(tree, extra), cwd=cwd,
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cp.returncode != 0:
        raise SystemExit(f"python -m profkit {' '.join(argv)} failed ({cp.returncode}): "
                         f"{cp.stderr.decode(errors='replace')[-800:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _modules(python: str, tree: Path, argv: list[str], extra: dict[str, str], cwd: Path
             ) -> tuple[int, str]:
    """Modules loaded by the command, and where profkit was imported from."""
    code = ("import atexit, os, sys, runpy\n"
            "def _count():\n"
            "    where = sys.modules['profkit'].__file__\n"
            "    os.write(int(os.environ['BENCH_FD']), f'{len(sys.modules)} {where}'.encode())\n"
            "atexit.register(_count)\n"
            f"sys.argv = ['profkit', *{argv!r}]\n"
            "runpy.run_module('profkit', run_name='__main__')\n")
    r, w = os.pipe()
    cp = subprocess.run([python, "-c", code], env={**_env(tree, extra), "BENCH_FD": str(w)},
                        cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        pass_fds=(w,))
    os.close(w)
    text = os.read(r, 4096).decode()
    os.close(r)
    if cp.returncode != 0 or not text:
        return -1, "?"
    n, _, where = text.partition(" ")
    return int(n), where


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="main", help="git ref to compare with (default main)")
    ap.add_argument("--runs", type=int, default=15, help="runs per command and tree")
    ap.add_argument("--python", default=sys.executable, help="interpreter (default: this one)")
    ap.add_argument("--callgrind", action="store_true",
                    help="also count instructions under valgrind (slow: ~20 s per command)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        t = Path(tmp)
        (t / "empty").mkdir()
        (t / "ref").mkdir()
        trees = {args.ref: _export(args.ref, t / "ref"), "this tree": ROOT}
        for tree in trees.values():
            _compile(args.python, tree)
        instr: dict[tuple[str, str], int] = {}
        results: dict[tuple[str, str], Samples] = {}
        for label, argv, extra in CASES:
            for name, tree in trees.items():
                s = results.setdefault((name, label), Samples())
                s.modules, where = _modules(args.python, tree, argv, extra, t / "empty")
                if not where.startswith(str(tree)):
                    raise SystemExit(f"{name}: profkit was imported from {where}, not {tree}")
                _one(args.python, tree, argv, extra, t / "empty")      # warm the page cache
                if args.callgrind:
                    instr[(name, label)] = _instructions(
                        [args.python, "-m", "profkit", *argv], _env(tree, extra), t / "empty")
        for _ in range(args.runs):
            for label, argv, extra in CASES:
                for name, tree in trees.items():
                    wall, cpu = _one(args.python, tree, argv, extra, t / "empty")
                    results[(name, label)].wall.append(wall)
                    results[(name, label)].cpu.append(cpu)
        floor_instr = (_instructions([args.python, "-c", "pass"], dict(os.environ), t / "empty")
                       if args.callgrind else None)
        floor = Samples()        # the interpreter alone: what no change to profkit removes
        for _ in range(args.runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run([args.python, "-c", "pass"], check=True)
            floor.wall.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            floor.cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)

    print(f"python -m profkit, median of {args.runs} runs each (interleaved), from an empty "
          f"folder; load average {os.getloadavg()[0]:.1f} (times taken under load: wall "
          "includes waiting for a CPU)")
    print(f"{'command':34s} {'tree':12s} {'wall s':>7s} {'CPU s':>7s} {'modules':>8s} "
          f"{'instructions':>14s}  goal (< {GOAL_S:g} s wall)")
    for label, _argv, _extra in CASES:
        for name in trees:
            s = results[(name, label)]
            wall, cpu = statistics.median(s.wall), statistics.median(s.cpu)
            goal = ("met" if wall < GOAL_S else "missed") if name == "this tree" else ""
            n = f"{instr[(name, label)]:,}" if (name, label) in instr else "-"
            print(f"{label:34s} {name:12s} {wall:7.3f} {cpu:7.3f} {s.modules:8d} {n:>14s}  "
                  f"{goal}")
    print(f"{'python -c pass (the floor)':34s} {'':12s} {statistics.median(floor.wall):7.3f} "
          f"{statistics.median(floor.cpu):7.3f} {'':8s} "
          f"{f'{floor_instr:,}' if floor_instr else '-':>14s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
