"""Statistics of the plain-vs-EXPLAIN-ANALYZE benchmark (pure functions over tables).

Input is the ``timings`` table (profkit/tables.py): one row per execution of a query,
with ``build``, ``mode`` (``plain``, ``analyze_notiming``, ``analyze_timing``, ...),
``run_id``, ``rep`` and the measured ``client_ms`` / ``server_ms``.

Overhead of a mode, as in the seed (explain-analyze-87pct-overhead-cut.txt)::

    overhead % = (time(mode) - time(plain)) / time(plain) * 100      (same build)

The seed used means of 10 runs; this module reports the median-based overhead by
default (robust to the odd disturbed run on a noisy VM, which the seed's author could
not control) and the mean-based one beside it.

Confidence intervals come from ``scipy.stats.bootstrap`` (BCa, 95 %, seeded).

Pairing decision (and what ``overhead_pct`` is)
-----------------------------------------------
The benchmark runner interleaves builds and modes: repetition *r* runs plain,
TIMING OFF and TIMING ON back to back, so slow drift of the machine (another
process, frequency, host steal time; ±30 % run to run was seen on this VM) hits all
of them alike. When every ``(run_id, rep)`` key of the plain sample also occurs exactly
once in the mode's sample, the samples are **paired** and

    overhead_pct = median over r of (mode_r − plain_r) / plain_r × 100

with a bootstrap that resamples repetitions jointly (``paired=True``). Otherwise (a
repetition lost to a crash, runs not interleaved) ``overhead_pct`` is the ratio of the
medians, (median(mode) − median(plain)) / median(plain) × 100, with the two samples
resampled independently. ``overhead_median_pct`` (ratio of medians) and
``overhead_mean_pct`` (ratio of means, the seed's formula) are always reported too;
without drift all three agree to within the noise.

Why not the ratio of medians with a paired bootstrap: a simulation (n = 10, 1 %
noise, 150 experiments, 95 % BCa intervals, true overhead 30 %) gave coverage of
0.94 / 0.85 / 0.79 at 0 / 3 / 10 % shared drift per repetition — the interval is too
narrow because the two medians come from different repetitions. The independent
bootstrap of the ratio of medians covers (0.98–1.0) but is 3–12× wider, throwing the
interleaving away. The median of per-repetition overheads covered 0.89–0.94 at every
drift with the narrow width (2.4 points), so it is the estimator when pairs exist.
The ``paired`` column says which was used.

Backends: variance where it lives
---------------------------------
A run whose arms ran on several backends (the ``backend`` column: 1..K, each a fresh
cluster and backend, the repetitions split into K blocks) has two levels of noise: the
repetitions of one backend, and the backends themselves (process and memory layout,
placement, the slow vCPU state lasting several executions). A bootstrap that resamples
repetitions only treats one backend's bias as fixed and its interval is too narrow.
With K ≥ 2 the interval is **hierarchical**: each resample draws K backends with
replacement, then within each drawn backend its repetitions with replacement, and the
statistic (median of per-repetition overheads) is taken over the pooled draw; the 95 %
percentile interval of those resamples is reported (``ci_method`` ``hierarchical``).
``between_share_pct`` says how much of the interval's variance comes from between-
backend variance: 100 × (1 − var(resamples with the backends held fixed) / var(the
hierarchical resamples)), floored at 0. With one backend the interval is the
repetition bootstrap above and ``between_share_pct`` is empty: a one-backend run cannot
see that variance at all.

Coverage, simulated (``tests/test_stats.py::test_hierarchical_interval_coverage``; a
two-level model: per-repetition overhead = 10 % + a backend effect N(0, 2²) + repetition
noise N(0, 2²), in points; 300 experiments): 24 repetitions split into 6 backends of
4, the hierarchical interval covered 0.94 where the repetition bootstrap (BCa) on the
same data covered 0.81; with one backend of 24 repetitions (its bias fixed, as in every
run before backends existed) the repetition bootstrap covered 0.38; the median between
share was 76 %. In a separate sweep (400 experiments per row, /tmp scripts, not kept) with
few backends the hierarchical percentile interval is too narrow: 0.70 (2 backends),
0.86 (3), 0.90-0.94 (4-5), 0.93-0.97 (6-8); with no between-backend effect it covers
0.98. Hence at least :data:`MIN_HIER_BACKENDS` backends by default
(:func:`profkit.experiments.harness.auto_backends`), and ``ci_method`` says "too few"
below that.  Those figures are of the bare percentile interval, which the report printed
until 2026-12-06: on this VM its A/A intervals with 4 backends excluded 0 in 11 of 110
runs.  Since then every hierarchical interval is widened for the few backends it rests on
(:func:`small_sample_factor`): 0.945-0.98 with 4-8 backends in ``benchmarks/hier_small_k.py``
(the same test above now reads 0.97), and 1 of 90 A/A intervals excluded 0.
"""
from __future__ import annotations

import itertools
import math
import re
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd
from scipy import stats as sps

from profkit import tables
from profkit.errors import ComparisonError, ProfkitError

Metric = Literal["server_ms", "client_ms"]
Center = Literal["median", "mean"]

BASELINE_MODE = "plain"

#: Column order of ``summary.csv`` (the seed table's eleven first; readers depend on it),
#: then the comparison against vanilla's plain query: the PostgreSQL version, the build's
#: plain Query-1 (instructions, median and lower-quartile time) and every mode against
#: **vanilla's** plain Query-1 of the same PostgreSQL major (``ref_build``; PG19 rows
#: against pg19/vanilla), in time with its CI and in instructions. ``metric`` names the
#: time measured.
SUMMARY_CSV_COLUMNS: tuple[str, ...] = (
    "build", "mode", "n", "median_ms", "mean_ms", "variance", "overhead_pct",
    "ci_low_pct", "ci_high_pct", "instr", "instr_overhead_pct",
    "pg_version", "preset", "metric", "q25_ms", "plain_instr", "plain_median_ms",
    "plain_q25_ms", "ref_build", "vs_ref_pct", "vs_ref_ci_low_pct", "vs_ref_ci_high_pct",
    "vs_ref_instr_pct",
    # backends per arm, the share of the interval's variance between backends (of
    # overhead_pct's interval and of vs_ref_pct's), and a note: why a row has n = 0
    # (every execution rejected) or that the arms chose different plans
    "backends", "between_share_pct", "vs_ref_between_share_pct", "note",
)
#: The against-vanilla columns a summary without :func:`attach_reference` lacks (left empty).
_REFERENCE_COLUMNS: tuple[str, ...] = SUMMARY_CSV_COLUMNS[11:23]
#: Columns after them that a summary may lack (left empty).
_LATER_COLUMNS: tuple[str, ...] = SUMMARY_CSV_COLUMNS[23:]

#: Columns of the DataFrame :func:`summarize` returns.
SUMMARY_COLUMNS: tuple[str, ...] = (
    "build", "mode", "n", "median_ms", "mean_ms", "variance", "std_ms",
    "overhead_pct", "ci_low_pct", "ci_high_pct",
    "overhead_median_pct", "overhead_mean_pct", "center", "paired", "ci_method", "metric",
    "q25_ms", "overhead_q25_pct", "backends", "between_share_pct",
)

# Modes in the order the seed presents them (Query-1, -2, -3); others follow sorted.
_MODE_ORDER = ("plain", "analyze_notiming", "analyze_timing")


@dataclass(frozen=True)
class BootstrapCI:
    """A bootstrap confidence interval of a statistic and how it was obtained."""

    low: float
    high: float
    method: str  # "BCa", "percentile" (fallback when BCa is degenerate) or "none"
    paired: bool


def cell_rng(seed: int, *parts: str) -> np.random.Generator:
    """A generator seeded from *seed* and the cell's name.

    Each (build, mode) cell gets its own stream, so adding a build to a run does not
    change the intervals of the others (a single shared generator would).
    """
    key = zlib.crc32("\0".join(parts).encode())
    return np.random.default_rng([seed, key])


def _center_fn(center: Center) -> Callable[..., np.ndarray]:
    if center == "median":
        return np.median
    if center == "mean":
        return np.mean
    raise ComparisonError(f"center must be 'median' or 'mean', not {center!r}")


def _pct(new: np.ndarray | float, base: np.ndarray | float) -> np.ndarray | float:
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.asarray(new) - base) / base * 100.0


def bootstrap(
    samples: Sequence[np.ndarray],
    statistic: Callable[..., np.ndarray],
    *,
    paired: bool,
    rng: np.random.Generator,
    confidence: float,
    n_resamples: int,
) -> BootstrapCI:
    """Run scipy's bootstrap; fall back to the percentile method when BCa degenerates.

    BCa needs a jackknife with spread; with tiny or tied samples (integer milliseconds,
    identical instruction counts) it returns NaN and warns, and the percentile interval
    is then the honest answer.
    """
    if min(len(s) for s in samples) < 2:
        return BootstrapCI(math.nan, math.nan, "none", paired)
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sps.DegenerateDataWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            res = sps.bootstrap(
                tuple(samples), statistic, paired=paired, vectorized=True, axis=-1,
                confidence_level=confidence, n_resamples=n_resamples, method=method,
                rng=rng,
            )
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return BootstrapCI(lo, hi, method, paired)
    # Both degenerate: every resample gives the same value (e.g. constant samples).
    value = float(statistic(*[s[np.newaxis, :] for s in samples], axis=-1)[0])
    return BootstrapCI(value, value, "degenerate", paired)


#: Below this many backends the hierarchical percentile interval under-covers badly
#: (simulated, bare: 0.70 with 2, 0.86 with 3; 0.90-0.94 with 4-5, 0.93-0.97 with 6-8;
#: widened by :func:`small_sample_factor` it still needs 4 to reach 0.945).
MIN_HIER_BACKENDS = 4

