"""What one clock read costs on this machine.

EXPLAIN ANALYZE with TIMING on reads the clock twice per row per plan node
(``INSTR_TIME_SET_CURRENT`` -> ``clock_gettime(CLOCK_MONOTONIC)``), so the
cost of one read times the number of reads (:mod:`profkit.analyze.predict`)
is the bulk of its overhead.  This module measures that cost for the clock
sources a patch might use:

- ``clock_monotonic``: what PostgreSQL 18 uses (vDSO, reads the TSC when the
  kernel's clocksource is ``tsc``; a system call with ``kvm-clock``/``xen``
  fallbacks or under valgrind);
- ``clock_monotonic_coarse``: jiffy resolution (1-4 ms), almost free;
- ``clock_monotonic_raw``: unslewed; PostgreSQL uses it on macOS;
- ``rdtsc``, ``rdtscp``, ``lfence_rdtsc``, ``lfence_rdtsc_lfence``: reading
  the TSC directly, unordered / ordered (x86 only; skipped elsewhere).

The numbers come from ``clock_bench.c``, compiled at run time with gcc into
the profkit cache (keyed by the source's hash, so an edit rebuilds it), and
optionally from the build's own ``pg_test_timing``.  The kernel's clock
source and whether the TSC is invariant are reported beside them, because
they decide whether the vDSO fast path is taken at all.
"""
from __future__ import annotations

import platform
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from profkit import tables
from profkit.collect import ctools
from profkit.errors import ParseError, ProbeError, ToolNotFound
from profkit.machine import parse_cpuinfo
from profkit.processes import run

HELPER_SRC = Path(__file__).with_name("clock_bench.c")
CLOCKSOURCE_DIR = Path("/sys/devices/system/clocksource/clocksource0")

POSIX_SOURCES: tuple[str, ...] = (
    "clock_monotonic", "clock_monotonic_coarse", "clock_monotonic_raw",
)
TSC_SOURCES: tuple[str, ...] = ("rdtsc", "rdtscp", "lfence_rdtsc", "lfence_rdtsc_lfence")
ALL_SOURCES: tuple[str, ...] = POSIX_SOURCES + ("clock_realtime",) + TSC_SOURCES
DEFAULT_SOURCES: tuple[str, ...] = POSIX_SOURCES + TSC_SOURCES


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


# ---------------------------------------------------------------------------
# Kernel clock source and TSC flags


@dataclass(frozen=True)
class ClockInfo:
    """Facts about the machine's clocks (provenance for every clock_cost table)."""

    current_clocksource: str
    available_clocksources: tuple[str, ...]
    arch: str
    cpu_model: str
    tsc: bool
    constant_tsc: bool
    nonstop_tsc: bool
    rdtscp: bool
    tsc_known_freq: bool

    @property
    def invariant_tsc(self) -> bool:
        """Linux reports an invariant TSC as both constant_tsc and nonstop_tsc."""
        return self.constant_tsc and self.nonstop_tsc

    def as_dict(self) -> dict[str, object]:
        return {
            "current_clocksource": self.current_clocksource,
            "available_clocksources": list(self.available_clocksources),
            "arch": self.arch, "cpu_model": self.cpu_model, "tsc": self.tsc,
            "constant_tsc": self.constant_tsc, "nonstop_tsc": self.nonstop_tsc,
            "invariant_tsc": self.invariant_tsc, "rdtscp": self.rdtscp,
            "tsc_known_freq": self.tsc_known_freq,
        }


# parse_cpuinfo lives in the base module profkit.machine (imported above)


def clock_info(sysfs: Path = CLOCKSOURCE_DIR, cpuinfo: Path = Path("/proc/cpuinfo")) -> ClockInfo:
    """Read the kernel's clocksource and the CPU's TSC flags."""
    def read(p: Path) -> str:
        try:
            return p.read_text().strip()
        except OSError:
            return ""

    model, flags = parse_cpuinfo(read(cpuinfo))
    return ClockInfo(
        current_clocksource=read(sysfs / "current_clocksource") or "unknown",
        available_clocksources=tuple(read(sysfs / "available_clocksource").split()),
        arch=platform.machine(), cpu_model=model,
        tsc="tsc" in flags, constant_tsc="constant_tsc" in flags,
        nonstop_tsc="nonstop_tsc" in flags, rdtscp="rdtscp" in flags,
        tsc_known_freq="tsc_known_freq" in flags,
    )


# ---------------------------------------------------------------------------
# The C helper


def helper_path() -> Path:
    """Where the compiled helper for the current clock_bench.c lives."""
    return ctools.helper_path(HELPER_SRC)


def build_helper() -> Path:
    """Compile clock_bench.c once per source hash; return the binary's path."""
    return ctools.build_helper(HELPER_SRC, "clock-cost")


@dataclass(frozen=True)
class ClockMeasurement:
    """One run of clock_bench for one source."""

    source: str
    loops: int
    ns_per_call: float
    ns_per_loop: float
    backwards: int
    tsc_hz: float | None
    histogram: tuple[tuple[int, int], ...] = field(default=())  # (upper bound ns, count)


