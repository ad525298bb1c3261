"""Which programs a command's CPU goes to: every task that exits while it runs, booked
by its name (comm), from the kernel's own accounting.

    python3 benchmarks/cpu_by_program.py [--top N] -- make test      (root: bpftrace)
    python3 benchmarks/cpu_by_program.py --parse FILE                (bpftrace's output)

One bpftrace probe on the ``sched:sched_process_exit`` tracepoint adds each exiting
task's user + system time (``utime``, ``stime``: nanoseconds) to its name; threads exit
one by one and count under their own names.  Only tasks started after the probe attached
count (a kernel worker that ran for hours and exits meanwhile would book all its hours);
a task still running when the command ends is not counted (`make test` leaves none).
Unlike ``benchmarks/suite_cpu.py``, which books CPU to the test that spent it, this says
which program spent it: valgrind, postgres, the compilers, Python.  Prints CPU seconds,
share and task count per name, with the total beside the command's wall time.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAM = """BEGIN { @t0 = nsecs; }
tracepoint:sched:sched_process_exit /curtask->start_time >= @t0/ {
  @cpu_ms[comm] = sum((curtask->utime + curtask->stime) / 1000000);
  @n[comm] = count();
}
"""


def parse(text: str) -> dict[str, tuple[float, int]]:
    """bpftrace's maps at exit -> {name: (CPU seconds, tasks)}."""
    cpu = {m[1]: int(m[2]) / 1000 for m in re.finditer(r"^@cpu_ms\[(.*)\]: (\d+)$", text, re.M)}
    n = {m[1]: int(m[2]) for m in re.finditer(r"^@n\[(.*)\]: (\d+)$", text, re.M)}
    if not cpu:
        raise SystemExit("no @cpu_ms map in the bpftrace output: did the probe attach?")
    return {k: (v, n.get(k, 0)) for k, v in cpu.items()}


def table(rows: dict[str, tuple[float, int]], top: int) -> str:
    total = sum(v for v, _ in rows.values())
    out = ["| program (comm) | CPU s | share | tasks |", "|---|---|---|---|"]
    ranked = sorted(rows.items(), key=lambda kv: -kv[1][0])
    for name, (secs, tasks) in ranked[:top]:
        out.append(f"| {name} | {secs:.1f} | {secs / total * 100:.1f} % | {tasks} |")
    rest = ranked[top:]
    if rest:
        out.append(f"| ({len(rest)} others) | {sum(v for _, (v, _) in rest):.1f} | "
                   f"{sum(v for _, (v, _) in rest) / total * 100:.1f} % | "
                   f"{sum(t for _, (_, t) in rest)} |")
    out.append(f"total CPU {total:.0f} s")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parse", type=Path, help="read an earlier bpftrace output instead")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.parse:
        print(table(parse(args.parse.read_text()), args.top))
        return 0
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give a command after --, or --parse FILE")
    bpftrace = shutil.which("bpftrace")
    if bpftrace is None or os.geteuid() != 0:
        raise SystemExit("needs root and bpftrace (scripts/setup-system.sh installs it)")
    work = Path(tempfile.mkdtemp(prefix="profkit-cpu-by-program-"))
    try:
        (work / "exit.bt").write_text(PROGRAM)
        out = open(work / "bpftrace.out", "w")
        probe = subprocess.Popen([bpftrace, str(work / "exit.bt")], stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while "Attaching" not in (work / "bpftrace.out").read_text():
                if probe.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("bpftrace did not attach:\n"
                                     + (work / "bpftrace.out").read_text()[-2000:])
                time.sleep(0.1)
            t0 = time.monotonic()
            rc = subprocess.run(cmd).returncode
            wall = time.monotonic() - t0
        finally:
            probe.send_signal(signal.SIGINT)  # prints its maps and exits
            try:
                probe.wait(60)
            except subprocess.TimeoutExpired:
                probe.kill()
                probe.wait()
            out.close()
        print(f"command: {' '.join(cmd)}: exit {rc}, wall {wall:.0f} s")
        print(table(parse((work / "bpftrace.out").read_text()), args.top))
        return rc
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