#: Below this many repetitions in a sample, a bootstrap interval of a median is far
#: narrower than its level says (with 3 values the percentile interval is their range,
#: which holds the true median 75 % of the time), so a build-to-build comparison draws
#: no verdict from it (:attr:`BuildComparison.overhead_differs`): see
#: ``benchmarks/small_n_intervals.py`` for how often two identical builds were called
#: different at each n.
MIN_VERDICT_REPS = 4


_TOO_FEW_REPS = re.compile(r"\((\d+) repetitions: too few")


def too_few_reps(method: str, n: int, minimum: int = MIN_VERDICT_REPS) -> str:
    """*method* marked "too few" when its interval came from *n* < *minimum* (default
    :data:`MIN_VERDICT_REPS`) repetitions (nothing is marked twice).  ``"none"`` (no
    interval: fewer values than a bootstrap needs) is marked too when 0 < *n* < *minimum*,
    so a table shows "too few (n = N)" beside the estimate, not a bare number; with no
    value at all it is left alone."""
    if n >= minimum or "too few" in method or (method == "none" and n < 1):
        return method
    if method == "none":
        return f"none ({n} repetitions: too few for an interval)"
    return f"{method} ({n} repetitions: too few, interval too narrow)"


#: How far below the plain query (percent) a mode's whole overhead interval must lie before
#: the plain executions are called suspect (:func:`plain_suspect`).
PLAIN_SUSPECT_PCT = 5.0


def plain_suspect(label: str, mode: str, overhead_pct: object, low: object, high: object,
                  limit_pct: float = PLAIN_SUSPECT_PCT) -> str | None:
    """A sentence when *mode* (an EXPLAIN ANALYZE mode of build or arm *label*) ran faster
    than its own plain query beyond noise: its whole overhead interval [*low*, *high*]
    lies below -*limit_pct* %.  EXPLAIN ANALYZE runs the same plan and counts rows (and
    reads clocks) on top of it; all it saves is sending the result rows.  Unless the
    query returns many rows, the plain executions then did work that was not the
    query's, and every overhead of that build rests on them: the reader is told instead
    of reading a negative cost.  Seen twice here: one backend's plain executions all
    ~1.7x slow in a bench run, all ~2x in a timing-accuracy run, their EXPLAIN ones not.
    The interval decides, not the medians: a build whose Query-2 costs next to nothing
    (step5: -0.16 % in instructions) can have its plain median above its Query-2 median
    by noise alone.  None when the interval does not say so (or is missing)."""
    try:
        ov, lo, hi = float(overhead_pct), float(low), float(high)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if mode == BASELINE_MODE or not all(math.isfinite(x) for x in (ov, lo, hi)) \
            or hi >= -limit_pct:
        return None
    return (f"{label}: {mode} ran {-ov:.1f} % faster than the plain query [95 % interval "
            f"{lo:+.1f}, {hi:+.1f} %]. EXPLAIN ANALYZE runs the same plan and more, and "
            "saves only sending the result rows: unless the query returns many rows, "
            f"{label}'s plain executions did work that was not the query's (another "
            "process on its CPU, a probe on that binary, another plan), and its overheads "
            "rest on them; measure it again")


def time_below_instructions(label: str, mode: str, overhead_pct: object, low: object,
                            high: object, instr_overhead_pct: object,
                            limit_pct: float = PLAIN_SUSPECT_PCT) -> str | None:
    """A sentence when *mode*'s time overhead interval lies wholly below 0 (but not so far
    that :func:`plain_suspect` speaks) while the same mode runs at least as many
    instructions as the plain query (*instr_overhead_pct* ≥ 0): a negative cost read
    from the time alone.  A warm ``make demo`` here printed step4's Query-2 at −5.31 %
    [−11.10, −2.10] beside +2.27 % in instructions, without a word.  What can read so:
    one binary's plain and EXPLAIN paths run different code, placed differently in its
    layout, and its backends differ (docs/benchmark.md: the same code's CPU time moved by
    several percent between layouts); the sentence names them and does not say which it
    was.  None otherwise."""
    try:
        ov, lo, hi, ins = (float(x) for x in (overhead_pct, low, high,  # type: ignore[arg-type]
                                               instr_overhead_pct))
    except (TypeError, ValueError):
        return None
    if mode == BASELINE_MODE or not all(math.isfinite(x) for x in (ov, lo, hi, ins)) \
            or hi >= 0 or hi < -limit_pct or ins < 0:
        return None
    return (f"{label}: {mode} reads {ov:+.2f} % [{lo:+.2f}, {hi:+.2f}] against the plain "
            f"query by time while it runs {ins:+.2f} % more instructions: a saving the "
            "instructions do not show; the binary's code layout (its plain and EXPLAIN paths "
            "run different code) or its backends can read so (--layouts K resamples "
            "layouts)")


def too_few_count(method: object) -> int | None:
    """The repetitions :func:`too_few_reps` marked in a ``ci_method`` (None: not marked)."""
    m = _TOO_FEW_REPS.search(str(method or ""))
    return int(m.group(1)) if m else None


def small_sample_factor(k: int, n: int, share_pct: float, confidence: float = 0.95) -> float:
    """How much wider a hierarchical percentile interval from *k* backends and *n* values
    must be drawn to hold its level: the bootstrap's variance over *k* resampled backends
    is (k − 1) / k of the unbiased one, and its normal-like tails ignore that the between
    part rests on k − 1 degrees of freedom.  With *share_pct* % of the interval's variance
    between backends (s), the between part is scaled by k / (k − 1) and the quantile is
    Student's at Satterthwaite's degrees of freedom, 1 / (s² / (k − 1) + (1 − s)² /
    (n − k)): k − 1 when the backends hold all the variance, n − k when they hold none.
    The factor is sqrt(s·k/(k − 1) + 1 − s) · t(df) / z.  Simulated (12 values, 4-8
    backends, between-backend spread 0.5-4 times the within): the plain percentile
    interval covered 0.86-0.96 (0.87 with 4 backends and a large between part, as on this
    VM, whose A/A intervals excluded 0 in 11 of 110 runs), the widened one 0.94-0.98
    (``benchmarks/hier_small_k.py``, ``benchmarks/results/hier_small_k-20261206.txt``).
    1.0 with fewer than 2 backends; a missing share counts as all between (the wider)."""
    if k < 2:
        return 1.0
    sh = share_pct / 100.0 if math.isfinite(share_pct) else 1.0
    sh = min(max(sh, 0.0), 1.0)
    var = sh * k / (k - 1) + (1.0 - sh)
    inv = sh * sh / (k - 1) + ((1.0 - sh) ** 2 / (n - k) if n > k else 0.0)
    df = 1.0 / inv if inv > 0 else float(k - 1)
    q = 1.0 - (1.0 - confidence) / 2.0
    return float(math.sqrt(var) * sps.t.ppf(q, df) / sps.norm.ppf(q))


def _between_share(hier: np.ndarray, within: np.ndarray) -> float:
    """100 × (1 − var(*within*) / var(*hier*)), floored at 0: the share of the resampled
    statistic's variance that lies between backends (*within*: resamples with every
    backend held fixed)."""
    vt, vw = float(np.nanvar(hier)), float(np.nanvar(within))
    return max(0.0, 1.0 - vw / vt) * 100.0 if vt > 0 else 0.0


def _widen(dist: np.ndarray, lo: float, hi: float, k: int, n: int, share_pct: float,
           confidence: float) -> tuple[float, float]:
    """[*lo*, *hi*] widened by :func:`small_sample_factor` about the median of the
    resampled statistics *dist* (each side keeps its own length: the skew of the
    percentile interval stays)."""
    f = small_sample_factor(k, n, share_pct, confidence)
    c = float(np.nanmedian(dist))
    return c - (c - lo) * f, c + (hi - c) * f


def hierarchical_bootstrap(
    groups: Sequence[np.ndarray],
    statistic: Callable[..., np.ndarray] = np.median,
    *,
    rng: np.random.Generator,
    confidence: float = 0.95,
    n_resamples: int = 4000,
    widen: bool = True,
) -> tuple[BootstrapCI, float]:
    """Percentile interval of *statistic* over two-level data, and the between share.

    *groups*: one array of per-repetition values per backend. Each resample draws
    ``len(groups)`` backends with replacement, then within each its repetitions with
    replacement; *statistic(values, axis=-1)* of the pooled draw (NaN-aware: groups of
    unequal size are padded). Returns the interval and ``between_share_pct``: 100 × (1 −
    var of the resamples with the backends held fixed / var of the hierarchical ones),
    floored at 0 (NaN with fewer than two backends).  *widen* (default): the interval is
    widened for the few backends it rests on (:func:`small_sample_factor`, about the
    resamples' median); False gives the bare percentile interval (for comparisons).
    """
    gs = [np.asarray(g, dtype="float64") for g in groups if len(g)]
    k = len(gs)
    if k < 2 or sum(len(g) for g in gs) < 3:
        return BootstrapCI(math.nan, math.nan, "none", True), math.nan
    sizes = np.array([len(g) for g in gs])
    nmax = int(sizes.max())
    arr = np.full((k, nmax), np.nan)
    for i, g in enumerate(gs):
        arr[i, :len(g)] = g
    nan_stat = {np.median: np.nanmedian, np.mean: np.nanmean}.get(statistic, statistic)

    def draw(chosen: np.ndarray) -> np.ndarray:
        n = sizes[chosen]                                   # (B, K)
        j = (rng.random((*chosen.shape, nmax)) * n[..., None]).astype(np.int64)
        vals = arr[chosen[..., None], j]                    # (B, K, nmax)
        vals[np.arange(nmax)[None, None, :] >= n[..., None]] = np.nan
        return nan_stat(vals.reshape(len(chosen), -1), axis=-1)

    hier = draw(rng.integers(k, size=(n_resamples, k)))
    within = draw(np.broadcast_to(np.arange(k), (n_resamples, k)).copy())
    alpha = (1 - confidence) / 2
    lo, hi = (float(x) for x in np.nanquantile(hier, [alpha, 1 - alpha]))
    share = _between_share(hier, within)
    if widen:  # few backends: the percentile interval is too narrow (small_sample_factor)
        lo, hi = _widen(hier, lo, hi, k, int(sizes.sum()), share, confidence)
    method = "hierarchical" if k >= MIN_HIER_BACKENDS else \
        f"hierarchical ({k} backends: too few, interval too narrow)"
    return BootstrapCI(lo, hi, method, True), share


