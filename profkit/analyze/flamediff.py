"""Which frames of a differential flamegraph really changed: a bootstrap over recordings.

A share-based differential (FlameGraph's difffolded.pl, ``render(diff_against=...)``)
colours each frame by its share of each profile's own total: when one frame vanishes,
every other frame grows as a share and turns red although none of them got slower, and
nothing says whether a colour is more than sampling noise. This module compares
*repeated recordings* of two builds instead, in time per execution:

- a recording (:class:`Recording`) is one ``perf record`` of one backend running the
  query *executions* times; a frame's value in it is ``samples × sample period /
  executions``: milliseconds of CPU per execution (with a sample period of 1 and one
  execution per recording, samples per recording);
- frames are keyed four ways (:func:`frame_values`): by their full stack path or by
  function name, each *self* (samples whose leaf it is) or *total* (inclusive: samples
  whose stack passes through it; a recursive function counted once per stack);
- the change of a frame is the mean over B's recordings minus the mean over A's, and
  its interval comes from a **bootstrap of the recordings**: each resample draws every
  build's recordings with replacement, within the build (A's from A's, B's from B's),
  the same draw for every frame (a recording's frames move together);
- few recordings make a percentile interval too narrow (the bootstrap's variance of a
  mean is (n-1)/n of the unbiased one, and its tails are normal where Student's are
  not). The interval is therefore an **expanded percentile interval** (after Hesterberg
  2015, "What teachers should know about the bootstrap", section 5.1): the resampled
  differences' percentiles taken at the tail level α'/2 = Φ(−t(df, 1 − α/2) ·
  sqrt(V / V*)), where V is Welch's variance of the difference from the recordings,
  *df* Welch's degrees of freedom and V* the resamples' variance: a Student-t width
  with the bootstrap's shape (the skew of small counts). Each build's variance is
  floored at the Poisson variance of its counts: a frame seen a handful of times may
  agree across a few recordings by chance (1, 1, 1 samples), and its sampling noise
  must still count. Where that level lies beyond the resamples' reach (no spread at
  all, or less than one resample in the tail), the interval is Welch's t interval
  itself;
- a frame is *flagged* when its interval excludes 0: ``+1`` dearer in B, ``-1``
  cheaper; 0 otherwise (grey in the graph).

The resampling is numpy (a seeded ``numpy.random.Generator``, *n_boot* resamples);
scipy gives only the two quantile functions of the expansion. Everything here is a pure
function of the recordings' folded stacks: no files, no processes.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from profkit.errors import ComparisonError

Basis = Literal["self", "total"]
Key = Literal["path", "function"]
KEYS: tuple[Key, ...] = ("path", "function")
BASES: tuple[Basis, ...] = ("self", "total")

#: Resamples and seed of the bootstrap unless the caller says otherwise.
DEFAULT_N_BOOT = 4000
DEFAULT_SEED = 0
DEFAULT_CONFIDENCE = 0.95

#: Columns of :attr:`FlameDiff.table`.
COLUMNS: tuple[str, ...] = (
    "key", "basis", "frame", "a_mean", "b_mean", "change", "low", "high",
    "change_pct", "pct_low", "pct_high", "flag", "a_present", "b_present", "df",
)


@dataclass(frozen=True)
class Recording:
    """One recording's folded stacks and what turns its samples into time per execution.

    *ms_per_sample*: the sample period in milliseconds (``1000 / freq`` for perf's
    cpu-clock at *freq* Hz); *executions*: how many times the query ran while it was
    recorded. With the defaults (1, 1) values are samples per recording."""

    counts: Mapping[str, float]
    executions: int = 1
    ms_per_sample: float = 1.0
    label: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.executions, bool) or int(self.executions) != self.executions \
                or self.executions < 1:
            raise ComparisonError(f"recording {self.label or '?'}: executions must be an "
                                  f"integer >= 1, got {self.executions!r}")
        if not (math.isfinite(self.ms_per_sample) and self.ms_per_sample > 0):
            raise ComparisonError(f"recording {self.label or '?'}: the sample period must be "
                                  f"a positive number, got {self.ms_per_sample!r}")

    @property
    def scale(self) -> float:
        """Milliseconds per execution that one sample stands for."""
        return self.ms_per_sample / self.executions

    @property
    def samples(self) -> float:
        return float(sum(v for v in self.counts.values() if v > 0))


def frame_values(counts: Mapping[str, float], *, key: Key = "path",
                 basis: Basis = "self") -> dict[str, float]:
    """A folded profile's samples per frame.

    >>> frame_values({"main;f;g": 2, "main;f": 1}, key="path", basis="total")
    {'main': 3.0, 'main;f': 3.0, 'main;f;g': 2.0}
    >>> frame_values({"main;f;f": 2, "main;g": 1}, key="function", basis="total")
    {'main': 3.0, 'f': 2.0, 'g': 1.0}
    """
    out: dict[str, float] = {}
    for stack, w in counts.items():
        if not w > 0:
            continue
        frames = stack.split(";")
        if basis == "self":
            k = stack if key == "path" else frames[-1]
            out[k] = out.get(k, 0.0) + float(w)
        elif key == "path":
            end = -1
            for _ in frames:
                end = stack.find(";", end + 1)
                k = stack if end < 0 else stack[:end]
                out[k] = out.get(k, 0.0) + float(w)
        else:
            for k in dict.fromkeys(frames):
                out[k] = out.get(k, 0.0) + float(w)
    return out


def mean_profile(recordings: Sequence[Recording]) -> dict[str, float]:
    """The recordings' mean per stack, in their unit (ms per execution): the widths a
    differential draws."""
    out: dict[str, float] = {}
    n = len(recordings)
    for r in recordings:
        k = r.scale / n
        for stack, w in r.counts.items():
            if w > 0:
                out[stack] = out.get(stack, 0.0) + float(w) * k
    return out


def union_profile(a: Sequence[Recording], b: Sequence[Recording]) -> dict[str, float]:
    """What a differential draws: B's mean per stack, plus A's mean for the stacks B never
    has (so a frame that vanished is drawn, at A's width, and can show as cheaper)."""
    out = mean_profile(b)
    for stack, v in mean_profile(a).items():
        if stack not in out:
            out[stack] = v
    return out


def _matrix(recs: Sequence[Recording], frames: Sequence[str], key: Key, basis: Basis
            ) -> np.ndarray:
    idx = {f: i for i, f in enumerate(frames)}
    m = np.zeros((len(recs), len(frames)))
    for r, rec in enumerate(recs):
        for f, v in frame_values(rec.counts, key=key, basis=basis).items():
            m[r, idx[f]] = v
    return m


def _t_ppf(q: float, df: np.ndarray) -> np.ndarray:
    from scipy.stats import t as student

    return np.asarray(student.ppf(q, df), dtype="float64")


def _norm_cdf(z: np.ndarray) -> np.ndarray:
    from scipy.stats import norm

    return np.asarray(norm.cdf(z), dtype="float64")


def welch(va: np.ndarray, vb: np.ndarray, na: int, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """(variance of the difference of means, Welch's degrees of freedom) per frame, from
    the per-recording variances *va*, *vb* (ddof=1); df between min(n)-1 and na+nb-2 (a
    frame whose recordings do not vary at all gets the smallest)."""
    sa, sb = va / na, vb / nb
    target = sa + sb
    den = sa * sa / (na - 1) + sb * sb / (nb - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(den > 0, target * target / den, min(na, nb) - 1)
    return target, np.clip(df, max(min(na, nb) - 1, 1), max(na + nb - 2, 1))


def expanded_levels(target: np.ndarray, boot: np.ndarray, df: np.ndarray,
                    confidence: float) -> np.ndarray:
    """α'/2 per frame: the tail level at which the bootstrap's percentiles give a
    Student-t interval's half-width, Φ(−t(df, 1 − α/2) · sqrt(target / boot)).

    *target*: the variance the difference should have (Welch's, from the recordings);
    *boot*: the variance of the resampled differences. The bootstrap supplies the shape
    (skew of small counts), the t quantile and *target* the width few recordings need
    (Hesterberg 2015, section 5.1: the expanded percentile interval)."""
    alpha = 1.0 - confidence
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(boot > 0, np.sqrt(target / boot), 1.0)
    return _norm_cdf(-ratio * _t_ppf(1.0 - alpha / 2, df))


@dataclass(frozen=True)
class FlameDiff:
    """The bootstrap's answer: one row per (key, basis, frame) (:data:`COLUMNS`).

    ``change`` = B's mean − A's mean (``unit`` per recording's executions), ``low`` /
    ``high`` its interval, ``change_pct`` the change over A's mean (NaN where A's is 0:
    a frame new in B) with its interval; ``flag`` +1 (dearer in B: the interval is above
    0), -1 (cheaper: below 0), 0 (the interval includes 0); ``a_present`` /
    ``b_present``: in how many recordings of each build the frame has samples."""

    table: pd.DataFrame
    n_a: int
    n_b: int
    n_boot: int
    seed: int
    confidence: float
    unit: str
    method: str = ("bootstrap of the recordings within each build, expanded percentile "
                   "interval (Welch variance with a Poisson floor, Welch df)")
    notes: tuple[str, ...] = field(default_factory=tuple)

    def rows(self, key: Key = "path", basis: Basis = "self") -> pd.DataFrame:
        t = self.table
        return t[(t["key"] == key) & (t["basis"] == basis)]

    def lookup(self, key: Key = "path", basis: Basis = "self") -> dict[str, dict[str, object]]:
        """frame → its row as a dict."""
        rows = self.rows(key, basis)
        return {str(r["frame"]): r for r in rows.to_dict("records")}

    def flagged(self, key: Key = "path", basis: Basis = "self") -> pd.DataFrame:
        """The flagged frames, largest change first."""
        rows = self.rows(key, basis)
        rows = rows[rows["flag"] != 0]
        return rows.reindex(rows["change"].abs().sort_values(ascending=False).index)

    def flag_rate(self, key: Key = "path", basis: Basis = "self") -> tuple[int, int]:
        """(flagged frames, frames tested): a frame is tested when it has samples in
        at least one recording on this basis."""
        rows = self.rows(key, basis)
        return int((rows["flag"] != 0).sum()), int(len(rows))

    def describe(self) -> str:
        ci = f"{self.confidence:.0%}"
        return (f"{self.n_a} + {self.n_b} recordings, {self.unit}; {ci} {self.method}; "
                f"B = {self.n_boot} resamples, seed {self.seed}")


def bootstrap_diff(a: Sequence[Recording], b: Sequence[Recording], *,
                   keys: Iterable[Key] = KEYS, bases: Iterable[Basis] = BASES,
                   n_boot: int = DEFAULT_N_BOOT, seed: int = DEFAULT_SEED,
                   confidence: float = DEFAULT_CONFIDENCE, poisson: bool = False,
                   chunk: int = 512) -> FlameDiff:
    """The change of every frame from A's recordings to B's, with its bootstrap interval.

    At least two recordings per build (one recording has no spread to resample).
    *poisson*: also resample each drawn recording's samples as Poisson counts (slower:
    a draw per recording, frame and resample; the variance floor already carries the
    sampling noise into the width). *chunk*: frames resampled at once (memory: n_boot ×
    chunk).
    """
    a, b = list(a), list(b)
    if len(a) < 2 or len(b) < 2:
        raise ComparisonError(f"a bootstrap over recordings needs at least 2 recordings per "
                              f"build, got {len(a)} and {len(b)}: record more (e.g. "
                              "--recordings 4)")
    if not 0.5 <= confidence < 1:
        raise ComparisonError(f"confidence must be in [0.5, 1), got {confidence!r}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 100:
        raise ComparisonError(f"n_boot must be an integer >= 100, got {n_boot!r}")
    for side, recs in (("A", a), ("B", b)):
        for r in recs:
            if r.samples <= 0:
                raise ComparisonError(f"recording {r.label or '?'} of {side} has no samples: "
                                      "record longer (more executions or a higher frequency)")
    units = {(r.ms_per_sample == 1.0 and r.executions == 1) for r in a + b}
    unit = "samples per recording" if units == {True} else "ms per execution"
    rng = np.random.default_rng(seed)
    na, nb = len(a), len(b)
    # the same recordings are drawn for every frame of one resample (frames of one
    # recording move together), so the draws are made once
    wa = rng.multinomial(na, [1.0 / na] * na, size=n_boot).astype("float64")
    wb = rng.multinomial(nb, [1.0 / nb] * nb, size=n_boot).astype("float64")
    sa = np.array([r.scale for r in a])
    sb = np.array([r.scale for r in b])
    parts: list[pd.DataFrame] = []
    for key in keys:
        for basis in bases:
            frames = sorted(set().union(*(frame_values(r.counts, key=key, basis=basis)
                                          for r in a + b)))
            if not frames:
                continue
            ca = _matrix(a, frames, key, basis)       # counts (samples)
            cb = _matrix(b, frames, key, basis)
            xa, xb = ca * sa[:, None], cb * sb[:, None]   # per execution
            ma, mb = xa.mean(axis=0), xb.mean(axis=0)
            va = xa.var(axis=0, ddof=1)
            vb = xb.var(axis=0, ddof=1)
            # a recording's count varies at least as a Poisson count does: the floor for
            # frames seen a handful of times, whose few recordings may happen to agree
            va = np.maximum(va, (ca * sa[:, None] ** 2).mean(axis=0))
            vb = np.maximum(vb, (cb * sb[:, None] ** 2).mean(axis=0))
            target, df = welch(va, vb, na, nb)
            half = _t_ppf(1.0 - (1.0 - confidence) / 2, df) * np.sqrt(target)
            lo = np.empty(len(frames))
            hi = np.empty(len(frames))
            plo = np.full(len(frames), np.nan)
            phi = np.full(len(frames), np.nan)
            for s in range(0, len(frames), chunk):
                e = min(s + chunk, len(frames))
                bma = _resample(rng, wa, ca[:, s:e], sa, poisson) / na
                bmb = _resample(rng, wb, cb[:, s:e], sb, poisson) / nb
                d = bmb - bma
                vboot = d.var(axis=0)
                lev = expanded_levels(target[s:e], vboot, df[s:e], confidence)
                # beyond the resamples' reach (no spread, or a tail level under one
                # resample): Welch's t interval itself
                t_only = (vboot <= 0) | (lev * n_boot < 1)
                d = np.sort(d, axis=0)
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = np.where(bma > 0, (bmb - bma) / bma * 100.0,
                                     np.where(bmb > 0, np.inf, 0.0))
                ratio = np.sort(ratio, axis=0)
                il = np.floor(lev * (n_boot - 1)).astype(np.int64)
                ih = np.ceil((1.0 - lev) * (n_boot - 1)).astype(np.int64)
                cols = np.arange(e - s)
                lo[s:e] = d[il, cols]
                hi[s:e] = d[ih, cols]
                has_a = ma[s:e] > 0
                plo[s:e] = np.where(has_a, ratio[il, cols], np.nan)
                phi[s:e] = np.where(has_a, ratio[ih, cols], np.nan)
                if t_only.any():
                    j = np.arange(s, e)[t_only]
                    dj = mb[j] - ma[j]
                    lo[j], hi[j] = dj - half[j], dj + half[j]
                    with np.errstate(divide="ignore", invalid="ignore"):
                        plo[j] = np.where(ma[j] > 0, lo[j] / ma[j] * 100.0, np.nan)
                        phi[j] = np.where(ma[j] > 0, hi[j] / ma[j] * 100.0, np.nan)
            # B's time cannot go below 0: a frame is at most 100 % cheaper
            lo, hi = np.maximum(lo, -ma), np.maximum(hi, -ma)
            plo, phi = np.fmax(plo, -100.0), np.fmax(phi, -100.0)
            change = mb - ma
            with np.errstate(divide="ignore", invalid="ignore"):
                pct = np.where(ma > 0, change / ma * 100.0, np.nan)
            flag = np.where(lo > 0, 1, np.where(hi < 0, -1, 0))
            parts.append(pd.DataFrame({
                "key": key, "basis": basis, "frame": frames, "a_mean": ma, "b_mean": mb,
                "change": change, "low": lo, "high": hi, "change_pct": pct,
                "pct_low": plo, "pct_high": phi, "flag": flag.astype("int64"),
                "a_present": (ca > 0).sum(axis=0).astype("int64"),
                "b_present": (cb > 0).sum(axis=0).astype("int64"), "df": df}))
    table = (pd.concat(parts, ignore_index=True) if parts
             else pd.DataFrame({c: [] for c in COLUMNS}))
    return FlameDiff(table[list(COLUMNS)], na, nb, n_boot, int(seed), confidence, unit)


def _resample(rng: np.random.Generator, w: np.ndarray, counts: np.ndarray,
              scale: np.ndarray, poisson: bool) -> np.ndarray:
    """Σ over recordings of (copies drawn × the recording's values): n_boot × frames.
    With *poisson*, the w copies of a recording with count c hold Poisson(w·c) samples
    (w independent Poisson(c) draws, summed)."""
    if not poisson:
        return w @ (counts * scale[:, None])
    out = np.zeros((w.shape[0], counts.shape[1]))
    for r in range(counts.shape[0]):
        lam = w[:, r, None] * counts[r][None, :]
        out += rng.poisson(lam) * scale[r]
    return out


def aa_flag_rate(diffs: Sequence[FlameDiff], key: Key = "path", basis: Basis = "self"
                 ) -> tuple[int, int]:
    """(flagged, tested) frames summed over several A/A comparisons."""
    hits = tests = 0
    for d in diffs:
        h, n = d.flag_rate(key, basis)
        hits += h
        tests += n
    return hits, tests
