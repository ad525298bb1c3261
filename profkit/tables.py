"""Column names and dtypes of every tidy table profkit writes.

Each parser ends with ``validate(df, "<table>")`` so a table read back from
``profiles/`` has the same shape as the one that was written.
"""
from __future__ import annotations

import pandas as pd

from profkit.errors import ProfkitError

SCHEMAS: dict[str, dict[str, str]] = {
    # one row per execution of a query in a benchmark run
    "timings": {
        "run_id": "string", "build": "string", "workload": "string", "query": "string",
        "mode": "string", "rep": "int64", "order": "int64",
        "client_ms": "float64", "server_ms": "float64",
    },
    # folded stacks: "a;b;c" -> weight
    "stacks": {
        "run_id": "string", "build": "string", "tool": "string", "stack": "string",
        "weight": "float64", "unit": "string",
    },
    # one row per function per profile
    "functions": {
        "run_id": "string", "build": "string", "tool": "string", "function": "string",
        "module": "string", "calls": "Int64", "self": "float64", "total": "float64",
        "self_share": "float64",
    },
    # gprof call graph edges
    "call_edges": {
        "run_id": "string", "build": "string", "caller": "string", "callee": "string",
        "calls": "Int64",
    },
    # one row per plan node of one query
    "plan_nodes": {
        "run_id": "string", "build": "string", "query": "string", "node_id": "int64",
        "node_type": "string", "parent_id": "Int64", "rows": "float64", "loops": "float64",
        "clock_calls_predicted": "Int64", "clock_calls_measured": "Int64",
        "instr_ns": "float64",
    },
    "clock_cost": {
        "run_id": "string", "source": "string", "ns_per_call": "float64",
        "histogram": "object",
    },
    # instructions retired by the backend for ONE execution of a query
    # (tool: "callgrind" or "perf_stat"; scope: what was counted, e.g. "exec_simple_query")
    "instr_counts": {
        "run_id": "string", "build": "string", "workload": "string", "query": "string",
        "mode": "string", "instructions": "Int64", "tool": "string", "scope": "string",
    },
    # clock_cost.histogram exploded: successive-read deltas of one clock source,
    # bucket_ns = bucket upper bound (U/2 <= delta < U; 0 = clock did not advance)
    "clock_histogram": {
        "run_id": "string", "source": "string", "bucket_ns": "int64", "count": "int64",
        "share": "float64",
    },
    # `perf stat -x,` counters of one recording (value NaN where "<not supported>")
    "perf_stat": {
        "run_id": "string", "build": "string", "event": "string", "value": "float64",
        "unit": "string", "supported": "bool", "runtime_pct": "float64",
    },
    # one row per plan node per EXPLAIN ANALYZE execution of the timing-accuracy runs
    # (profkit.experiments.timing_accuracy): arm = build label (+ settings), times in ms,
    # inclusive = Actual Total Time x loops, exclusive = inclusive - children's
    "timing_nodes": {
        "run_id": "string", "workload": "string", "arm": "string", "preset": "string",
        "mode": "string", "rep": "int64", "order": "int64", "node_id": "int64",
        "parent_id": "Int64", "node_type": "string", "depth": "int64", "rows": "float64",
        "loops": "float64", "startup_ms": "float64", "total_ms": "float64",
        "inclusive_ms": "float64", "exclusive_ms": "float64",
    },
    # one execution of one query, unobserved or watched by one observer (profkit.experiments.observers):
    # method unobserved / ltrace / bcc / bpftrace / perf / callgrind, variant e.g.
    # "clock_gettime", "per_node", "999Hz"; baseline_order = order of the unobserved
    # execution run just before it; hits = probe hits (or perf samples) of this execution;
    # guard_* = what profkit.collect.bpf's cost guard predicted before attaching;
    # cpu_ms / runq_ms = the backend's CPU time / time waiting for a CPU during the
    # statement (/proc/PID/schedstat), robust to other processes' load
    "observer_timings": {
        "run_id": "string", "workload": "string", "scale": "float64", "mode": "string",
        "method": "string", "variant": "string", "rep": "int64", "order": "int64",
        "baseline_order": "Int64", "client_ms": "float64", "server_ms": "float64",
        "hits": "Int64", "hits_kind": "string", "guard_hits": "Int64",
        "guard_estimate_ms": "float64", "cpu_ms": "float64", "runq_ms": "float64",
    },
}


class SchemaError(ProfkitError):
    pass


def empty(table: str) -> pd.DataFrame:
    cols = SCHEMAS[table]
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in cols.items()})


def validate(df: pd.DataFrame, table: str, *, extra_ok: bool = True) -> pd.DataFrame:
    """Check that *df* has the table's columns, cast to its dtypes, return it.

    Extra columns are allowed (a collector may add detail) unless *extra_ok* is False.
    """
    try:
        cols = SCHEMAS[table]
    except KeyError:
        raise SchemaError(f"unknown table {table!r}; known: {', '.join(SCHEMAS)}") from None
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise SchemaError(f"table {table!r} lacks columns {missing}")
    if not extra_ok:
        extra = [c for c in df.columns if c not in cols]
        if extra:
            raise SchemaError(f"table {table!r} has unexpected columns {extra}")
    out = df.copy()
    for c, t in cols.items():
        if t == "object":
            continue
        try:
            out[c] = out[c].astype(t)
        except (TypeError, ValueError) as e:
            raise SchemaError(f"table {table!r}: column {c!r} is not {t}: {e}") from None
    return out
