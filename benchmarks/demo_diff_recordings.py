"""How many recordings per build does `make demo`'s vanilla → step3 differential need?

`make demo` draws Query-2's differential flamegraph from repeated perf recordings of
vanilla and step3 (each recording one execution on its own cluster and backend); a frame
is coloured only where the bootstrap interval of its self change per execution excludes
0 (:mod:`profkit.analyze.flamediff`), keyed by stack path.  step3 removes the
instrumentation frames (ExecProcNodeInstr, InstrStartNode, InstrStopNode) whole; with
few recordings the interval (Student's t at Welch's degrees of freedom: 2 when one side
is all zeros and the other has 3 recordings) is too wide to colour even them.

For each number of recordings N of *--recordings*, this runs the demo's differential
(nested_loop Query-2 at scale 0.05, one execution per recording, the demo's engine:
:func:`profkit.experiments.flamediff.record_diff`) *--repeats* times, and an A/A
differential (vanilla against vanilla, same settings) as often: every frame the A/A
flags is a false positive.  Printed per run: stack paths flagged (self: what the SVG
colours) of those tested, how many of the flagged ones end in an instrumentation
function, functions flagged (self), wall time.

Usage::

    .venv/bin/python benchmarks/demo_diff_recordings.py --recordings 3,6 --repeats 3
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profkit.analyze.flamediff import aa_flag_rate  # noqa: E402
from profkit.analyze.stats import wilson_interval  # noqa: E402
from profkit.experiments.flamediff import check_request, record_diff  # noqa: E402
from profkit.experiments.profile import INSTR_FUNCTIONS  # noqa: E402
from profkit.pg.build import get_build  # noqa: E402


def instr_paths_flagged(diff) -> tuple[int, int]:
    """(flagged, present) stack paths (self) whose leaf is an instrumentation function."""
    t = diff.table
    p = t[(t["key"] == "path") & (t["basis"] == "self")]
    leaf = p["frame"].str.rsplit(";", n=1).str[-1]
    mine = p[leaf.isin(INSTR_FUNCTIONS)]
    return int((mine["flag"] != 0).sum()), len(mine)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recordings", default="3,6", help="comma-separated N (default 3,6)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="demo-diff-"))
    out.mkdir(parents=True, exist_ok=True)
    builds = {"vanilla": get_build("vanilla"), "step3": get_build("step3")}
    print(f"runs in {out}; nested_loop analyze_notiming at scale {args.scale}, "
          "1 execution per recording", flush=True)
    for n in (int(x) for x in args.recordings.split(",")):
        aa, ab = [], []
        for i in range(args.repeats):
            for kind, pair in (("vanilla → step3", ("vanilla", "step3")),
                               ("A/A", ("vanilla", "vanilla"))):
                t0 = time.monotonic()
                req = check_request(*pair, scale=args.scale, recordings=n, executions=1,
                                    order_seed=3000 + 10 * n + i)
                res = record_diff(req, base=out,
                                  builds={a.label: builds[a.preset] for a in req.arms})
                h, m = res.diff.flag_rate("path", "self")
                fh, fm = res.diff.flag_rate("function", "self")
                ih, im = instr_paths_flagged(res.diff)
                (ab if kind == "A/A" else aa).append(res.diff)
                print(f"N={n} {kind} {i + 1}: paths (self) flagged {h}/{m}, of them "
                      f"instrumentation leaves {ih} (of {im} present); functions (self) "
                      f"{fh}/{fm} ({time.monotonic() - t0:.0f} s)", flush=True)
        for kind, diffs in (("vanilla → step3", aa), ("A/A", ab)):
            h, m = aa_flag_rate(diffs, "path", "self")
            lo, hi = wilson_interval(h, m)
            print(f"N={n} {kind} pooled: paths (self) flagged {h}/{m} "
                  f"({h / m if m else float('nan'):.3f} [Wilson 95 %: {lo:.3f}, {hi:.3f}])")
    return 0


if __name__ == "__main__":
    sys.exit(main())
