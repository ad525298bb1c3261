"""Subtract what the instrumentation itself costs from EXPLAIN ANALYZE's times.

observer-effect.txt's proposal: if the cost of one clock read is known
(:mod:`profkit.collect.clock`) and the number of reads is known
(:mod:`profkit.analyze.predict`, or measured by :mod:`profkit.collect.bpf`),
subtract reads × cost.  Row counting (InstrStartNode/InstrStopNode with TIMING
off) costs something too; its price per call comes from comparing the
TIMING OFF run with the plain run of the same query:

    row_cost_ns = (T_analyze_notiming − T_plain) / instr_calls
    T_corrected  = T_analyze_timing − clock_reads × ns_per_read − instr_calls × row_cost_ns

Per node, EXPLAIN's "Actual Total Time" is inclusive (children included) and
per loop.  A node's timer runs from its InstrStartNode read to its
InstrStopNode read, so its window holds about one read of its own per call
(the end of the start read plus the beginning of the stop read) and all reads
of its descendants (two per call each) with their row-counting work; the
corrected inclusive time subtracts those, and the corrected self time is the
corrected inclusive time minus the children's corrected inclusive times.

All functions are pure (DataFrames in, DataFrames out).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from profkit.parse.explain import explain_order, flatten_plan, load_explain
from profkit.errors import ProfkitError


class CorrectionError(ProfkitError):
    pass


def node_times(explain: Any) -> pd.DataFrame:
    """node_id, parent_id, node_type, total_ms (inclusive, all loops), self_ms.

    Input: EXPLAIN (ANALYZE, TIMING TRUE, FORMAT JSON) output.  With TIMING
    FALSE there are no node times and this raises CorrectionError.
    """
    top = load_explain(explain)
    flat = flatten_plan(top)
    nodes = explain_order(top["Plan"])
    # flatten_plan's "order" is the index of each node in EXPLAIN's print order
    by_order = {i: n for i, n in enumerate(nodes)}
    totals = []
    for o in flat["order"]:
        n = by_order.get(int(o), {})
        t = n.get("Actual Total Time")
        loops = n.get("Actual Loops")
        if t is None or loops is None:
            raise CorrectionError("the plan has no node times: use EXPLAIN (ANALYZE, TIMING TRUE, "
                                  "FORMAT JSON)")
        totals.append(float(t) * float(loops))
    out = flat[["node_id", "parent_id", "node_type", "rows", "loops"]].copy()
    out["total_ms"] = totals
    return _add_self(out, "total_ms", "self_ms")


def _add_self(df: pd.DataFrame, total_col: str, self_col: str) -> pd.DataFrame:
    df = df.copy()
    child_sum = df.groupby("parent_id")[total_col].sum()
    df[self_col] = df[total_col] - df["node_id"].map(child_sum).fillna(0.0)
    return df


def _descendants(df: pd.DataFrame) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for nid, pid in zip(df["node_id"], df["parent_id"], strict=True):
        if not pd.isna(pid):
            kids.setdefault(int(pid), []).append(int(nid))
    out: dict[int, list[int]] = {}

    def walk(n: int) -> list[int]:
        if n not in out:
            acc: list[int] = []
            for k in kids.get(n, []):
                acc.append(k)
                acc += walk(k)
            out[n] = acc
        return out[n]

    for n in df["node_id"]:
        walk(int(n))
    return out


def corrected_node_times(nodes: pd.DataFrame, ns_per_read: float, row_cost_ns: float = 0.0,
                         *, reads_col: str = "clock_calls_predicted",
                         calls_col: str = "instr_start_predicted") -> pd.DataFrame:
    """Corrected inclusive and self time per node.

    *nodes* needs node_id, parent_id, total_ms (from :func:`node_times`) and the
    per-node clock reads and Instr* calls (predicted, or measured: pass
    ``reads_col="clock_calls_measured"``).  Adds reads_in_window,
    calls_in_window, overhead_ms, corrected_total_ms, corrected_self_ms and
    overhead_share (the part of the node's measured inclusive time that is
    instrumentation).
    """
    for c in ("node_id", "parent_id", "total_ms", reads_col, calls_col):
        if c not in nodes.columns:
            raise CorrectionError(f"corrected_node_times needs column {c!r}; have "
                                  f"{list(nodes.columns)}")
    if ns_per_read < 0 or row_cost_ns < 0:
        raise CorrectionError("costs must be >= 0")
    df = nodes.copy()
    ids = df["node_id"].astype(int)
    reads = dict(zip(ids, df[reads_col].fillna(0).astype(float), strict=True))
    calls = dict(zip(ids, df[calls_col].fillna(0).astype(float), strict=True))
    desc = _descendants(df)
    in_window_reads = []
    in_window_calls = []
    for nid in df["node_id"].astype(int):
        own = reads[nid] / 2.0  # half of the node's own reads fall inside its window
        in_window_reads.append(own + sum(reads[d] for d in desc[nid]))
        in_window_calls.append(calls[nid] / 2.0 + sum(calls[d] for d in desc[nid]))
    df["reads_in_window"] = in_window_reads
    df["calls_in_window"] = in_window_calls
    df["overhead_ms"] = (df["reads_in_window"] * ns_per_read
                         + df["calls_in_window"] * row_cost_ns) / 1e6
    df["corrected_total_ms"] = (df["total_ms"] - df["overhead_ms"]).clip(lower=0.0)
    df = _add_self(df, "corrected_total_ms", "corrected_self_ms")
    df["overhead_share"] = (df["overhead_ms"] / df["total_ms"]).where(df["total_ms"] > 0)
    return df


def per_repetition(timings: pd.DataFrame, column: str, modes: Sequence[str]) -> pd.DataFrame:
    """*column* per repetition (rows: (run_id, rep), or rep for a table without run_id)
    and mode (columns: those of *modes* the table has); NaN where a repetition lacks the
    mode."""
    for c in ("mode", "rep", column):
        if c not in timings.columns:
            raise CorrectionError(f"timings need column {c!r}; have {list(timings.columns)}")
    index = ["run_id", "rep"] if "run_id" in timings.columns else ["rep"]
    t = timings[timings["mode"].isin(modes)]
    return t.pivot_table(index=index, columns="mode", values=column, aggfunc="median")


def paired_differences(timings: pd.DataFrame, column: str, a: str, b: str) -> pd.Series:
    """Per repetition, mode *a*'s *column* minus mode *b*'s (repetitions without both left
    out), indexed as :func:`per_repetition`.

    The modes of one repetition run interleaved, next to each other in one backend, so a
    stretch of slow machine (this VM switches between two speeds within milliseconds, about
    as far apart as TIMING on is from TIMING off) slows both sides of a pair.  The
    difference of two medians compares executions from different stretches: at 5
    repetitions it has made TIMING on look cheaper than off
    (benchmarks/timing_on_off_reading.py).
    """
    wide = per_repetition(timings, column, (a, b))
    if a not in wide.columns or b not in wide.columns:
        return pd.Series([], dtype="float64", name=f"{a} - {b}")
    return (wide[a] - wide[b]).dropna().rename(f"{a} - {b}")


def paired_gap(timings: pd.DataFrame, column: str, a: str, b: str) -> float:
    """The median of :func:`paired_differences` (NaN when no repetition has both modes)."""
    d = paired_differences(timings, column, a, b)
    return float(d.median()) if len(d) else math.nan


def row_counting_cost_ns(notiming_ms: float, plain_ms: float, instr_calls: int) -> float:
    """Cost per InstrStartNode+InstrStopNode pair with TIMING off, from two run times.

    Noise can make TIMING OFF look faster than plain; the cost is then 0.
    """
    if instr_calls <= 0:
        raise CorrectionError("instr_calls must be > 0 to price row counting")
    return max(0.0, (float(notiming_ms) - float(plain_ms)) * 1e6 / instr_calls)


def in_situ_ns_per_read(timing_ms: float, notiming_ms: float, clock_reads: int,
                        notiming_clock_reads: int = 0) -> float:
    """What one clock read really added inside EXPLAIN ANALYZE: the TIMING ON − OFF gap per read.

    Differs from the tight-loop cost of :mod:`profkit.collect.clock` (cache and
    pipeline effects of interleaving reads with executor work, CPU contention);
    comparing the two says how far the simple correction can be trusted.
    """
    extra = clock_reads - notiming_clock_reads
    if extra <= 0:
        raise CorrectionError("TIMING ON must read the clock more often than TIMING OFF")
    return (float(timing_ms) - float(notiming_ms)) * 1e6 / extra


def corrected_total_ms(analyze_ms: float, clock_reads: int, ns_per_read: float,
                       instr_calls: int = 0, row_cost_ns: float = 0.0) -> float:
    return float(analyze_ms) - (clock_reads * ns_per_read + instr_calls * row_cost_ns) / 1e6


def _median_by_mode(timings: pd.DataFrame | Mapping[str, float],
                    column: str = "server_ms") -> dict[str, float]:
    if isinstance(timings, Mapping):
        return {k: float(v) for k, v in timings.items()}
    if "mode" not in timings or column not in timings:
        raise CorrectionError(f"timings need columns 'mode' and {column!r}")
    return {str(k): float(v) for k, v in timings.groupby("mode")[column].median().items()}


def correction_table(timings: pd.DataFrame | Mapping[str, float], *, clock_reads: int,
                     instr_calls: int, ns_per_read: float,
                     column: str = "server_ms") -> pd.DataFrame:
    """How close the corrected EXPLAIN ANALYZE time comes to the plain query's.

    *timings*: the ``timings`` table (medians per mode are used) or a mapping
    mode -> ms with ``plain``, ``analyze_notiming``, ``analyze_timing``.
    *clock_reads* / *instr_calls*: for the TIMING TRUE run (predicted or
    measured).  Rows: each measured mode, then the TIMING run corrected for
    the clock only and for clock + row counting; ``vs_plain`` is ms / plain ms.
    From a table, the row-counting cost and ``attrs["in_situ_ns_per_read"]`` come from
    each repetition's own pairs (:func:`paired_gap`: TIMING off − plain, TIMING on − off);
    from a mapping, from its values.
    """
    med = _median_by_mode(timings, column)
    missing = [m for m in ("plain", "analyze_notiming", "analyze_timing") if m not in med]
    if missing:
        raise CorrectionError(f"timings lack modes {missing}")
    plain, noti, timing = med["plain"], med["analyze_notiming"], med["analyze_timing"]
    if isinstance(timings, pd.DataFrame):
        row_gap = paired_gap(timings, column, "analyze_notiming", "plain")
        clock_gap = paired_gap(timings, column, "analyze_timing", "analyze_notiming")
    else:
        row_gap, clock_gap = noti - plain, timing - noti
    # no repetition with both modes (every pair rejected): no cost, rather than 0
    row_cost = (math.nan if math.isnan(row_gap) and instr_calls
                else row_counting_cost_ns(row_gap, 0.0, instr_calls) if instr_calls else 0.0)
    clock_only = corrected_total_ms(timing, clock_reads, ns_per_read)
    full = corrected_total_ms(timing, clock_reads, ns_per_read, instr_calls, row_cost)
    rows = [
        ("plain", plain, "measured"),
        ("analyze_notiming", noti, "measured"),
        ("analyze_timing", timing, "measured"),
        ("analyze_timing − clock", clock_only,
         f"{clock_reads:,} reads × {ns_per_read:.1f} ns"),
        ("analyze_timing − clock − row counting", full,
         f"+ {instr_calls:,} Instr calls × {row_cost:.1f} ns"),
    ]
    df = pd.DataFrame(rows, columns=["what", "ms", "how"])
    df["vs_plain"] = df["ms"] / plain if plain > 0 else float("nan")
    in_situ = in_situ_ns_per_read(clock_gap, 0.0, clock_reads) if clock_reads > 0 else math.nan
    df.attrs.update(ns_per_read=ns_per_read, row_cost_ns=row_cost, clock_reads=clock_reads,
                    instr_calls=instr_calls, in_situ_ns_per_read=in_situ)
    return df