def parse_clock_bench(text: str) -> ClockMeasurement:
    """Parse the output of ``clock_bench SOURCE LOOPS``.

    Input:  ``source rdtsc`` / ``ns_per_call 9.530`` / ``hist 16 1681640`` ...
    Output: ``ClockMeasurement(source="rdtsc", ns_per_call=9.53,
            histogram=((16, 1681640), ...), ...)``
    """
    kv: dict[str, str] = {}
    hist: list[tuple[int, int]] = []
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "hist":
            if len(parts) != 3:
                raise ParseError(f"clock_bench output line {n}: bad histogram line {line!r}")
            hist.append((int(parts[1]), int(parts[2])))
        elif len(parts) == 2:
            kv[parts[0]] = parts[1]
        else:
            raise ParseError(f"clock_bench output line {n}: unexpected {line!r}")
    missing = [k for k in ("source", "loops", "ns_per_call", "ns_per_loop") if k not in kv]
    if missing:
        raise ParseError(f"clock_bench output lacks {missing}; got: {text[:200]!r}")
    return ClockMeasurement(
        source=kv["source"], loops=int(kv["loops"]), ns_per_call=float(kv["ns_per_call"]),
        ns_per_loop=float(kv["ns_per_loop"]), backwards=int(kv.get("backwards", 0)),
        tsc_hz=float(kv["tsc_hz"]) if "tsc_hz" in kv else None, histogram=tuple(hist),
    )


def measure_source(source: str, loops: int = 10_000_000, *, helper: Path | None = None,
                   timeout: float = 300) -> ClockMeasurement | None:
    """Run the helper for one source; None when the source does not exist here (rdtsc on arm)."""
    if source not in ALL_SOURCES:
        raise ProbeError(f"unknown clock source {source!r}; choose from {', '.join(ALL_SOURCES)}")
    if source in TSC_SOURCES and not is_x86():
        return None
    helper = helper or build_helper()
    cp = run([helper, source, str(loops)], timeout=timeout, check=False, what="clock_bench")
    if cp.returncode == 3:
        return None
    if cp.returncode != 0:
        raise ProbeError(f"clock_bench {source} failed (exit {cp.returncode}): {cp.stderr.strip()}")
    return parse_clock_bench(cp.stdout)


def measure_clocks(sources: Sequence[str] | None = None, loops: int = 10_000_000,
                   repeats: int = 3, run_id: str = "") -> pd.DataFrame:
    """Measure every source *repeats* times, interleaved, into a ``clock_cost`` table.

    Interleaving (all sources in rep 1, then all in rep 2, ...) keeps a burst of
    load from another process from landing on one source only.  ``ns_per_call``
    is the median over repeats; ``ns_per_call_min``/``_max`` show the spread.
    The histogram (dict: bucket upper bound in ns -> count) sums the repeats.
    Sources not available on this CPU are left out (and listed in
    ``df.attrs["skipped"]``).
    """
    if repeats < 1 or loops < 1:
        raise ProbeError("repeats and loops must be positive")
    sources = tuple(sources or DEFAULT_SOURCES)
    helper = build_helper()
    info = clock_info()
    got: dict[str, list[ClockMeasurement]] = {s: [] for s in sources}
    skipped: list[str] = []
    for _ in range(repeats):
        for s in sources:
            if s in skipped:
                continue
            m = measure_source(s, loops, helper=helper)
            if m is None:
                skipped.append(s)
            else:
                got[s].append(m)
    rows = []
    for s in sources:
        ms = got[s]
        if not ms:
            continue
        hist: dict[int, int] = {}
        for m in ms:
            for ub, c in m.histogram:
                hist[ub] = hist.get(ub, 0) + c
        calls = [m.ns_per_call for m in ms]
        rows.append({
            "run_id": run_id, "source": s, "ns_per_call": statistics.median(calls),
            "histogram": dict(sorted(hist.items())),
            "ns_per_call_min": min(calls), "ns_per_call_max": max(calls),
            "ns_per_loop": statistics.median(m.ns_per_loop for m in ms),
            "loops": loops, "repeats": len(ms),
            "backwards": sum(m.backwards for m in ms),
            "tsc_hz": ms[0].tsc_hz if ms[0].tsc_hz is not None else float("nan"),
            "method": "clock_bench",
            "clocksource": info.current_clocksource,
            "invariant_tsc": info.invariant_tsc,
        })
    df = tables.validate(pd.DataFrame(rows) if rows else _empty_cost(), "clock_cost")
    df.attrs["skipped"] = skipped
    df.attrs["clock_info"] = info.as_dict()
    return df


def _empty_cost() -> pd.DataFrame:
    return tables.empty("clock_cost")


