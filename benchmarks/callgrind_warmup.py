#!/usr/bin/env python3
"""What running the warm-up uninstrumented saves a callgrind session, and what it does to
the counts: each seed workload at the headline matrix's scale; each session, as in
``benchmarks/headline.py``'s ``measure`` (each cell of the tests' matrix), on a cluster
of its own just loaded and stopped (the load is not timed), alternately instrumented
from the start (``instrument_warmup=True``, valgrind's default) and with start-up and
warm-up uninstrumented (profkit's default: ``vgdb ... instrumentation on`` before the
counted statements).

    .venv/bin/python benchmarks/callgrind_warmup.py [--build step5] [--rounds 2]

Prints, per workload and way: each session's wall time (start-up, warm-up, the three
counted modes, shutdown), the median, the ratio uninstrumented / instrumented, and how far
each mode's count lies from the instrumented sessions' (in instructions and in %).
Rounds alternate which way goes first.  Take it with the machine idle.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from headline import SCALES  # noqa: E402

from profkit.collect.callgrind import collect_callgrind  # noqa: E402
from profkit.parse.callgrind import instr_counts_from_session  # noqa: E402
from profkit.pg.build import get_build  # noqa: E402
from profkit.pg.cluster import Cluster  # noqa: E402
from profkit.pg.workloads import get_workload  # noqa: E402

# the modes tests/test_headline.py and tests/test_rows_only_path.py count in each cell
TEST_MODES = ("plain", "analyze_notiming", "analyze_buffers")
WAYS = {"instrumented": True, "uninstrumented": False}  # way -> instrument_warmup


def session(b, c, wl, modes, instrument_warmup: bool) -> tuple[float, dict[str, int], bool]:
    out = Path(tempfile.mkdtemp(prefix="profkit-cgwarm-"))
    t0 = time.monotonic()
    s = collect_callgrind(postgres=b.postgres, datadir=c.datadir, os_user=c.os_user,
                          queries={m: wl.query(m) for m in modes}, out_dir=out,
                          warmup_sql="", instrument_warmup=instrument_warmup)
    secs = time.monotonic() - t0
    df = instr_counts_from_session(s, build=b.name, workload=wl.name)
    return secs, dict(zip(df["mode"], (int(n) for n in df["instructions"]), strict=True)), \
        s.warmup_instrumented


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="step5")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    b = get_build(a.build)
    modes = TEST_MODES
    print(f"# {b.name} ({b.key[:12]}), {a.rounds} rounds, modes {', '.join(modes)}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    for w in ("nested_loop", "join_sum", "count_star"):
        wl = get_workload(w)
        secs: dict[str, list[float]] = {k: [] for k in WAYS}
        counts: dict[str, list[dict[str, int]]] = {k: [] for k in WAYS}
        for r in range(a.rounds):
            order = list(WAYS) if r % 2 == 0 else list(WAYS)[::-1]
            for way in order:
                with Cluster(b, name=f"cgwarm-{w}") as c:  # as headline.measure: fresh
                    with c.connect() as conn:
                        wl.load(conn, SCALES[w])
                    c.pause()
                    t, n, instrumented = session(b, c, wl, modes, WAYS[way])
                assert instrumented == WAYS[way], (way, instrumented)
                secs[way].append(t)
                counts[way].append(n)
        med = {k: statistics.median(v) for k, v in secs.items()}
        print(f"\n{w} {SCALES[w]}: session s, instrumented "
              + ", ".join(f"{x:.1f}" for x in secs["instrumented"])
              + f" (median {med['instrumented']:.1f}); uninstrumented warm-up "
              + ", ".join(f"{x:.1f}" for x in secs["uninstrumented"])
              + f" (median {med['uninstrumented']:.1f}); ratio "
              + f"{med['uninstrumented'] / med['instrumented']:.2f}")
        for m in modes:
            ref = counts["instrumented"][0][m]
            ins = [n[m] - ref for n in counts["instrumented"]]
            uni = [n[m] - ref for n in counts["uninstrumented"]]
            worst = max(abs(d) for d in ins + uni) / ref * 100
            print(f"  {m}: {ref:,} instructions; instrumented sessions "
                  + ", ".join(f"{d:+,}" for d in ins) + "; uninstrumented "
                  + ", ".join(f"{d:+,}" for d in uni) + f" (largest {worst:.5f} %)")


if __name__ == "__main__":
    main()
