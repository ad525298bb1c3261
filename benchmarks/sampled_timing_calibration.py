"""How far sampled_timing's calibrated costs move on this machine, and what that does.

sampled_timing subtracts calibrated costs (a clock read, a sampled call, a timed call's
extra, a timed call's own interval) from every timed interval.  They are measured in ns
at one moment; this VM's speed drifts (the same query runs 194 to 371 ms), so a
calibration kept for a backend's life is off whenever the speed has moved since.  This
script prints, for each build given:

1. the calibration of N fresh backends (their first one: what a build that calibrates
   once per backend keeps for good), min / median / max per cost and its duration;
2. the probe of tests/c/sampled_timing_probe.c in R fresh backends: a parent timed
   exactly over 1,000 calls of a child that is timed on every call, against the same
   child counting rows only; the difference per child call is what the subtraction
   leaves of the sampler's ~80 ns per timed call (0 if the costs subtracted are the
   ones paid).

Usage::

    .venv/bin/python benchmarks/sampled_timing_calibration.py --builds sampled_timing
    # the version before (calibrated once per backend), beside it:
    git show <commit>:profkit/patches/pg18/sampled_timing.patch > /tmp/old.patch
    .venv/bin/profkit build st_before --patch /tmp/old.patch
    .venv/bin/python benchmarks/sampled_timing_calibration.py --builds st_before,sampled_timing
"""
from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profkit.pg.build import get_build  # noqa: E402
from profkit.pg.cluster import Cluster  # noqa: E402

PROBE_C = ROOT / "tests" / "c" / "sampled_timing_probe.c"
COSTS = ("read", "call", "timed", "own")
MSG = re.compile(r"sampled timing: subtracting ([\d.]+) ns per clock read, ([\d.]+) ns per "
                 r"sampled call, ([\d.]+) ns more per timed call, ([\d.]+) ns of a timed "
                 r"call's own(?: \(calibrated in ([\d.]+) us\))?")


def parse_calibration(msg: str) -> dict[str, float] | None:
    """The costs of one DEBUG1 calibration line (ns; ``took_us`` NaN where the patch does
    not log the duration), or None for any other message."""
    hit = MSG.match(msg)
    if not hit:
        return None
    vals = [float(g) if g is not None else float("nan") for g in hit.groups()]
    return dict(zip((*COSTS, "took_us"), vals, strict=True))


def _calibration(notices: list[str]) -> dict[str, float]:
    for m in notices:
        c = parse_calibration(m)
        if c is not None:
            return c
    raise RuntimeError(f"no calibration message among {notices!r}: is this sampled_timing?")


def compile_probe(build) -> Path:
    """tests/c/sampled_timing_probe.c compiled against *build*'s server headers, in a
    temporary folder of its own (the caller removes it) that the server can read."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise RuntimeError("no C compiler: the probe is compiled against the build's headers")
    d = Path(tempfile.mkdtemp(prefix="pk-sampled-probe-"))
    d.chmod(0o755)  # the server runs as its own user
    so = d / "sampled_timing_probe.so"
    subprocess.run([cc, "-O2", "-fPIC", "-shared", "-D_GNU_SOURCE", "-I",
                    build.pg_config["INCLUDEDIR-SERVER"], "-o", str(so), str(PROBE_C)],
                   check=True, capture_output=True, text=True)
    so.chmod(0o755)
    return so


def create_probe(conn, so: Path) -> None:
    conn.execute(f"CREATE FUNCTION sampled_timing_probe(text, int, int, int) "
                 f"RETURNS float8[] AS '{so}' LANGUAGE C STRICT")


def _row(label: str, xs: list[float]) -> str:
    xs = sorted(xs)
    return (f"  {label:<22} min {xs[0]:8.2f}  median {statistics.median(xs):8.2f}  "
            f"max {xs[-1]:8.2f}")


def measure(name: str, backends: int, probes: int) -> None:
    build = get_build(name)
    so = compile_probe(build)
    print(f"## {name} ({build.key})")
    with Cluster(build, name=f"calib-{name}") as cl:
        with cl.connect() as conn:
            create_probe(conn, so)
        firsts = []
        for _ in range(backends):
            with cl.connect() as conn:
                notices: list[str] = []
                conn.add_notice_handler(lambda d, n=notices: n.append(d.message_primary))
                conn.execute("SET explain_timing_sample_rate = 100")
                conn.execute("SET client_min_messages = debug1")
                conn.execute("EXPLAIN (ANALYZE) SELECT count(*) FROM generate_series(1, 10)")
                firsts.append(_calibration(notices))
        print(f"first calibration of {backends} fresh backends, ns per event:")
        for k in COSTS:
            print(_row(k, [c[k] for c in firsts]))
        us = [c["took_us"] for c in firsts if c["took_us"] == c["took_us"]]
        if us:
            print(_row("duration (us)", us))
        median_timed = statistics.median(c["timed"] for c in firsts)
        high = sum(c["timed"] > 1.2 * median_timed for c in firsts)
        print(f"  backends whose timed cost is > 1.2 x the median: {high} of {backends}")

        left = []
        for _ in range(probes):
            with cl.connect() as conn:
                med = {"rows": [], "timed": []}
                for _r in range(5):  # interleaved, as in the test
                    for mode in med:
                        out = conn.execute("SELECT sampled_timing_probe(%s, 41, 1000, 2)",
                                           (mode,)).fetchone()[0]
                        med[mode].append(statistics.median(out))
                left.append((statistics.median(med["timed"])
                             - statistics.median(med["rows"])) / 1000)
        print(f"probe, {probes} fresh backends: parent's time per child call, timed child "
              f"minus rows-only child (ns; 0 = all bookkeeping subtracted):")
        print("  " + " ".join(f"{x:+.1f}" for x in sorted(left)))
        print(_row("left per child call", left))
    shutil.rmtree(so.parent, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--builds", default="sampled_timing",
                    help="comma-separated builds of the sampled_timing patch")
    ap.add_argument("--backends", type=int, default=40)
    ap.add_argument("--probes", type=int, default=20)
    a = ap.parse_args(argv)
    for name in a.builds.split(","):
        measure(name.strip(), a.backends, a.probes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
