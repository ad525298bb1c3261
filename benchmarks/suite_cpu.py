"""Where `make test`'s CPU goes: CPU seconds per test module, every process counted.

The shared phase keeps both cores busy (/proc/stat showed no idle time in it), so its
wall time falls only with the CPU work its tests do; a test's wall time says little about
that (a test waiting for a cluster beside a callgrind session is slow, not costly).  The
CPU of a test is mostly not in the pytest process: postgres servers (daemonized by pg_ctl,
so no longer its children), valgrind, compilers, `profkit` subprocesses.  This script runs
a phase of the suite with every pytest process (each xdist worker) in a cpuacct cgroup of
its own, which everything it starts inherits whatever its parent becomes, and books the
cgroup's CPU to the test that ran (setup, call and teardown; a module's fixtures land on
its first test).

Usage (root: cgroup v1 cpuacct, as on this VM)::

    .venv/bin/python benchmarks/suite_cpu.py [--phase shared|alone] [--out FILE] [-- pytest args]

prints the CPU seconds per module, its share, and the wall seconds, and writes one JSON
line per test to FILE.  Imported by pytest (``-p suite_cpu``) it is the plugin that
measures.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_OUT_ENV = "SUITE_CPU_OUT"
_GROUP: Path | None = None


def _usage_s(group: Path) -> float:
    return int((group / "cpuacct.usage").read_text()) / 1e9


# --------------------------------------------------------------------------- the plugin


def pytest_configure(config) -> None:
    global _GROUP
    if not os.environ.get(_OUT_ENV):
        return
    if os.environ.get("PYTEST_XDIST_WORKER") is None and config.getoption("numprocesses",
                                                                          None):
        return  # the xdist controller runs no test
    _GROUP = CPUACCT / f"profkit-suite-cpu-{os.getpid()}"
    _GROUP.mkdir(exist_ok=True)
    (_GROUP / "cgroup.procs").write_text(str(os.getpid()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _GROUP is None:
        yield
        return
    c0, t0 = _usage_s(_GROUP), time.monotonic()
    yield
    rec = {"nodeid": item.nodeid, "module": item.nodeid.split("::", 1)[0],
           "cpu_s": round(_usage_s(_GROUP) - c0, 3), "wall_s": round(time.monotonic() - t0, 3),
           "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
    with open(os.environ[_OUT_ENV], "a") as f:
        f.write(json.dumps(rec) + "\n")


def pytest_unconfigure(config) -> None:
    if _GROUP is None:
        return
    total = _usage_s(_GROUP)
    (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
    left = (_GROUP / "cgroup.procs").read_text().split()
    with open(os.environ[_OUT_ENV], "a") as f:
        f.write(json.dumps({"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                            "total_cpu_s": round(total, 3), "left_running": left}) + "\n")
    if not left:
        _GROUP.rmdir()


# --------------------------------------------------------------------------- the script


def report(lines: list[dict], wall: float) -> str:
    tests = [r for r in lines if "nodeid" in r]
    totals = [r for r in lines if "total_cpu_s" in r]
    cpu, wall_m, n = defaultdict(float), defaultdict(float), defaultdict(int)
    for r in tests:
        cpu[r["module"]] += r["cpu_s"]
        wall_m[r["module"]] += r["wall_s"]
        n[r["module"]] += 1
    in_tests = sum(cpu.values())
    whole = sum(r["total_cpu_s"] for r in totals)
    out = [f"phase wall {wall:.0f} s; CPU of the pytest processes and all they started: "
           f"{whole:.0f} s ({whole / wall:.2f} cores), of which in tests {in_tests:.0f} s "
           f"(the rest: collection, build checks, the background builder)",
           "", "| module | tests | CPU s | share | wall s (sum) |", "|---|---|---|---|---|"]
    for m in sorted(cpu, key=cpu.get, reverse=True):
        out.append(f"| {m} | {n[m]} | {cpu[m]:.1f} | {100 * cpu[m] / in_tests:.1f} % | "
                   f"{wall_m[m]:.1f} |")
    out += ["", "the 15 costliest tests (CPU s, wall s):"]
    for r in sorted(tests, key=lambda r: r["cpu_s"], reverse=True)[:15]:
        out.append(f"  {r['cpu_s']:7.1f} {r['wall_s']:7.1f}  {r['nodeid']}")
    left = [p for r in totals for p in r["left_running"]]
    out.append(f"processes left in the cgroups at the end: {left or 'none'}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=("shared", "alone"), default="shared")
    ap.add_argument("--out", default="/tmp/suite_cpu.jsonl")
    ap.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    ap.add_argument("pytest_args", nargs="*")
    a = ap.parse_args(argv)
    if not (CPUACCT / "cgroup.procs").exists() or os.geteuid() != 0:
        print(f"needs root and cgroup v1's cpuacct at {CPUACCT}", file=sys.stderr)
        return 2
    Path(a.out).unlink(missing_ok=True)
    args = [a.python, "-m", "pytest", "-p", "suite_cpu", "--phase", a.phase]
    if a.phase == "shared":
        args += ["-n", str(os.cpu_count() or 2), "--dist", "loadfile",
                 "--no-loadscope-reorder"]
    env = {**os.environ, _OUT_ENV: a.out,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"),
                                                       os.environ.get("PYTHONPATH")]))}
    t0 = time.monotonic()
    rc = subprocess.run([*args, *a.pytest_args], cwd=ROOT, env=env).returncode
    wall = time.monotonic() - t0
    lines = [json.loads(ln) for ln in Path(a.out).read_text().splitlines() if ln.strip()]
    print(report(lines, wall))
    print(f"pytest exit {rc}; per test: {a.out}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