def _check_timings(timings: pd.DataFrame, metric: str) -> pd.DataFrame:
    if not isinstance(timings, pd.DataFrame):
        raise ComparisonError(
            f"timings must be a pandas DataFrame (the 'timings' table), not {type(timings).__name__}"
        )
    if metric not in ("server_ms", "client_ms"):
        raise ComparisonError(f"metric must be 'server_ms' or 'client_ms', not {metric!r}")
    df = tables.validate(timings, "timings")
    workloads = sorted(df["workload"].dropna().unique())
    if len(workloads) > 1:
        raise ComparisonError(
            f"timings mix workloads {workloads}; overheads compare modes of one workload: "
            "filter first, e.g. timings[timings.workload == 'nested_loop']"
        )
    return df[df[metric].notna()]


def _keyed(df: pd.DataFrame, metric: str) -> pd.Series:
    """Metric values indexed by (run_id, rep) in repetition order."""
    s = df.sort_values(["run_id", "rep", "order"]).set_index(["run_id", "rep"])[metric]
    return s.astype("float64")


def _pair(base: pd.Series, other: pd.Series, common: bool = False
          ) -> tuple[np.ndarray, np.ndarray, bool]:
    """Align two samples by (run_id, rep) when they pair one-to-one (see module doc).

    *common*: pair on the repetitions both samples have (when at least 2), dropping
    the others — for a sample some of whose executions were rejected on purpose
    (:func:`vcpu_adjust`), not lost by accident.
    """
    if common and base.index.is_unique and other.index.is_unique:
        keys = [k for k in base.index if k in set(other.index)]
        if len(keys) >= 2:
            return base.reindex(keys).to_numpy(), other.reindex(keys).to_numpy(), True
    if (
        base.index.is_unique
        and other.index.is_unique
        and len(base) == len(other)
        and set(base.index) == set(other.index)
    ):
        other = other.reindex(base.index)
        return base.to_numpy(), other.to_numpy(), True
    return base.to_numpy(), other.to_numpy(), False


def _paired_keys(base: pd.Series, other: pd.Series, common: bool) -> list[Any]:
    """The (run_id, rep) keys :func:`_pair` pairs on (when it pairs)."""
    if common and base.index.is_unique and other.index.is_unique:
        keys = [k for k in base.index if k in set(other.index)]
        if len(keys) >= 2:
            return keys
    return list(base.index)


def _backend_of(df: pd.DataFrame) -> pd.Series:
    """(run_id, rep) -> the backend (1..K) that ran it; 1 for runs without the column."""
    idx = pd.MultiIndex.from_frame(df[["run_id", "rep"]])
    if "backend" not in df.columns:
        return pd.Series(1, index=idx).groupby(level=[0, 1]).first()
    b = pd.to_numeric(df["backend"], errors="coerce").fillna(1).astype("int64")
    return pd.Series(b.to_numpy(), index=idx).groupby(level=[0, 1]).first()


def _mode_sort_key(mode: str) -> tuple[int, str]:
    return (_MODE_ORDER.index(mode) if mode in _MODE_ORDER else len(_MODE_ORDER), mode)


def build_order(builds: Sequence[str]) -> list[str]:
    """Builds in the seed's order (vanilla, step1 … step5), others after, sorted; labels
    of another major (``pg19-vanilla``, ``pg19/step3``) after those of the default one,
    in the same order within their major."""
    import re

    known = ("vanilla", "step1", "step2", "step3", "step4", "step5")

    def key(b: str) -> tuple[int, str, int, str]:
        m = re.match(r"^pg(\d+)[-/](.+)$", b)
        major, base = (m.group(1), m.group(2)) if m else ("", b)
        return (1 if major else 0, major, known.index(base) if base in known else len(known),
                base)

    return sorted(dict.fromkeys(builds), key=key)


def summarize(
    timings: pd.DataFrame,
    metric: Metric = "server_ms",
    *,
    center: Center = "median",
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 20250801,
    pair: Literal["auto", "never", "common"] = "auto",
) -> pd.DataFrame:
    """Per build and mode: n, mean, sample variance, median and overhead vs plain.

    Returns one row per (build, mode) with :data:`SUMMARY_COLUMNS`:

    - ``variance`` is the sample variance (ddof=1, as the seed reports), in ms².
    - ``overhead_pct`` is the overhead by *center* (median by default) with its
      bootstrap CI ``ci_low_pct``/``ci_high_pct``; ``overhead_median_pct`` and
      ``overhead_mean_pct`` give both definitions. For ``plain`` it is 0 and the CI
      is empty (NaN).
    - ``paired`` tells whether the CI resampled repetitions jointly (module doc);
      *pair* ``"common"`` pairs on the repetitions both samples have (rejected
      executions, :func:`vcpu_adjust`).
    - ``q25_ms`` is the lower quartile of the times and ``overhead_q25_pct`` the
      overhead by it (ratio of the lower quartiles): a slow vCPU only ever adds time, so
      the lower quantile is the least disturbed measure beside the median.

    Raises :class:`ComparisonError` when a build has non-plain rows but no plain rows
    (an overhead needs its baseline) or when the timings mix workloads.
    An empty table gives an empty summary with the columns.
    """
    stat_fn = _center_fn(center)
    df = _check_timings(timings, metric)
    if df.empty:
        return _empty_summary()
    if pair not in ("auto", "never", "common"):
        raise ComparisonError(f"pair must be 'auto', 'never' or 'common', not {pair!r}")

    def ratio_stat(base: np.ndarray, other: np.ndarray, axis: int = -1) -> np.ndarray:
        return _pct(stat_fn(other, axis=axis), stat_fn(base, axis=axis))

    def paired_stat(base: np.ndarray, other: np.ndarray, axis: int = -1) -> np.ndarray:
        return stat_fn(_pct(other, base), axis=axis)

    rows: list[dict[str, object]] = []
    for build in build_order(df["build"].unique().tolist()):
        bdf = df[df["build"] == build]
        modes = sorted(bdf["mode"].unique(), key=_mode_sort_key)
        base_df = bdf[bdf["mode"] == BASELINE_MODE]
        if base_df.empty:
            raise ComparisonError(
                f"build {build!r} has rows for modes {modes} but none for {BASELINE_MODE!r}: "
                "an overhead needs the plain query of the same build; re-run the benchmark "
                "with the plain mode included"
            )
        base = _keyed(base_df, metric)
        backend_of = _backend_of(bdf)
        n_backends = int(backend_of.nunique())
        for mode in modes:
            cur = _keyed(bdf[bdf["mode"] == mode], metric)
            vals = cur.to_numpy()
            n = len(vals)
            row: dict[str, object] = {
                "build": build, "mode": mode, "n": n,
                "median_ms": float(np.median(vals)),
                "q25_ms": float(np.quantile(vals, 0.25)),
                "mean_ms": float(np.mean(vals)),
                "variance": float(np.var(vals, ddof=1)) if n > 1 else math.nan,
                "std_ms": float(np.std(vals, ddof=1)) if n > 1 else math.nan,
                "center": center, "metric": metric,
                "backends": n_backends, "between_share_pct": math.nan,
            }
            if mode == BASELINE_MODE:
                row.update(
                    overhead_pct=0.0, ci_low_pct=math.nan, ci_high_pct=math.nan,
                    overhead_median_pct=0.0, overhead_mean_pct=0.0, overhead_q25_pct=0.0,
                    paired=False, ci_method="none",
                )
            else:
                b, o, paired = _pair(base, cur, common=pair == "common")
                paired = paired and pair != "never"
                stat = paired_stat if paired else ratio_stat
                rng = cell_rng(seed, build, mode, metric, center)
                ids = (backend_of.reindex(_paired_keys(base, cur, pair == "common"))
                       .fillna(1).to_numpy() if paired else np.ones(0))
                if paired and len(np.unique(ids)) >= 2:
                    r = np.asarray(_pct(o, b))
                    # 4000 resamples, or enough for ~20 in each tail of a high level
                    ci, share = hierarchical_bootstrap(
                        [r[ids == g] for g in np.unique(ids)], stat_fn, rng=rng,
                        confidence=confidence,
                        n_resamples=min(n_resamples, max(4000, int(40 / (1 - confidence)))))
                    row["between_share_pct"] = share
                else:
                    ci = bootstrap((b, o), stat, paired=paired, rng=rng,
                                   confidence=confidence, n_resamples=n_resamples)
                row.update(
                    overhead_pct=float(stat(b, o)),
                    ci_low_pct=ci.low, ci_high_pct=ci.high,
                    overhead_median_pct=float(_pct(np.median(o), np.median(b))),
                    overhead_mean_pct=float(_pct(np.mean(o), np.mean(b))),
                    overhead_q25_pct=float(_pct(np.quantile(o, 0.25), np.quantile(b, 0.25))),
                    paired=ci.paired,
                    ci_method=too_few_reps(ci.method, min(len(b), len(o))),
                )
            rows.append(row)
    out = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    return out.astype({"n": "int64", "paired": "bool", "backends": "int64"})


