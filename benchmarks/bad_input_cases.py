"""Every known bad-input case (broken files, bad arguments, missing tools: what once gave
a traceback or silent garbage), run again as a user would: a markdown table of
what each does now (exit status, the first line of output, seconds).

Commands run as subprocesses of the installed ``profkit`` next to this interpreter;
library-only parsers (perf stat, callgrind, ltrace, EXPLAIN JSON) run in a fresh
``python -c``. Cases needing a PostgreSQL build (``cluster psql``, ``probe --sql``) run
only with ``--pg`` (they start a cluster of the cached vanilla build).

Usage::

    .venv/bin/python benchmarks/bad_input_cases.py [--pg] > cases.md
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
BIN = Path(sys.executable).parent
PROFKIT = str(BIN / "profkit")


def run(argv: list[str] | str, *, shell: bool = False, timeout: float = 60,
        cwd: Path | None = None, summarize: Any = None) -> tuple[int | str, str, float]:
    t0 = time.perf_counter()
    try:
        cp = subprocess.run(argv, shell=shell, capture_output=True, text=True, timeout=timeout,
                            cwd=cwd, errors="replace")
    except subprocess.TimeoutExpired:
        return "timeout", "", time.perf_counter() - t0
    out = ((cp.stdout.strip() if cp.returncode == 0 and cp.stdout.strip() else "")
           or cp.stderr.strip() or cp.stdout.strip()).splitlines()
    first = out[0] if out else ""
    if summarize is not None and cp.returncode == 0:
        first = summarize(cp.stdout)
    if first.startswith("Usage:"):  # a usage error: its "Error: ..." line says what
        first = next((ln for ln in out if ln.startswith("Error:")), first)
    if "Traceback" in cp.stderr:
        first = "TRACEBACK: " + cp.stderr.strip().splitlines()[-1]
    return cp.returncode, first, time.perf_counter() - t0


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def lib(call: str) -> list[str]:
    """A library call printing 'result: ...' or letting ParseError show as one line."""
    return py("import sys\nfrom profkit.errors import ParseError\ntry:\n"
              f"    r = {call}\n    print('result:', r if not hasattr(r, 'shape') else "
              f"f'{{len(r)}} rows')\nexcept ParseError as e:\n"
              "    print('ParseError:', e, file=sys.stderr); sys.exit(1)\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", action="store_true", help="also the cases that need a cluster")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="profkit-cases-"))
    gp = (FIX / "gprof" / "cycles.gprof.txt").read_text()
    lines = gp.splitlines(True)
    at3 = next(i for i, ln in enumerate(lines) if ln.startswith("[3]"))

    def w(name: str, data: str | bytes) -> str:
        p = tmp / name
        p.write_bytes(data.encode("latin-1") if isinstance(data, str) else data)
        return str(p)

    rnd = w("random.gz", os.urandom(4096))
    cut = gzip.compress(gp.encode())
    cutgz = w("cut.gz", cut[: len(cut) // 2])
    real = gzip.decompress((FIX / "gprof" / "pg18-query2.gprof.txt.gz").read_bytes()).decode()
    rl = real.splitlines(True)
    seps = [i for i, ln in enumerate(rl) if ln.startswith("-----")]
    perf = (FIX / "perf" / "clockloop.perf-script.txt").read_text()
    pl = perf.splitlines(True)
    frame = next(i for i, ln in enumerate(pl) if ln.startswith("\t") and i + 1 < len(pl)
                 and pl[i + 1].startswith("\t"))
    header = next(i for i, ln in enumerate(pl) if ln and not ln.startswith("\t") and ln.strip())
    folded = (FIX / "perf" / "expected_clockloop.folded").read_text()
    deep = ";".join(f"f{i}" for i in range(20000)) + " 1\n"
    psql = (FIX / "perf_stat" / "sleep.perf-stat.csv")
    def rows(out: str) -> str:
        return f"{len(out.splitlines()) - 1} rows: " + ", ".join(
            ln.split(",")[0] for ln in out.splitlines()[1:8])

    def edges(out: str) -> str:
        return f"{len(out.splitlines()) - 1} edges"

    summaries = {
        "gprof: blank line in call graph (cycles: 11 edges)": edges,
        "gprof: blank line in call graph (real: 5163 edges)": edges,
        "gprof: blank line in flat profile (6 rows)": rows,
        "latin-1 symbol names (gprof)": rows,
    }
    cases: list[tuple[str, list[str] | str, bool]] = [
        ("directory as input", [PROFKIT, "parse", "gprof", str(tmp)], False),
        ("/proc/self/mem as input", [PROFKIT, "parse", "gprof", "/proc/self/mem"], False),
        ("random bytes named .gz", [PROFKIT, "parse", "gprof", rnd], False),
        ("truncated .gz", [PROFKIT, "parse", "gprof", cutgz], False),
        ("/dev/zero (unbounded line)", [PROFKIT, "parse", "gprof", "/dev/zero"], False),
        ("perf script: /dev/zero", [PROFKIT, "parse", "perf-script", "/dev/zero"], False),
        ("-o /proc/x", [PROFKIT, "parse", "gprof", str(FIX / "gprof" / "cycles.gprof.txt"),
                        "-o", "/proc/x"], False),
        ("-o /nonexistent/x.csv", [PROFKIT, "parse", "gprof",
                                   str(FIX / "gprof" / "cycles.gprof.txt"), "-o",
                                   "/nonexistent/x.csv"], False),
        ("stdout to /dev/full", f"{PROFKIT} parse gprof {FIX / 'gprof' / 'cycles.gprof.txt'} "
                                "> /dev/full", True),
        ("perf stat with random bytes",
         lib(f"__import__('profkit.parse.perf_stat', fromlist=['x']).parse_perf_stat("
             f"{w('rnd.csv', os.urandom(3000))!r})"), False),
        ("callgrind given a directory",
         lib(f"__import__('profkit.parse.callgrind', fromlist=['x']).parse_callgrind_file("
             f"{str(tmp)!r})"), False),
        ("perf: two frame lines joined",
         [PROFKIT, "parse", "perf-script", w("joined.txt", "".join(
             pl[:frame] + [pl[frame].rstrip("\n") + " " + pl[frame + 1]] + pl[frame + 2:]))],
         False),
        ("perf: non-numeric pid",
         [PROFKIT, "parse", "perf-script", w("pid.txt", "".join(
             pl[:header] + [pl[header].replace(pl[header].split()[1],
                                               pl[header].split()[1] + "B", 1)]
             + pl[header + 1:]))], False),
        ("gprof: blank line in call graph (cycles: 11 edges)",
         [PROFKIT, "parse", "gprof", "--call-graph",
          w("cg-blank.txt", "".join(lines[: at3 - 4] + ["\n"] + lines[at3 - 4:]))], False),
        ("gprof: blank line in call graph (real: 5163 edges)",
         [PROFKIT, "parse", "gprof", "--call-graph", w("real-blank.txt", "".join(
             rl[: seps[100] + 1] + ["\n"] + rl[seps[100] + 1:]))], False),
        ("gprof: blank line in flat profile (6 rows)",
         [PROFKIT, "parse", "gprof", w("flat-blank.txt", "".join(lines[:8] + ["\n"]
                                                                 + lines[8:]))], False),
        ("gprof: garbled number 25O.38",
         [PROFKIT, "parse", "gprof", w("garbled.txt", gp.replace("250.38   250.38  fib",
                                                                 "250.38   25O.38  fib"))],
         False),
        ("gprof: cut inside the flat profile",
         [PROFKIT, "parse", "gprof", w("cut-flat.txt", "".join(lines[:8]))], False),
        ("folded cut inside its last count",
         [PROFKIT, "flamegraph", w("cut.folded", folded.rstrip("\n")[:-1]), "-o",
          str(tmp / "cut.svg")], False),
        ("ltrace garbage",
         lib("__import__('profkit.parse.ltrace', fromlist=['x']).parse_ltrace_summary("
             "'Segmentation fault\\nwhatever\\n')"), False),
        ("latin-1 symbol names (gprof)",
         [PROFKIT, "parse", "gprof", w("latin1.txt", gp.replace("ping", "p\xe9ng")
                                       .replace("pong", "p\xe8ng"))], False),
        ("perf script --event nosuch",
         [PROFKIT, "parse", "perf-script", "--event", "nosuch",
          str(FIX / "perf" / "clockloop.perf-script.txt")], False),
        ("flamegraph --width -5",
         [PROFKIT, "flamegraph", str(FIX / "perf" / "expected_clockloop.folded"), "--width",
          "-5", "-o", str(tmp / "w.svg")], False),
        ("perf script: header + 40,000 spaces",
         [PROFKIT, "parse", "perf-script", w("pad.txt", pl[header].rstrip("\n") + " " * 40000
                                              + "x\n")], False),
        ("gprof: header + 40,000 spaces",
         [PROFKIT, "parse", "gprof", w("gpad.txt", "".join(lines[:5]) + " " * 40000 + "x\n")],
         False),
        ("deep stack (20,000 frames) rendered",
         [PROFKIT, "flamegraph", w("deep.folded", deep), "-o", str(tmp / "deep.svg")], False),
        ("bench --scale inf", [PROFKIT, "bench", "--builds", "vanilla", "--workload",
                               "nested_loop", "--scale", "inf", "--reps", "2"], False),
        ("perf stat parser on its fixture",
         lib(f"__import__('profkit.parse.perf_stat', fromlist=['x']).parse_perf_stat("
             f"{str(psql)!r})"), False),
        ("profkit --version", [PROFKIT, "--version"], False),
        ("python -m profkit --help", [sys.executable, "-m", "profkit", "--help"], False),
        ("usage error (unknown option)", [PROFKIT, "bench", "--nosuch"], False),
    ]
    if args.pg:
        cases += [
            ("cluster psql NAME (SELECT version())",
             f"{PROFKIT} cluster start vanilla --name cases-psql >/dev/null 2>&1"
             f" && {PROFKIT} cluster psql cases-psql -- -At -c 'select version()'; rc=$?; "
             f"{PROFKIT} probe --cluster cases-psql --sql 'SELECT count(*) FROM missing_table'"
             f" > {tmp}/probe.out 2>&1; echo $? > {tmp}/probe.rc; "
             f"{PROFKIT} cluster stop cases-psql >/dev/null; exit $rc", True),
        ]
    try:
        report(cases, tmp, summaries, args.pg)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the cases' inputs and outputs
    return 0


def report(cases, tmp: Path, summaries, pg: bool) -> None:
    print("| case | exit | first line of output | seconds |")
    print("|---|---|---|---|")
    for name, argv, shell in cases:
        rc, first, secs = run(argv, shell=shell, cwd=tmp, summarize=summaries.get(name))
        first = first.replace("|", "\\|")[:160]
        print(f"| {name} | {rc} | {first} | {secs:.2f} |", flush=True)
    if pg:  # the probe ran on the psql case's cluster
        text = (tmp / "probe.out").read_text().strip().splitlines()
        rc = (tmp / "probe.rc").read_text().strip()
        first = next((ln for ln in text if ln.startswith("profkit:")), text[-1] if text else "")
        print(f"| probe --sql on a missing table | {rc} | {first.replace('|', chr(92) + '|')[:160]}"
              f" | |")


if __name__ == "__main__":
    sys.exit(main())
