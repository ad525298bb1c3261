"""Folding speed: profkit against stackcollapse-perf.pl and perf's own collapser.

On one `perf script` capture of a PostgreSQL backend (>= 50 MB of text makes the start-up
costs small against the work), each tool runs (1-3: median of ``--runs``, interleaved;
4-5 once), wall time including start-up:

1. ``perl stackcollapse-perf.pl TEXT``                (FlameGraph; the reference)
2. ``profkit-stackcollapse-perf TEXT``                (profkit's drop-in command, C core)
3. ``profkit parse perf-script TEXT``                 (the same through profkit's CLI)
4. the pure-Python reference (``--python``: slow; for the record)
5. ``perf script report stackcollapse -i perf.data``  (perf's collapser, reads perf.data)

It prints MB/s of text, the ratio to the Perl script, each folder's peak RSS (from
wait4), and checks that profkit's output is byte for byte the Perl script's. Then the
end-to-end path perf.data → folded: ``perf script`` with its default fields, with
``--no-inline``, and with profkit's collector fields (``profkit.collect.perf.SCRIPT_ARGS``)
piped into the folder, so the split between text generation and folding shows.

Where the capture comes from (first that applies):

- ``--text FILE`` (and optionally ``--perf-data FILE`` for steps 5 and the end-to-end);
- ``--perf-data FILE``: an existing recording, turned into text here;
- ``--pid PID``: ``perf record -F FREQ -g -p PID`` for ``--seconds``;
- ``--dsn DSN``: a PostgreSQL backend running the seed's Query-3 in a loop, recorded;
- default: profkit's own vanilla build and nested_loop workload (profkit.pg), Query-3
  in a loop, recorded for ``--seconds`` at ``--freq`` (12 s at 2999 Hz ≈ 100 MB of text).

Usage::

    .venv/bin/python benchmarks/bench_folding.py --workdir profiles/bench-folding
    .venv/bin/python benchmarks/bench_folding.py --text profiles/bench-folding/perf-script.txt \
        --perf-data profiles/bench-folding/perf.data
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

QUERY3 = ("EXPLAIN (ANALYZE TRUE, TIMING TRUE, BUFFERS FALSE) SELECT count(*) FROM test1 AS a, "
          "test2 AS b, test3 AS c WHERE a.id = c.id")
ROOT = Path(__file__).resolve().parent.parent
#: `profkit parse perf-script` should fold at least this many times faster than the Perl
#: script, start-up included, on a capture of >= 50 MB
GOAL_X = 20.0


def _record(argv_target: list[str], out: Path, seconds: float, freq: int) -> None:
    from profkit.processes import Background, which

    perf = which("perf")
    bg = Background([perf, "record", "-F", str(freq), "-g", "-o", str(out), *argv_target],
                    stop_signal=signal.SIGINT, stderr_path=str(out) + ".log", what="perf record")
    with bg:
        time.sleep(seconds)
    # SIGINT lets perf finish writing; an unreadable perf.data would fail below anyway
    if not out.exists() or out.stat().st_size == 0:
        raise SystemExit(f"perf record wrote nothing; see {out}.log")


def _record_pg(out: Path, seconds: float, freq: int, dsn: str | None, stack: ExitStack,
               scale: float) -> dict[str, str]:
    import psycopg

    if dsn:
        def factory():
            return psycopg.connect(dsn, autocommit=True)
        meta = {"source": f"dsn {dsn}"}
    else:
        from profkit.pg.build import get_build
        from profkit.pg.cluster import Cluster
        from profkit.pg.workloads import get_workload

        build = get_build("vanilla")
        cl = stack.enter_context(Cluster(build))
        with cl.connect() as c:
            get_workload("nested_loop").load(c, scale=scale)
        factory = cl.connect
        meta = {"source": f"profkit vanilla build {build.prefix}, nested_loop scale {scale}"}
    conn = factory()
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    conn.execute(QUERY3).fetchall()           # warm caches before recording
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            conn.execute(QUERY3).fetchall()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        _record(["-p", str(pid)], out, seconds, freq)
    finally:
        stop.set()
        t.join(120)
        conn.close()
    meta["recorded"] = f"backend pid {pid}, Query-3 in a loop, {seconds:g} s at -F {freq}"
    return meta


def _run(argv: list[str], stdout_path: Path | None) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds user+system, peak RSS MB) of one child, start-up
    included. GNU time measures CPU and RSS (this process's own RSS would otherwise be
    inherited into the child's maximum across fork+exec)."""
    gnu_time = shutil.which("time") or "/usr/bin/time"
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf, \
            open(stdout_path or os.devnull, "wb") as out:
        t0 = time.perf_counter()
        cp = subprocess.run([gnu_time, "-f", "%U %S %M", "-o", tf.name, *argv], stdout=out,
                            stderr=subprocess.PIPE)
        wall = time.perf_counter() - t0
        fields = Path(tf.name).read_text().split()[-3:]
    if cp.returncode != 0:
        raise SystemExit(f"{argv[0]} failed with status {cp.returncode}: "
                         f"{cp.stderr.decode(errors='replace')[-500:]}")
    user, system, rss = float(fields[0]), float(fields[1]), int(fields[2]) / 1024
    return wall, user + system, rss