def _empty_summary() -> pd.DataFrame:
    out = pd.DataFrame({c: pd.Series(dtype="float64") for c in SUMMARY_COLUMNS})
    return out.astype({
        "build": "string", "mode": "string", "n": "int64", "center": "string",
        "paired": "bool", "ci_method": "string", "metric": "string", "backends": "int64",
    })


@dataclass(frozen=True)
class BuildComparison:
    """Whether build *b* differs from build *a* in one mode.

    ``time_*``: the mode's per-execution times of the two builds (Mann–Whitney U,
    two-sided, and the ratio of medians b/a).
    ``overhead_*``: overhead % of the mode over each build's own plain query, and the
    bootstrap CI of the difference b − a in percentage points. ``overhead_p_value`` is a
    Mann–Whitney U test on per-repetition overheads (mode_r / plain_r − 1), available
    when each build's samples pair by repetition. For ``mode == "plain"`` the overhead
    fields are NaN.
    """

    a: str
    b: str
    mode: str
    metric: str
    n_a: int
    n_b: int
    median_a_ms: float
    median_b_ms: float
    time_ratio: float
    time_u: float
    time_p_value: float
    overhead_a_pct: float
    overhead_b_pct: float
    overhead_diff_pct: float
    diff_ci_low_pct: float
    diff_ci_high_pct: float
    overhead_p_value: float
    paired: bool
    ci_method: str
    confidence: float = 0.95

    @property
    def overhead_differs(self) -> bool:
        """True when the CI of the overhead difference excludes zero and, where the
        per-repetition overheads give one, the rank test agrees (``overhead_p_value``
        below 1 − confidence); never on an interval from too few backends or
        repetitions to be trusted.  The bootstrap interval of a median from a few
        repetitions is too narrow: alone, it called two identical builds different in
        7.5-11 % of simulated runs with 5 repetitions and 3.5-8 % with 6-12
        (``benchmarks/small_n_intervals.py``)."""
        lo, hi = self.diff_ci_low_pct, self.diff_ci_high_pct
        rank_disagrees = (math.isfinite(self.overhead_p_value)
                          and self.overhead_p_value >= round(1 - self.confidence, 9))
        return (math.isfinite(lo) and math.isfinite(hi) and (lo > 0 or hi < 0)
                and "too few" not in self.ci_method and not rank_disagrees)

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["overhead_differs"] = self.overhead_differs
        return d