def histogram_long(cost: pd.DataFrame) -> pd.DataFrame:
    """Explode ``clock_cost.histogram`` into the long ``clock_histogram`` table.

    One row per (source, bucket): ``bucket_ns`` is the bucket's upper bound
    (a delta d counts in bucket U when U/2 <= d < U; U == 0 holds d == 0),
    ``share`` the fraction of that source's reads.
    """
    rows = []
    for rec in cost.itertuples(index=False):
        hist = rec.histogram or {}
        total = sum(hist.values()) or 1
        for ub, c in sorted(hist.items()):
            rows.append({"run_id": rec.run_id, "source": rec.source, "bucket_ns": int(ub),
                         "count": int(c), "share": c / total})
    df = pd.DataFrame(rows) if rows else tables.empty("clock_histogram")
    return tables.validate(df, "clock_histogram")


# ---------------------------------------------------------------------------
# pg_test_timing


@dataclass(frozen=True)
class PgTestTiming:
    """What ``pg_test_timing`` printed."""

    duration_s: int
    per_loop_ns: float
    histogram: tuple[tuple[int, float, int], ...]  # (< us, percent, count)


_PER_LOOP = re.compile(r"Per loop time including overhead:\s*([0-9][0-9.,]*)\s*ns")
_DURATION = re.compile(r"Testing timing overhead for\s+(\d+)\s+seconds?")
_HIST_ROW = re.compile(r"^\s*(\d+)\s+([0-9][0-9.,]*)\s+(\d+)\s*$")


def _num(s: str) -> float:
    # pg_test_timing's printf follows LC_NUMERIC: "4620,82" in a German locale.
    return float(s.replace(",", "."))


def parse_pg_test_timing(text: str) -> PgTestTiming:
    """Parse the output of ``pg_test_timing -d N`` (PostgreSQL 18 format, µs buckets).

    Input:  ``Per loop time including overhead: 35.62 ns`` / ``     1     97.11658   81738121``
    Output: ``PgTestTiming(duration_s=1, per_loop_ns=35.62, histogram=((1, 97.11658,
            81738121), ...))``
    """
    if not text.strip():
        raise ParseError("pg_test_timing printed nothing; run `pg_test_timing -d 1` by hand")
    m = _PER_LOOP.search(text)
    if not m:
        raise ParseError("no 'Per loop time including overhead' line in pg_test_timing output: "
                         f"{text[:200]!r}")
    d = _DURATION.search(text)
    hist: list[tuple[int, float, int]] = []
    in_hist = False
    for line in text.splitlines():
        if line.startswith("Histogram of timing durations"):
            in_hist = True
            continue
        if in_hist:
            r = _HIST_ROW.match(line)
            if r:
                hist.append((int(r.group(1)), _num(r.group(2)), int(r.group(3))))
            elif hist and line.strip():
                break  # PG19 prints a second (ns) table after a blank line: stop at the first
    if not in_hist:
        raise ParseError("pg_test_timing output has no histogram (truncated?)")
    return PgTestTiming(duration_s=int(d.group(1)) if d else 0,
                        per_loop_ns=_num(m.group(1)), histogram=tuple(hist))


def run_pg_test_timing(bindir: str | Path, duration: int = 1) -> str:
    """Run ``BINDIR/pg_test_timing -d DURATION``; return its stdout (raw artifact)."""
    exe = Path(bindir) / "pg_test_timing"
    if not exe.exists():
        raise ToolNotFound(f"{exe} not found: is {bindir} the bin directory of an installed "
                           "PostgreSQL build (profkit build vanilla)?")
    # LC_ALL=C so the number format is the one the parser expects first.
    cp = run([exe, "-d", str(duration)], timeout=duration + 60, env={"LC_ALL": "C"},
             what="pg_test_timing")
    return cp.stdout


def pg_test_timing_cost(result: PgTestTiming, run_id: str = "") -> pd.DataFrame:
    """One ``clock_cost`` row for pg_test_timing's figure (histogram in ns bounds)."""
    # pg_test_timing works in whole µs: its bucket "< U us" holds U/2 <= d < U
    # (d == 0 for U == 1), so its upper bounds map to U * 1000 ns.
    hist = {ub_us * 1000: c for ub_us, _pct, c in result.histogram}
    info = clock_info()
    df = pd.DataFrame([{
        "run_id": run_id, "source": "pg_test_timing", "ns_per_call": result.per_loop_ns,
        "histogram": hist, "ns_per_loop": result.per_loop_ns,
        "ns_per_call_min": result.per_loop_ns, "ns_per_call_max": result.per_loop_ns,
        "loops": sum(c for _, _, c in result.histogram), "repeats": 1, "backwards": 0,
        "tsc_hz": float("nan"), "method": "pg_test_timing",
        "clocksource": info.current_clocksource, "invariant_tsc": info.invariant_tsc,
    }])
    return tables.validate(df, "clock_cost")


def combine(frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    if not frames:
        return tables.validate(_empty_cost(), "clock_cost")
    return tables.validate(pd.concat(frames, ignore_index=True), "clock_cost")