def _pipeline(producer: list[str], consumer: list[str], out: Path, repeat: int
              ) -> tuple[float, float, float]:
    """Medians over *repeat* runs: wall time of `producer | consumer > out`, and the
    producer's own wall and CPU seconds (run alone, output discarded)."""
    both, alone, cpu = [], [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        with open(out, "wb") as f:
            a = subprocess.Popen(producer, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            b = subprocess.Popen(consumer, stdin=a.stdout, stdout=f, stderr=subprocess.DEVNULL)
            assert a.stdout is not None
            a.stdout.close()
            b.wait()
            a.wait()
        both.append(time.perf_counter() - t0)
        w, c, _ = _run(producer, None)
        alone.append(w)
        cpu.append(c)
    return statistics.median(both), statistics.median(alone), statistics.median(cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", type=Path, help="an existing perf script text")
    ap.add_argument("--perf-data", type=Path)
    ap.add_argument("--pid", type=int)
    ap.add_argument("--dsn")
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--freq", type=int, default=2999, help="perf record -F (default 2999)")
    ap.add_argument("--scale", type=float, default=0.05, help="nested_loop scale (default run)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep files here")
    ap.add_argument("--python", action="store_true", help="also time the Python reference")
    ap.add_argument("--runs", type=int, default=5,
                    help="folders: median of this many runs each (default 5)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="end to end: median of this many runs per perf script variant")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT))
    from profkit.collect.perf import SCRIPT_ARGS
    from profkit.processes import which

    perf = which("perf")
    suite = Path(os.environ.get("PROFKIT_FLAMEGRAPH_SUITE",
                                ROOT.parent / "shared" / "flamegraph-suite"))
    perl_script = suite / "stackcollapse-perf.pl"
    if not perl_script.is_file():
        raise SystemExit(f"stackcollapse-perf.pl not found in {suite} "
                         "(set PROFKIT_FLAMEGRAPH_SUITE)")
    bindir = Path(sys.executable).parent
    # byte-compiled, as pip leaves an installed package (an editable install under
    # PYTHONDONTWRITEBYTECODE would compile profkit's modules again on every run)
    import profkit

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(profkit.__file__).parent)],
                   check=True, stdout=subprocess.DEVNULL)
    dropin = bindir / "profkit-stackcollapse-perf"
    cli = bindir / "profkit"
    with ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="bench-folding-")))
        work.mkdir(parents=True, exist_ok=True)
        meta: dict[str, str] = {}
        data: Path | None = args.perf_data
        if args.text:
            text = args.text
            meta["source"] = str(text)
        else:
            if data is None:
                data = work / "perf.data"
                if args.pid:
                    _record(["-p", str(args.pid)], data, args.seconds, args.freq)
                    meta["source"] = f"pid {args.pid}, {args.seconds:g} s at -F {args.freq}"
                else:
                    meta.update(_record_pg(data, args.seconds, args.freq, args.dsn, stack,
                                           args.scale))
            else:
                meta["source"] = str(data)
            text = work / "perf-script.txt"
            _run([perf, "script", "-i", str(data)], text)
        mb = text.stat().st_size / 1e6
        load0 = os.getloadavg()

        rows: list[tuple[str, float, float, float, bool | None]] = []
        perl_out = work / "perl.folded"
        folders = [("stackcollapse-perf.pl", ["perl", str(perl_script), str(text)]),
                   ("profkit-stackcollapse-perf", [str(dropin), str(text)]),
                   ("profkit parse perf-script", [str(cli), "parse", "perf-script", str(text)])]
        # median of --runs runs each, interleaved (a change in the machine's load hits all
        # three), start-up included; every run's output is compared with the Perl script's
        runs: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _ in folders}
        same: dict[str, bool] = {}
        ref = b""
        for _ in range(args.runs):
            for label, argv in folders:
                out = perl_out if label == "stackcollapse-perf.pl" else work / "profkit.folded"
                runs[label].append(_run(argv, out))
                if label == "stackcollapse-perf.pl":
                    ref = perl_out.read_bytes()
                else:
                    same[label] = same.get(label, True) and out.read_bytes() == ref
        for label, _argv in folders:
            t = statistics.median(r[0] for r in runs[label])
            c = statistics.median(r[1] for r in runs[label])
            rss = max(r[2] for r in runs[label])
            rows.append((label, t, c, rss, same.get(label)))
        t_perl, c_perl = rows[0][1], rows[0][2]
        if args.python:
            out = work / "python.folded"
            code = ("import sys; from profkit.parse.perf_script import fold_perf_script as f; "
                    "sys.stdout.buffer.write(f(sys.argv[1], implementation='python')"
                    ".folded_bytes())")
            t, c, rss = _run([sys.executable, "-c", code, str(text)], out)
            rows.append(("profkit Python reference", t, c, rss, out.read_bytes() == ref))
        if data is not None:
            t, c, rss = _run([perf, "script", "report", "stackcollapse", "-i", str(data)],
                             work / "perf-stackcollapse.folded")
            rows.append(("perf script report stackcollapse", t, c, rss, None))

        print(f"input     : {meta.get('source', '')}")
        if "recorded" in meta:
            print(f"recorded  : {meta['recorded']}")
        nstacks = ref.count(b"\n")
        print(f"text      : {mb:.1f} MB of perf script, {nstacks:,} folded stacks")
        print(f"load average before: {load0}")
        print(f"{'folder':34s} {'wall s':>7s} {'MB/s':>7s} {'x Perl':>7s} {'CPU s':>7s} "
              f"{'x Perl':>7s} {'peak RSS MB':>11s}  same bytes as Perl")
        for label, t, c, rss, same in rows:
            note = "" if same is None else ("yes" if same else "NO")
            if label.startswith("perf script report"):
                note = "(reads perf.data; its own naming)"
            print(f"{label:34s} {t:7.2f} {mb / t:7.1f} {t_perl / t:7.1f} {c:7.2f} "
                  f"{c_perl / max(c, 1e-3):7.1f} {rss:11.1f}  {note}")
        print(f"load average after: {os.getloadavg()} (wall times on a busy machine include "
              "waiting for a CPU; CPU seconds do not)")
        print(f"(the three folders: median of {args.runs} interleaved runs each; the others "
              "one run)")
        cli_row = next(r for r in rows if r[0] == "profkit parse perf-script")
        print(f"profkit parse perf-script: {t_perl / cli_row[1]:.1f}x the Perl script's speed "
              f"(wall, start-up included; goal >= {GOAL_X:g}x: "
              f"{'met' if t_perl / cli_row[1] >= GOAL_X else 'missed'}), "
              f"{c_perl / max(cli_row[2], 1e-3):.1f}x in CPU seconds")

        if data is not None:
            dmb = data.stat().st_size / 1e6
            print(f"\nend to end: perf.data ({dmb:.1f} MB) -> folded, perf script piped into "
                  "profkit-stackcollapse-perf")
            fold_row = next(r for r in rows if r[0] == "profkit-stackcollapse-perf")
            fold_wall, fold_cpu = fold_row[1], fold_row[2]
            print(f"  folding alone (profkit-stackcollapse-perf on the text file): "
                  f"{fold_wall:.2f} s wall, {fold_cpu:.2f} s CPU")
            for label, extra in (("perf script (default fields)", []),
                                 ("perf script --no-inline", ["--no-inline"]),
                                 ("perf script " + " ".join(SCRIPT_ARGS) + " (collector)",
                                  list(SCRIPT_ARGS))):
                both, alone, cpu = _pipeline([perf, "script", "-i", str(data), *extra],
                                             [str(dropin)], work / "e2e.folded", args.repeat)
                print(f"  {label}:\n    perf.data -> folded {both:.2f} s ({dmb / both:.1f} MB of "
                      f"perf.data/s); perf script alone {alone:.2f} s wall, {cpu:.2f} s CPU: "
                      f"{cpu / (cpu + fold_cpu):.0%} of the CPU is perf script's "
                      f"(medians of {args.repeat})")
        if args.workdir:
            print(f"files kept in {work}")
        ok = all(same is not False for *_, same in rows)
        return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