def compare_builds(
    timings: pd.DataFrame,
    a: str,
    b: str,
    mode: str = "analyze_notiming",
    metric: Metric = "server_ms",
    *,
    center: Center = "median",
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 20250801,
    pair: Literal["auto", "common"] = "auto",
) -> BuildComparison:
    """Test whether builds *a* and *b* differ in *mode*: times and overhead over plain.

    Overheads are estimated as in :func:`summarize`: when each build's plain and mode
    samples pair by repetition, from per-repetition overheads (resampled jointly across
    the two builds when they ran in the same repetitions); otherwise as ratios of
    medians with the four samples resampled independently (``paired`` False).  *pair*
    ``"common"`` pairs each build's plain and mode on the repetitions both kept, as
    :func:`summarize` does for ``cpu_kept_ms`` (executions rejected on purpose), so
    that the two tables give one build the same overhead.
    """
    if pair not in ("auto", "common"):
        raise ComparisonError(f"pair must be 'auto' or 'common', not {pair!r}")
    common = pair == "common"
    stat_fn = _center_fn(center)
    df = _check_timings(timings, metric)
    for name in (a, b):
        if name not in set(df["build"]):
            known = build_order(df["build"].unique().tolist())
            raise ComparisonError(f"no timings for build {name!r}; builds present: {known}")
    if a == b:
        raise ComparisonError(f"compare two different builds, not {a!r} with itself")

    def sample(build: str, m: str) -> pd.Series:
        s = _keyed(df[(df["build"] == build) & (df["mode"] == m)], metric)
        if s.empty:
            raise ComparisonError(
                f"build {build!r} has no {m!r} timings; modes present: "
                f"{sorted(df.loc[df['build'] == build, 'mode'].unique())}"
            )
        return s

    ma, mb = sample(a, mode), sample(b, mode)
    va, vb = ma.to_numpy(), mb.to_numpy()
    if len(va) >= 1 and len(vb) >= 1:
        mw = sps.mannwhitneyu(va, vb, alternative="two-sided")
        u, p = float(mw.statistic), float(mw.pvalue)
    else:  # pragma: no cover - sample() guarantees non-empty
        u = p = math.nan
    med_a, med_b = float(np.median(va)), float(np.median(vb))

    nan = math.nan
    ov_a = ov_b = diff = lo = hi = p_ov = nan
    paired, method = False, "none"
    if mode != BASELINE_MODE:
        pa, pb = sample(a, BASELINE_MODE), sample(b, BASELINE_MODE)
        pa_arr, ma_arr, ok_a = _pair(pa, ma, common)
        pb_arr, mb_arr, ok_b = _pair(pb, mb, common)
        rng = cell_rng(seed, a, b, mode, metric, center)
        if ok_a and ok_b:
            # Same estimator as summarize(): per-repetition overheads within each build.
            # They are the units resampled; jointly when both builds ran in the same
            # repetitions (interleaved), else each build's independently.
            r_a = pd.Series(_pct(ma_arr, pa_arr), index=_paired_keys(pa, ma, common))
            r_b = pd.Series(_pct(mb_arr, pb_arr), index=_paired_keys(pb, mb, common))
            ra, rb, joint = _pair(r_a, r_b)

            def diff_rep(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
                return stat_fn(y, axis=axis) - stat_fn(x, axis=axis)

            ov_a, ov_b = float(stat_fn(ra)), float(stat_fn(rb))
            ids = (_backend_of(df[df["build"] == a]).reindex(r_a.index).fillna(1).to_numpy()
                   if joint else np.ones(0))
            if joint and len(np.unique(ids)) >= 2:
                # backends, then repetitions (module doc): the comparison's interval
                # carries the between-backend variance as summarize()'s does
                xa, xb = _resample_pairs(ra, rb, ids, rng, min(n_resamples, 4000))
                nan_fn = np.nanmedian if center == "median" else np.nanmean
                boot = nan_fn(xb, axis=-1) - nan_fn(xa, axis=-1)
                alpha = (1 - confidence) / 2
                lo_, hi_ = (float(x) for x in np.nanquantile(boot, [alpha, 1 - alpha]))
                k = len(np.unique(ids))
                # the backends held fixed: the share of the variance between them, and
                # the small-sample widening the summary's intervals get too
                wa, wb = _resample_pairs(ra, rb, ids, rng, min(n_resamples, 4000),
                                         fixed=True)
                within = nan_fn(wb, axis=-1) - nan_fn(wa, axis=-1)
                lo_, hi_ = _widen(boot, lo_, hi_, k, len(ra), _between_share(boot, within),
                                  confidence)
                ci = BootstrapCI(lo_, hi_, "hierarchical" if k >= MIN_HIER_BACKENDS else
                                 f"hierarchical ({k} backends: too few, interval too narrow)",
                                 True)
            else:
                ci = bootstrap((ra, rb), diff_rep, paired=joint, rng=rng,
                               confidence=confidence, n_resamples=n_resamples)
            p_ov = float(sps.mannwhitneyu(ra, rb, alternative="two-sided").pvalue)
            paired = True
            smallest = min(len(ra), len(rb))
        else:
            ov_a = float(_pct(stat_fn(va), stat_fn(pa.to_numpy())))
            ov_b = float(_pct(stat_fn(vb), stat_fn(pb.to_numpy())))

            def diff_ratio(p_a: np.ndarray, m_a: np.ndarray, p_b: np.ndarray,
                           m_b: np.ndarray, axis: int = -1) -> np.ndarray:
                oa = _pct(stat_fn(m_a, axis=axis), stat_fn(p_a, axis=axis))
                ob = _pct(stat_fn(m_b, axis=axis), stat_fn(p_b, axis=axis))
                return ob - oa

            ci = bootstrap([pa.to_numpy(), va, pb.to_numpy(), vb], diff_ratio, paired=False,
                           rng=rng, confidence=confidence, n_resamples=n_resamples)
            paired = False
            smallest = min(len(pa), len(va), len(pb), len(vb))
        diff = ov_b - ov_a
        lo, hi = ci.low, ci.high
        method = too_few_reps(ci.method, smallest)

    return BuildComparison(
        a=a, b=b, mode=mode, metric=metric, n_a=len(va), n_b=len(vb),
        median_a_ms=med_a, median_b_ms=med_b,
        time_ratio=med_b / med_a if med_a else nan,
        time_u=u, time_p_value=p,
        overhead_a_pct=ov_a, overhead_b_pct=ov_b, overhead_diff_pct=diff,
        diff_ci_low_pct=lo, diff_ci_high_pct=hi, overhead_p_value=p_ov,
        paired=paired, ci_method=method, confidence=confidence,
    )


def compare_chain(
    timings: pd.DataFrame,
    builds: Sequence[str] | None = None,
    mode: str = "analyze_notiming",
    metric: Metric = "server_ms",
    **kwargs: object,
) -> pd.DataFrame:
    """:func:`compare_builds` for each neighbouring pair (vanilla→step1→step2→step3).

    One row per pair (columns of :class:`BuildComparison` plus ``overhead_differs``):
    the question "does each step lower the overhead beyond noise?".
    """
    df = _check_timings(timings, metric)
    names = list(builds) if builds is not None else build_order(df["build"].unique().tolist())
    rows = [
        compare_builds(timings, x, y, mode, metric, **kwargs).as_dict()  # type: ignore[arg-type]
        for x, y in itertools.pairwise(names)
    ]
    cols = [*BuildComparison.__dataclass_fields__, "overhead_differs"]
    return pd.DataFrame(rows, columns=cols)


def attach_instructions(summary: pd.DataFrame, instr_counts: pd.DataFrame | None) -> pd.DataFrame:
    """Add ``instr`` and ``instr_overhead_pct`` to a :func:`summarize` table.

    *instr_counts* is an ``instr_counts`` table (one execution per row; if a
    (build, mode) was counted more than once the median is used: callgrind counts
    repeat to within a few hundred instructions). Cells without a count stay NaN;
    ``instr_overhead_pct`` = (instr(mode) − instr(plain)) / instr(plain) × 100.
    """
    out = summary.copy()
    out["instr"] = pd.array([pd.NA] * len(out), dtype="Int64")
    out["instr_overhead_pct"] = math.nan
    if instr_counts is None or instr_counts.empty or out.empty:
        return out
    ic = tables.validate(instr_counts, "instr_counts")
    ic = ic[ic["instructions"].notna()]
    per = ic.groupby(["build", "mode"])["instructions"].median().round()
    for i, row in out.iterrows():
        key = (row["build"], row["mode"])
        if key not in per.index:
            continue
        out.at[i, "instr"] = int(per[key])
        base_key = (row["build"], BASELINE_MODE)
        if base_key in per.index and per[base_key] > 0:
            out.at[i, "instr_overhead_pct"] = float(_pct(per[key], per[base_key]))
    return out


def summary_table(summary: pd.DataFrame,
                  instr_counts: pd.DataFrame | None = None) -> pd.DataFrame:
    """The ``summary.csv`` table: columns :data:`SUMMARY_CSV_COLUMNS`, rounded.

    *summary* comes from :func:`summarize`. If it already has ``instr`` columns
    (from :func:`attach_instructions`) and *instr_counts* is None they are kept.
    (Writing it is :func:`profkit.render.bench_report.write_summary_csv`.)
    """
    if "instr" not in summary.columns or instr_counts is not None:
        summary = attach_instructions(summary, instr_counts)
    summary = summary.copy()
    for c in (*_REFERENCE_COLUMNS, *_LATER_COLUMNS):
        if c not in summary.columns:
            summary[c] = math.nan if c != "note" else ""
    missing = [c for c in SUMMARY_CSV_COLUMNS if c not in summary.columns]
    if missing:
        raise ComparisonError(
            f"summary lacks columns {missing}: pass the output of profkit.analyze.stats.summarize"
        )
    out = summary.loc[:, list(SUMMARY_CSV_COLUMNS)].copy()
    out["note"] = [_with_few_reps(n, r) for n, (_i, r) in zip(out["note"], summary.iterrows(),
                                                              strict=True)]
    # Rounded so that the file is readable and diffs between runs are meaningful;
    # the DataFrame keeps full precision.
    for c, nd in (("median_ms", 4), ("mean_ms", 4), ("variance", 6), ("overhead_pct", 3),
                  ("ci_low_pct", 3), ("ci_high_pct", 3), ("instr_overhead_pct", 3),
                  ("q25_ms", 4), ("plain_median_ms", 4), ("plain_q25_ms", 4),
                  ("vs_ref_pct", 3), ("vs_ref_ci_low_pct", 3), ("vs_ref_ci_high_pct", 3),
                  ("vs_ref_instr_pct", 3), ("between_share_pct", 1),
                  ("vs_ref_between_share_pct", 1)):
        out[c] = out[c].astype("float64").round(nd)
    return out


def few_reps_text(method: object) -> str | None:
    """How a table shows an interval :func:`too_few_reps` marked: "too few (n = N)";
    None for an interval that is not marked."""
    n = too_few_count(method)
    return None if n is None else f"too few (n = {n})"


def _with_few_reps(note: object, row: pd.Series) -> str:
    """summary.csv's ``note`` of *row*, plus which of its intervals rest on fewer than
    :data:`MIN_VERDICT_REPS` repetitions (the file has no ``ci_method``: a reader of its
    ``ci_low_pct``/``vs_ref_ci_low_pct`` learns it here)."""
    text = "" if note is None or (isinstance(note, float) and math.isnan(note)) else str(note)
    bits = [text] if text else []
    for what, col in (("overhead", "ci_method"), ("vs_ref", "vs_ref_ci_method")):
        n = too_few_count(row.get(col))
        if n is not None:
            bits.append(f"{what} interval from {n} repetitions (fewer than "
                        f"{MIN_VERDICT_REPS}: covers well under its level)")
    return "; ".join(bits)


# --------------------------------------------------------------------------- against vanilla


def pg_major(version: object) -> str:
    """``"18"`` from ``"PostgreSQL 18.6"``, ``"18.6"`` or ``"19beta1"`` ('' if none)."""
    import re

    m = re.search(r"(\d+)", str(version or "").replace("PostgreSQL", ""))
    return m.group(1) if m else ""


def vanilla_references(builds: dict[str, dict[str, Any]]) -> dict[str, str]:
    """build label -> the label of the vanilla build of the same PostgreSQL major.

    *builds*: label -> ``{"preset": ..., "version": ..., "arm_settings": {...}}`` (the
    bench provenance's ``builds``). A vanilla build is one whose preset is ``vanilla``
    or ``pgNN/vanilla``; among several of one major, the first without settings of its
    own in :func:`build_order` is the reference. Builds of a major without a vanilla
    build get none.
    """
    refs: dict[str, str] = {}
    order = build_order(list(builds))
    for major in dict.fromkeys(pg_major(builds[b].get("version")) for b in order):
        cands = [b for b in order if pg_major(builds[b].get("version")) == major
                 and str(builds[b].get("preset", "")).split("/")[-1] == "vanilla"]
        if not cands:
            continue
        plain = [b for b in cands if not builds[b].get("arm_settings")]
        ref = (plain or cands)[0]
        for b in order:
            if pg_major(builds[b].get("version")) == major:
                refs[b] = ref
    return refs


def reference_comparisons(builds: Sequence[str], modes: Sequence[str],
                          refs: Sequence[object]) -> int:
    """How many against-reference intervals rows (*builds*, *modes*, their reference
    builds *refs*) hold: every row with a reference, but the reference's own plain
    query. :func:`attach_reference` draws that many; a report counts them again from a
    summary's ``ref_build`` column."""
    return sum(1 for b, m, r in zip(builds, modes, refs, strict=True)
               if isinstance(r, str) and not (r == b and m == BASELINE_MODE))


def simultaneous_level(confidence: float, k: int) -> float:
    """The level of each of *k* intervals that hold together with *confidence*
    (Bonferroni: 1 − (1 − confidence) / k)."""
    return 1.0 - (1.0 - confidence) / max(k, 1)


def attach_reference(summary: pd.DataFrame, timings: pd.DataFrame,
                     builds: dict[str, dict[str, Any]], instr_counts: pd.DataFrame | None,
                     metric: str | None = None, *, simultaneous: bool = True,
                     **kwargs: Any) -> pd.DataFrame:
    """Add the against-vanilla columns (:data:`SUMMARY_CSV_COLUMNS` from ``pg_version`` on).

    ``vs_ref_pct`` [``vs_ref_ci_low_pct``, ``vs_ref_ci_high_pct``]: the mode's time
    against the reference vanilla build's plain Query-1 (:func:`vanilla_references`),
    computed like ``overhead_pct`` (paired by repetition: the builds are interleaved),
    by *metric* (default: :func:`default_metric`); for the plain row it is what the
    build costs a query that is not explained. ``vs_ref_instr_pct``: the same in
    instructions (callgrind). *kwargs* go to :func:`summarize` (center, seed, ...).

    *simultaneous* (default): the table's intervals hold together. A run of six builds
    has 17 of them; at 95 % each, about one in six such tables would show an interval
    that excludes 0 for two builds that differ in nothing (and a cold demo did: step5's
    Query-2, −0.16 % in instructions, +6.5 % [1.2, 74.0] against vanilla's plain query).
    So each interval is drawn at :func:`simultaneous_level` of *confidence* (default 95 %)
    over :func:`reference_comparisons`: the chance that any of them misses is at most
    1 − *confidence* when each one holds its own level. ``out.attrs`` keeps the family
    (``vs_ref_family``) and each interval's level (``vs_ref_level``). False: each
    interval at *confidence* alone.
    """
    out = summary.copy()
    confidence = float(kwargs.pop("confidence", 0.95))
    refs = vanilla_references(builds)
    family = reference_comparisons(summary["build"], summary["mode"],
                                   [refs.get(b) for b in summary["build"]])
    level = simultaneous_level(confidence, family) if simultaneous else confidence
    out.attrs.update(vs_ref_family=family, vs_ref_level=level, vs_ref_confidence=confidence,
                     vs_ref_simultaneous=simultaneous)
    metric = metric or default_metric(timings)
    per = None
    if instr_counts is not None and not instr_counts.empty:
        ic = tables.validate(instr_counts, "instr_counts")
        per = ic[ic["instructions"].notna()].groupby(["build", "mode"])["instructions"].median()
    frame, col = metric_frame(timings, metric)
    if metric == "cpu_kept_ms":
        kwargs.setdefault("pair", "common")
    plain_rows = out[out["mode"] == BASELINE_MODE].set_index("build")
    out["vs_ref_between_share_pct"] = math.nan
    out["vs_ref_ci_method"] = pd.Series(["none"] * len(out), index=out.index, dtype="object")
    for c in _REFERENCE_COLUMNS:
        if c in ("q25_ms", "metric") and c in out.columns:
            continue  # from summarize
        out[c] = pd.Series([pd.NA] * len(out), dtype="object") if c in (
            "pg_version", "preset", "metric", "ref_build") else math.nan
    for i, row in out.iterrows():
        b, mode = row["build"], row["mode"]
        info = builds.get(b, {})
        out.at[i, "pg_version"] = info.get("version") or pd.NA
        out.at[i, "preset"] = info.get("preset") or pd.NA
        if b in plain_rows.index:
            pr = plain_rows.loc[b]
            out.at[i, "plain_median_ms"] = pr["median_ms"]
            out.at[i, "plain_q25_ms"] = pr.get("q25_ms", math.nan)
            if per is not None and (b, BASELINE_MODE) in per.index:
                out.at[i, "plain_instr"] = float(per[(b, BASELINE_MODE)])
        ref = refs.get(b)
        if ref is None:
            continue
        out.at[i, "ref_build"] = ref
        if per is not None and (b, mode) in per.index and (ref, BASELINE_MODE) in per.index:
            out.at[i, "vs_ref_instr_pct"] = float(_pct(per[(b, mode)], per[(ref, BASELINE_MODE)]))
        if ref == b and mode == BASELINE_MODE:
            out.at[i, "vs_ref_pct"] = 0.0
            continue
        r = against_plain_of(frame, col, ref, b, mode, confidence=level, **kwargs)
        if r is None:
            continue
        out.at[i, "vs_ref_pct"] = r["overhead_pct"]
        out.at[i, "vs_ref_ci_low_pct"] = r["ci_low_pct"]
        out.at[i, "vs_ref_ci_high_pct"] = r["ci_high_pct"]
        out.at[i, "vs_ref_between_share_pct"] = r["between_share_pct"]
        out.at[i, "vs_ref_ci_method"] = r["ci_method"]
    return out


def against_plain_of(frame: pd.DataFrame, col: str, ref: str, build: str, mode: str,
                     **kwargs: Any) -> pd.Series | None:
    """*build*'s *mode* against build *ref*'s plain Query-1, as :func:`summarize` draws
    an overhead (paired by repetition, hierarchical over backends): its summary row
    (``overhead_pct``, the interval, ``between_share_pct``, ``ci_method``); None when
    either sample is empty or cannot be compared.  *kwargs* go to :func:`summarize`
    (confidence, pair, ...).  The against-vanilla columns (:func:`attach_reference`)
    and A/A checks between two arms read it."""
    base = frame[(frame["build"] == ref) & (frame["mode"] == BASELINE_MODE)]
    cur = frame[(frame["build"] == build) & (frame["mode"] == mode)]
    if base.empty or cur.empty:
        return None
    # Labelled as the build's own cell (its name and mode: the bootstrap's stream), so
    # vanilla's Query-2 against its own plain query draws the resamples of its overhead
    # row (the same interval when not simultaneous; a wider one of the same draws when).
    label = "vs_ref" if mode == BASELINE_MODE else mode
    pair = pd.concat([base.assign(build=build), cur.assign(build=build, mode=label)])
    try:
        r = summarize(pair, col, **kwargs)  # type: ignore[arg-type]
    except ComparisonError:
        return None
    return r[r["mode"] == label].iloc[0]


# --------------------------------------------------------------------------- metrics

METRICS: tuple[str, ...] = ("cpu_ms", "server_ms", "client_ms", "cpu_norm_ms", "cpu_kept_ms")
#: Metrics computed from cpu_ms and the vCPU calibration columns (:func:`vcpu_adjust`).
VCPU_METRICS: tuple[str, ...] = ("cpu_norm_ms", "cpu_kept_ms")
CALIB_COLUMNS: tuple[str, ...] = ("calib_before_ms", "calib_after_ms")

#: Robust z above which a calibration counts as slow (median + K × 1.4826 × MAD) ...
SLOW_Z = 3.5
#: ... but never below this much above the median: calibrations within 3 % of each
#: other are one speed (the loop's own jitter here is ~1-2 %).
SLOW_MIN_EXCESS = 0.03


@dataclass(frozen=True)
class VcpuSpeed:
    """The run's vCPU calibrations and the rule that rejects executions.

    ``reference_ms``: the median calibration time (the vCPU's usual speed in this run);
    ``threshold_ms``: above it a calibration ran slow — ``max(median + z × 1.4826 ×
    MAD, median × (1 + min_excess))`` of the run's own calibrations; ``rejected``: how
    many executions had a slow calibration just before or just after (of ``n``);
    ``slow_factor_*``: how much slower the slow calibrations were than the reference.
    """

    n: int
    n_calibrations: int
    reference_ms: float
    mad_ms: float
    threshold_ms: float
    rejected: int
    slow_calibrations: int
    slow_factor_median: float
    slow_factor_max: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def describe(self) -> str:
        if self.n == 0:
            return "no vCPU calibrations recorded"
        return (f"vCPU calibration: median {self.reference_ms:.3f} ms (MAD {self.mad_ms:.3f}); "
                f"slow above {self.threshold_ms:.3f} ms: {self.slow_calibrations} of "
                f"{self.n_calibrations} calibrations "
                + (f"(median {self.slow_factor_median:.2f}x, max {self.slow_factor_max:.2f}x "
                   "the reference)" if self.slow_calibrations else "")
                + f"; {self.rejected} of {self.n} executions rejected")


def has_calibration(timings: pd.DataFrame) -> bool:
    return (all(c in timings.columns for c in (*CALIB_COLUMNS, "cpu_ms")) and len(timings) > 0
            and bool(timings[list(CALIB_COLUMNS)].notna().all(axis=None)))


def slow_threshold(calibrations: Sequence[float] | np.ndarray, *, z: float = SLOW_Z,
                   min_excess: float = SLOW_MIN_EXCESS) -> tuple[float, float, float]:
    """(median, MAD, threshold) of a run's vCPU calibrations (NaN left out): above the
    threshold ``max(median + z × 1.4826 × MAD, median × (1 + min_excess))`` a
    calibration ran slow (:class:`VcpuSpeed`). All NaN without a calibration."""
    c = np.asarray(calibrations, dtype="float64")
    c = c[~np.isnan(c)]
    if len(c) == 0:
        return math.nan, math.nan, math.nan
    ref = float(np.median(c))
    mad = float(np.median(np.abs(c - ref)))
    return ref, mad, max(ref + z * 1.4826 * mad, ref * (1.0 + min_excess))


def vcpu_adjust(timings: pd.DataFrame, *, z: float = SLOW_Z,
                min_excess: float = SLOW_MIN_EXCESS) -> tuple[pd.DataFrame, VcpuSpeed]:
    """The timings with the vCPU's speed taken into account, and the rule used.

    Every execution has a calibration just before and just after it (the same fixed
    work on the backend's CPU; its CPU time grows when the host slows the vCPU). Adds:

    - ``calib_ms``: the mean of the two; ``speed_factor``: calib_ms / the run's median
      calibration (1.8 = the vCPU ran 1.8x slower than usual);
    - ``cpu_norm_ms``: cpu_ms / speed_factor — the CPU time at the usual speed;
    - ``calib_slow``: either calibration above the threshold (:class:`VcpuSpeed`);
    - ``cpu_kept_ms``: cpu_ms, NaN where calib_slow (the execution is rejected).

    Rows without calibrations get NaN in every added column.
    """
    df = timings.copy()
    nan = math.nan
    if not all(c in df.columns for c in (*CALIB_COLUMNS, "cpu_ms")):
        for c in ("calib_ms", "speed_factor", "cpu_norm_ms", "cpu_kept_ms"):
            df[c] = nan
        df["calib_slow"] = False
        return df, VcpuSpeed(0, 0, nan, nan, nan, 0, 0, nan, nan)
    before = df["calib_before_ms"].astype("float64")
    after = df["calib_after_ms"].astype("float64")
    allc = pd.concat([before, after]).dropna().to_numpy()
    ref, mad, thr = slow_threshold(allc, z=z, min_excess=min_excess)
    calib = (before + after) / 2.0
    df["calib_ms"] = calib
    df["speed_factor"] = calib / ref
    df["cpu_norm_ms"] = df["cpu_ms"].astype("float64") / df["speed_factor"]
    slow = (before > thr) | (after > thr)
    known = before.notna() & after.notna()
    df["calib_slow"] = slow & known
    df["cpu_kept_ms"] = df["cpu_ms"].astype("float64").where(known & ~slow)
    slow_c = allc[allc > thr] if len(allc) else allc
    info = VcpuSpeed(
        n=int(known.sum()), n_calibrations=len(allc), reference_ms=ref, mad_ms=mad,
        threshold_ms=thr, rejected=int((slow & known).sum()), slow_calibrations=len(slow_c),
        slow_factor_median=float(np.median(slow_c) / ref) if len(slow_c) else nan,
        slow_factor_max=float(np.max(slow_c) / ref) if len(slow_c) else nan)
    return df, info


def default_metric(timings: pd.DataFrame) -> str:
    """``cpu_kept_ms`` when the run has vCPU calibrations (:func:`vcpu_adjust`: CPU time
    with the executions a slow vCPU disturbed left out), else ``cpu_ms`` when every row
    has it (Linux), else ``server_ms``.

    The backend's on-CPU time is the headline: on an idle machine it equals the
    server's wall time to 0.1 ms (measured here), and on a shared one it does not
    count the time the backend waited for a core — waiting that inflated plain-query
    wall times here by up to 2x under a load average of 7 and so biased the overhead.
    """
    if has_calibration(timings):
        return "cpu_kept_ms"
    if "cpu_ms" in timings.columns and len(timings) and timings["cpu_ms"].notna().all():
        return "cpu_ms"
    return "server_ms"


def metric_frame(timings: pd.DataFrame, metric: str) -> tuple[pd.DataFrame, str]:
    """(frame, column name stats understands): other time columns ride as server_ms.

    ``cpu_norm_ms`` / ``cpu_kept_ms`` are computed by :func:`vcpu_adjust` (the run must
    have the calibration columns); ``cpu_kept_ms`` leaves the rejected executions out.
    """
    if metric not in METRICS:
        raise ComparisonError(f"metric must be one of {', '.join(METRICS)}, not {metric!r}")
    if metric in ("server_ms", "client_ms"):
        return timings, metric
    if metric in VCPU_METRICS:
        if not has_calibration(timings):
            raise ComparisonError(f"{metric} needs the vCPU calibration columns "
                                  f"({', '.join(CALIB_COLUMNS)}): this run has none (recorded "
                                  "by profkit bench when it calibrates the vCPU, unless "
                                  "calibrate=False)")
        adj, _ = vcpu_adjust(timings)
        adj = adj[adj[metric].notna()]
        return adj.assign(server_ms=adj[metric].astype("float64")), "server_ms"
    if metric not in timings.columns or timings[metric].isna().any():
        raise ComparisonError(f"this run has no complete {metric} column (recorded on Linux only); "
                         "use metric='server_ms'")
    # profkit.analyze.stats knows the timings table's two time columns: feed the other
    # one in under server_ms's name and put the real name back on the result.
    return timings.assign(server_ms=timings[metric].astype("float64")), "server_ms"


def compare_chain_metric(timings: pd.DataFrame, builds: Sequence[str] | None = None,
                         mode: str = "analyze_notiming", metric: str | None = None,
                         **kwargs: Any) -> pd.DataFrame:
    """:func:`compare_chain` on any of :data:`METRICS` (default: :func:`default_metric`),
    the ``metric`` column saying which: the report's and the notebooks' step table.
    ``cpu_kept_ms`` pairs each build's plain and mode on the repetitions kept, as
    :func:`summarize_metric` does, so both give a build the same overhead."""
    metric = metric or default_metric(timings)
    frame, col = metric_frame(timings, metric)
    if metric == "cpu_kept_ms":
        kwargs.setdefault("pair", "common")
    return compare_chain(frame, builds, mode, col, **kwargs).assign(metric=metric)  # type: ignore[arg-type]


def summarize_metric(timings: pd.DataFrame, metric: str | None = None,
                     **kwargs: Any) -> pd.DataFrame:
    """:func:`profkit.analyze.stats.summarize` on any of :data:`METRICS` (default: see
    :func:`default_metric`); ``cpu_kept_ms`` pairs on the repetitions kept (pair
    ``"common"``).

    Nothing measured disappears: a (build, mode) the timings hold but the metric left
    without a value (every execution rejected by the vCPU rule) keeps its row with n = 0
    and the reason in ``note``; a build whose plain executions were all rejected keeps
    its other rows (n, medians) without an overhead, and says so.
    """
    metric = metric or default_metric(timings)
    frame, col = metric_frame(timings, metric)
    if metric == "cpu_kept_ms":
        kwargs.setdefault("pair", "common")
    with_plain = set(frame.loc[frame["mode"] == BASELINE_MODE, "build"])
    ok = frame[frame["build"].isin(with_plain)]
    out = summarize(ok, col, **kwargs) if not ok.empty else _empty_summary()  # type: ignore[arg-type]
    out["metric"] = metric
    out["note"] = ""
    return add_dropped_cells(out, timings, frame, col, metric)


def _rejected_reason(metric: str, n_all: int, n_kept: int) -> str:
    if metric == "cpu_kept_ms":
        why = "the vCPU calibration just before or after it ran slow"
    else:
        why = f"no {metric} value"
    if n_kept == 0:
        return f"all {n_all} executions rejected ({why}): not measured"
    return (f"no plain Query-1 of this build kept ({why}): {n_kept} of {n_all} kept, "
            "no overhead")


def add_dropped_cells(summary: pd.DataFrame, timings: pd.DataFrame, kept: pd.DataFrame,
                      col: str, metric: str) -> pd.DataFrame:
    """*summary* plus a row for every (build, mode) of *timings* it lacks (see
    :func:`summarize_metric`): n = the executions *kept* holds, medians of those, the
    reason in ``note``."""
    if timings.empty:
        return summary
    have = set(zip(summary["build"], summary["mode"], strict=True))
    n_all = timings.groupby(["build", "mode"]).size()
    extra = []
    for (build, mode), n in n_all.items():
        if (build, mode) in have:
            continue
        vals = kept.loc[(kept["build"] == build) & (kept["mode"] == mode), col].astype(
            "float64").to_numpy()
        k = len(vals)
        extra.append({
            "build": build, "mode": mode, "n": k,
            "median_ms": float(np.median(vals)) if k else math.nan,
            "mean_ms": float(np.mean(vals)) if k else math.nan,
            "q25_ms": float(np.quantile(vals, 0.25)) if k else math.nan,
            "variance": float(np.var(vals, ddof=1)) if k > 1 else math.nan,
            "overhead_pct": math.nan, "ci_low_pct": math.nan, "ci_high_pct": math.nan,
            "paired": False, "ci_method": "none", "metric": metric,
            "backends": int(timings.loc[timings["build"] == build, "backend"].nunique())
            if "backend" in timings.columns else 1,
            "note": _rejected_reason(metric, int(n), k)})
    if not extra:
        return summary
    out = pd.concat([summary, pd.DataFrame(extra)], ignore_index=True)
    order = {b: i for i, b in enumerate(build_order(out["build"].astype(str).tolist()))}
    out = out.assign(_b=out["build"].map(order), _m=out["mode"].map(
        lambda m: _mode_sort_key(str(m)))).sort_values(["_b", "_m"], kind="stable")
    return out.drop(columns=["_b", "_m"]).reset_index(drop=True)


# --------------------------------------------------------------------------- A/A


@dataclass(frozen=True)
class AACheck:
    """An A/A arm (the reference build again, on clusters and backends of its own)
    against its reference, plain Query-1: every difference it shows is noise.

    ``detectable_pct``: the larger end of its 95 % interval in absolute value — a
    difference between builds smaller than that is within what the same build showed
    against itself in this run. ``excludes_zero``: the A/A interval excludes 0 (a false
    positive of the interval; at 95 % this should happen in about 1 run of 20).
    """

    aa: str
    ref: str
    diff_pct: float
    ci_low_pct: float
    ci_high_pct: float
    detectable_pct: float
    excludes_zero: bool
    between_share_pct: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def describe(self) -> str:
        return (f"A/A: {self.aa} vs {self.ref}, plain Query-1: {self.diff_pct:+.2f} % "
                f"[{self.ci_low_pct:+.2f}, {self.ci_high_pct:+.2f}]"
                + (" — the interval EXCLUDES 0 (a false positive: treat the other "
                   "intervals of this run with suspicion)" if self.excludes_zero else "")
                + f"; the smallest difference this run could detect: ±{self.detectable_pct:.2f} %")


def aa_check(summary: pd.DataFrame, aa_label: str) -> AACheck | None:
    """The A/A reading of a summary with :func:`attach_reference`'s columns (None when
    the arm or its interval is missing)."""
    if "vs_ref_ci_low_pct" not in summary.columns:
        return None
    row = summary[(summary["build"] == aa_label) & (summary["mode"] == BASELINE_MODE)]
    if row.empty:
        return None
    r = row.iloc[0]
    lo, hi = float(r["vs_ref_ci_low_pct"]), float(r["vs_ref_ci_high_pct"])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    share = r.get("vs_ref_between_share_pct", math.nan)
    return AACheck(aa_label, str(r.get("ref_build")), float(r["vs_ref_pct"]), lo, hi,
                   max(abs(lo), abs(hi)), bool(lo > 0 or hi < 0),
                   float(share) if share is not None and pd.notna(share) else math.nan)


def wilson_interval(hits: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial rate *hits* / *n* (Wilson 1927): honest near
    0 and 1, where the normal approximation is not. (nan, nan) for n = 0."""
    if n <= 0:
        return math.nan, math.nan
    z = float(sps.norm.ppf(0.5 + confidence / 2))
    p = hits / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


# --------------------------------------------------------------------------- other estimators

#: Estimators of a time difference between two arms that :func:`paired_estimates`
#: computes on one run, for an A/A comparison of estimators on this machine's data:
#: ``median``: median of per-repetition ratios (the report's estimator); ``q25``/``min``:
#: ratio of the arms' lower quartiles / minima (a slow vCPU only ever adds time, so the
#: low end of the distribution is the least disturbed: Chen & Revels 2016 argue for the
#: minimum under positive noise).
ESTIMATORS: tuple[str, ...] = ("median", "q25", "min")


def _ratio_stat(kind: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def f(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if kind == "median":
                return np.nanmedian((b - a) / a, axis=-1) * 100.0
            if kind == "q25":
                return (np.nanquantile(b, 0.25, axis=-1) / np.nanquantile(a, 0.25, axis=-1)
                        - 1.0) * 100.0
            return (np.nanmin(b, axis=-1) / np.nanmin(a, axis=-1) - 1.0) * 100.0
    return f


def _resample_pairs(a: np.ndarray, b: np.ndarray, backend: np.ndarray,
                    rng: np.random.Generator, n_resamples: int, *, fixed: bool = False
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Hierarchical resamples of paired values: backends with replacement, then pairs
    within each (NaN-padded to a common length; one backend: pairs only).  *fixed*: every
    backend once in every resample, the pairs within each resampled (the within part)."""
    ids = np.unique(backend)
    sizes = np.array([(backend == g).sum() for g in ids])
    k, nmax = len(ids), int(sizes.max())
    A = np.full((k, nmax), np.nan)
    B = np.full((k, nmax), np.nan)
    for i, g in enumerate(ids):
        A[i, :sizes[i]] = a[backend == g]
        B[i, :sizes[i]] = b[backend == g]
    chosen = (np.broadcast_to(np.arange(k), (n_resamples, k)).copy() if fixed
              else rng.integers(k, size=(n_resamples, k)) if k > 1
              else np.zeros((n_resamples, 1), dtype=np.int64))
    n = sizes[chosen]
    j = (rng.random((*chosen.shape, nmax)) * n[..., None]).astype(np.int64)
    pad = np.arange(nmax)[None, None, :] >= n[..., None]
    ra, rb = A[chosen[..., None], j], B[chosen[..., None], j]
    ra[pad] = np.nan
    rb[pad] = np.nan
    return ra.reshape(n_resamples, -1), rb.reshape(n_resamples, -1)


def paired_estimates(a: np.ndarray, b: np.ndarray, backend: np.ndarray, *,
                     rng: np.random.Generator, confidence: float = 0.95,
                     n_resamples: int = 2000) -> dict[str, tuple[float, float, float]]:
    """estimator -> (estimate %, low, high) of arm *b* against arm *a*, per repetition
    paired (*a*, *b*: the two arms' times, one per repetition; *backend*: the block of
    each repetition). The interval resamples backends, then repetitions within them
    (a percentile interval; with one backend, repetitions only)."""
    a, b, backend = (np.asarray(x, dtype="float64") for x in (a, b, backend))
    ra, rb = _resample_pairs(a, b, backend, rng, n_resamples)
    alpha = (1 - confidence) / 2
    out = {}
    for kind in ESTIMATORS:
        f = _ratio_stat(kind)
        est = float(f(a[None, :], b[None, :])[0])
        lo, hi = (float(x) for x in np.nanquantile(f(ra, rb), [alpha, 1 - alpha]))
        out[kind] = (est, lo, hi)
    return out


#: The per-execution disturbance columns the bench report shows beside the vCPU's speed.
DISTURBANCE_COLUMNS: tuple[str, ...] = ("speed_factor", "invol_cs", "vol_cs", "migrations",
                                        "minflt", "majflt", "steal_cpu_ms", "runq_ms")


@dataclass
class BenchExtras:
    """The figures of the bench report's closing sections (the text is
    :func:`profkit.render.bench_report.extra_sections`'s)."""

    metric: str
    #: summarize_metric of every metric that could be computed, indexed by (build, mode)
    by_metric: dict[str, pd.DataFrame]
    #: summarize_metric of *metric* (None: it cannot be computed for this run)
    summary: pd.DataFrame | None
    #: the vCPU calibrations' rule (None: the run has none)
    vcpu: VcpuSpeed | None
    #: per (build, mode): rejected, n, and the median (and max) of DISTURBANCE_COLUMNS
    vcpu_table: pd.DataFrame | None
    #: Query-2 overhead CI half-width per build, percentage points (build, half_width_pp)
    q2_half_width: pd.DataFrame | None
    #: the plain query of every build against the first build (None: fewer than two)
    plain_base: str | None
    plain_vs_base: pd.DataFrame | None
    #: instruction counts with their overheads against each build's plain query
    instructions: pd.DataFrame | None
    instr: pd.DataFrame | None


def bench_extras(timings: pd.DataFrame, instr: pd.DataFrame | None, metric: str,
                 center: str = "median") -> BenchExtras:
    """Everything the bench report says after its main table: every time measure's
    overheads, the vCPU's speed and what disturbed the backends, the Query-2 CI widths,
    the plain query across builds, and the instruction overheads (a mode faster than its
    plain query is in the notes: :func:`plain_suspect`)."""
    by_metric: dict[str, pd.DataFrame] = {}
    for m in METRICS:
        try:
            by_metric[m] = summarize_metric(timings, m, center=center).set_index(
                ["build", "mode"])
        except ProfkitError:
            continue
    try:
        summary: pd.DataFrame | None = summarize_metric(timings, metric, center=center)
    except ProfkitError:
        summary = None
    vcpu, vcpu_table = None, None
    if has_calibration(timings):
        adj, vcpu = vcpu_adjust(timings)
        cols = [c for c in DISTURBANCE_COLUMNS if c in adj.columns]
        rows = []
        groups = dict(iter(adj.groupby(["build", "mode"])))
        for b in build_order(adj["build"].unique().tolist()):
            for m in adj["mode"].unique():
                if (b, m) not in groups:
                    continue
                g = groups[(b, m)]
                rows.append({"build": str(b), "mode": str(m),
                             "rejected": int(g["calib_slow"].sum()), "n": len(g),
                             **{f"{c}_median": g[c].median() for c in cols},
                             **{f"{c}_max": g[c].max() for c in cols}})
        vcpu_table = pd.DataFrame(rows)
        vcpu_table.attrs["columns"] = cols
    q2_half_width = None
    if summary is not None:
        q2 = summary[summary["mode"] == "analyze_notiming"]
        if not q2.empty:
            q2_half_width = pd.DataFrame({
                "build": q2["build"].to_numpy(),
                "half_width_pp": ((q2["ci_high_pct"] - q2["ci_low_pct"]) / 2
                                  ).astype("float64").to_numpy()})
    plain_base, plain_vs_base = _plain_across_builds(timings, instr, metric)
    return BenchExtras(metric, by_metric, summary, vcpu, vcpu_table, q2_half_width,
                       plain_base, plain_vs_base, _instruction_overheads(instr), instr)


def _finite(x: Any) -> bool:
    try:
        return x is not None and x is not pd.NA and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _plain_across_builds(timings: pd.DataFrame, instr: pd.DataFrame | None, metric: str
                         ) -> tuple[str | None, pd.DataFrame | None]:
    """Query-1 of every build against the first: (the first build, one row per other
    build: median_ms, time_pct, p_value, p_unit, instr_pct).

    ``p_value``: Mann–Whitney U on the units that are independent.  Where both builds ran
    on ≥ 2 backends, those are the backends (each one's median): the executions of one
    backend share its process, and what the process brings moves them together (vanilla's
    four backends in a warm ``make demo`` here: medians 17 % apart; small A/A runs: a
    median spread of 18-32 %, at most 118 %; ``benchmarks/plain_backends.py``,
    ``benchmarks/results/plain_backends-20261206.txt``).  A test on the executions counts
    one backend's luck as many observations: in that demo step4's plain query read
    +7.45 %, p = 0.045 on its executions against vanilla's, at the same instruction count;
    p = 0.34 on the 4 against 4 backends.  On 120 A/A runs the execution test called
    vanilla different from itself 7 times, the backend test twice; the price is power: 4
    against 4 backends reach p < 0.05 only when every backend of one build lies beyond
    every backend of the other.  ``p_unit`` says which units ("4/4 backends", "10/9
    executions")."""
    builds = build_order(timings["build"].unique().tolist())
    if len(builds) < 2 or "plain" not in set(timings["mode"]):
        return None, None
    frame, col = metric_frame(timings, metric)
    ic = None
    if instr is not None and not instr.empty:
        ic = instr[instr["mode"] == "plain"].set_index("build")["instructions"].astype(float)
    base = builds[0]
    rows = []
    for b in builds[1:]:
        try:
            c = compare_builds(frame, base, b, "plain", col)  # type: ignore[arg-type]
        except ComparisonError:
            continue
        iv = (ic[b] / ic[base] - 1) * 100 if ic is not None and b in ic and base in ic \
            else math.nan
        p, unit = _plain_rank_test(frame, col, base, b)
        if math.isnan(p):
            p, unit = c.time_p_value, f"{c.n_a}/{c.n_b} executions"
        rows.append({"build": b, "median_ms": c.median_b_ms,
                     "time_pct": (c.time_ratio - 1) * 100, "p_value": p, "p_unit": unit,
                     "instr_pct": iv})
    return base, pd.DataFrame(rows, columns=["build", "median_ms", "time_pct", "p_value",
                                             "p_unit", "instr_pct"])


def backend_medians(frame: pd.DataFrame, col: str, build: str,
                    mode: str = BASELINE_MODE) -> pd.Series:
    """*build*'s median *col* per backend (``run_id``, ``backend``) in *mode*; empty
    when the frame has no ``backend`` column."""
    if "backend" not in frame.columns:
        return pd.Series(dtype="float64")
    d = frame[(frame["build"] == build) & (frame["mode"] == mode)]
    return d.groupby(["run_id", "backend"])[col].median().dropna()


def _plain_rank_test(frame: pd.DataFrame, col: str, a: str, b: str) -> tuple[float, str]:
    """Mann–Whitney U of build *b*'s plain times against *a*'s on their backends' medians
    (:func:`backend_medians`); NaN where either build has fewer than 2 backends with a
    time (then the executions are the units)."""
    med = []
    for name in (a, b):
        m = backend_medians(frame, col, name)
        if len(m) < 2:
            return math.nan, ""
        med.append(m.to_numpy(dtype="float64"))
    p = float(sps.mannwhitneyu(med[0], med[1], alternative="two-sided").pvalue)
    return p, f"{len(med[0])}/{len(med[1])} backends"


def _instruction_overheads(instr: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per build and mode: instructions and executor instructions, and their overhead %
    against the build's plain query (NaN where a count is missing)."""
    if instr is None or instr.empty:
        return None
    has_ex = "executor_instructions" in instr.columns
    rows = []
    for b in instr["build"].unique():
        ib = instr[instr["build"] == b].set_index("mode")
        base = ib["instructions"].get("plain")
        base_ex = ib["executor_instructions"].get("plain") if has_ex else None
        for mode, r in ib.iterrows():
            ex = r["executor_instructions"] if has_ex else None
            rows.append({
                "build": b, "mode": mode, "instructions": int(r["instructions"]),
                "overhead_pct": (r["instructions"] / base - 1) * 100 if _finite(base)
                else math.nan,
                "executor_instructions": ex if _finite(ex) else None,
                "executor_overhead_pct": (ex / base_ex - 1) * 100
                if _finite(ex) and _finite(base_ex) else math.nan})
    return pd.DataFrame(rows)
