"""Folding speed: profkit's streaming perf-script folder vs perf's own collapser.

One run, one perf.data, three timings:

1. ``perf script -i perf.data > text``          — text generation (what profkit reads)
2. profkit ``fold_perf_script(text)``           — in a fresh interpreter, for peak RSS
3. ``perf script report stackcollapse -i perf.data`` — perf's collapser (reads perf.data)

and a check that (2) and (3) produce the same stacks (profkit names unsymbolised frames
after their module, perf calls them ``[unknown]``; that is mapped back before comparing).
MB/s are over the text size for both folders, so the figures are comparable; the
end-to-end line compares perf.data → folded for both (profkit pays for step 1).

Where the perf.data comes from (first that applies):

- ``--perf-data FILE``: an existing recording (kept as is);
- ``--pid PID``: ``perf record -F FREQ -g -p PID`` for ``--seconds``;
- ``--dsn DSN``: a PostgreSQL backend running the seed's Query-3 in a loop, recorded;
- default: profkit's own vanilla build and nested_loop workload (profkit.pg), Query-3
  in a loop, recorded — a deep, realistic executor stack.

Usage::

    .venv/bin/python benchmarks/bench_folding.py                   # vanilla build, 20 s
    .venv/bin/python benchmarks/bench_folding.py --dsn "host=/tmp port=5432 dbname=postgres"
    .venv/bin/python benchmarks/bench_folding.py --perf-data profiles/run1/perf.data
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

QUERY3 = ("EXPLAIN (ANALYZE TRUE, TIMING TRUE, BUFFERS FALSE) SELECT count(*) FROM test1 AS a, "
          "test2 AS b, test3 AS c WHERE a.id = c.id")

# Runs in a fresh interpreter so that ru_maxrss is this folding's, not the benchmark's.
_CHILD = r"""
import json, resource, sys, time
from profkit.parse.perf_script import fold_perf_script
from profkit.parse.folded import write_folded
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
fold = fold_perf_script(sys.argv[1])
dt = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
write_folded(fold.counts, sys.argv[2])
print(json.dumps({"seconds": dt, "rss_base_kb": base, "rss_peak_kb": peak,
                  "samples": fold.samples, "stacks": len(fold.counts), "lines": fold.lines}))
"""


def _record(argv_target: list[str], out: Path, seconds: float, freq: int) -> None:
    from profkit.run import Background, which

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


def _timed(argv: list[str], stdout_path: Path | None) -> float:
    t0 = time.perf_counter()
    with open(stdout_path or os.devnull, "wb") as out:
        subprocess.run(argv, stdout=out, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--perf-data", type=Path)
    ap.add_argument("--pid", type=int)
    ap.add_argument("--dsn")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--freq", type=int, default=2999, help="perf record -F (default 2999)")
    ap.add_argument("--scale", type=float, default=0.05, help="nested_loop scale (default run)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep files here")
    ap.add_argument("--repeat", type=int, default=1, help="take the best of N timings")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from profkit.parse.folded import read_folded
    from profkit.run import which

    perf = which("perf")
    with ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="bench-folding-")))
        work.mkdir(parents=True, exist_ok=True)
        meta: dict[str, str] = {}
        if args.perf_data:
            data = args.perf_data
            meta["source"] = str(data)
        else:
            data = work / "perf.data"
            if args.pid:
                _record(["-p", str(args.pid)], data, args.seconds, args.freq)
                meta["source"] = f"pid {args.pid}, {args.seconds:g} s at -F {args.freq}"
            else:
                meta.update(_record_pg(data, args.seconds, args.freq, args.dsn, stack,
                                       args.scale))
        text = work / "perf-script.txt"
        t_text = min(_timed([perf, "script", "-i", str(data)], text) for _ in range(args.repeat))
        size = text.stat().st_size
        mb = size / 1e6

        ours_path = work / "profkit.folded"
        child_runs = []
        for _ in range(args.repeat):
            r = subprocess.run([sys.executable, "-c", _CHILD, str(text), str(ours_path)],
                               capture_output=True, text=True, check=True,
                               env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve()
                                                                     .parent.parent)})
            child_runs.append(json.loads(r.stdout))
        ours = min(child_runs, key=lambda c: c["seconds"])

        theirs_path = work / "perf-stackcollapse.folded"
        t_perf = min(_timed([perf, "script", "report", "stackcollapse", "-i", str(data)],
                            theirs_path) for _ in range(args.repeat))

        a = read_folded(ours_path)
        b = read_folded(theirs_path)
        mapped: dict[str, float] = {}
        for s, c in a.items():
            k = ";".join("[unknown]" if (f.startswith("[") and f.endswith("]")
                                         and f != "[vdso]") else f for f in s.split(";"))
            mapped[k] = mapped.get(k, 0) + c
        same = mapped == b

        print(f"input            : {meta.get('source', '')}")
        if "recorded" in meta:
            print(f"recorded         : {meta['recorded']}")
        print(f"perf.data        : {data.stat().st_size / 1e6:.1f} MB, "
              f"{ours['samples']:,} samples, {ours['stacks']:,} distinct stacks")
        print(f"perf script text : {mb:.1f} MB, {ours['lines']:,} lines, generated in "
              f"{t_text:.2f} s ({mb / t_text:.1f} MB/s)")
        print(f"profkit folding  : {ours['seconds']:.2f} s = {mb / ours['seconds']:.1f} MB/s "
              f"of text")
        print(f"perf stackcollapse: {t_perf:.2f} s = {mb / t_perf:.1f} MB/s-equivalent "
              f"(reads perf.data)")
        print(f"ratio            : profkit folding is {t_perf / ours['seconds']:.1f}x faster "
              f"than perf's collapser; end to end from perf.data (perf script + profkit) "
              f"{t_text + ours['seconds']:.2f} s vs {t_perf:.2f} s "
              f"({t_perf / (t_text + ours['seconds']):.2f}x)")
        print(f"profkit peak RSS : {ours['rss_peak_kb'] / 1024:.1f} MB "
              f"(after imports {ours['rss_base_kb'] / 1024:.1f} MB, folding added "
              f"{(ours['rss_peak_kb'] - ours['rss_base_kb']) / 1024:.1f} MB for "
              f"{mb:.0f} MB of text: streaming)")
        print(f"same stacks as perf's collapser: {'yes' if same else 'NO'} "
              f"({len(a)} vs {len(b)} stacks, {sum(a.values()):.0f} vs "
              f"{sum(b.values()):.0f} samples)")
        print(f"this process max RSS: "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MB")
        if args.workdir:
            print(f"files kept in {work}")
        return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
