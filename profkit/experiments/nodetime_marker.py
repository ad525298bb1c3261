"""Per-plan-node time from samples, attributed exactly by a ``node_marker`` build.

``profkit nodetime`` estimates each plan node's share of a query's CPU time from
sampled stacks (the stack method).  This is the second method, ``method="marker"``:
the query runs on a ``node_marker`` build (profkit/patches/pg18|pg19/node_marker.patch)
with ``track_executor_node = on``, so every backend and parallel worker publishes the
running node's EXPLAIN number, and :mod:`profkit.collect.node_marker` samples the
backend at *frequency* Hz and counts the samples per node.  A sample lands on the
innermost running node, so the counts are exclusive times; inclusive times add the
subtree.  Nothing is inferred from stacks: a sample is never ambiguous.

:func:`run_marker` takes an open connection to a node_marker cluster (the query's
tables loaded), runs ``EXPLAIN (ANALYZE, TIMING FALSE, FORMAT JSON)`` once for the plan's
shape and rows, one warm-up execution, then repeats the query while sampling until
*min_seconds* of wall time have passed, and returns a :class:`MarkerResult` whose
``nodes`` table has, per node in EXPLAIN's order, its samples and its exclusive and
inclusive shares (the same columns as the stack method's table).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from profkit.analyze import nodetime as stack_method
from profkit.collect import node_marker as nm
from profkit.collect.procfs import schedstat
from profkit.errors import ProbeError

if TYPE_CHECKING:
    import psycopg

SETTING = "track_executor_node"
DEFAULT_FREQUENCY = nm.DEFAULT_FREQUENCY
DEFAULT_MIN_SECONDS = 3.0

@dataclass(frozen=True)
class PlanShape:
    """One node of a plan, numbered in EXPLAIN's output order (pre-order, root 0)."""

    node_id: int
    node_type: str
    parent_id: int | None
    depth: int
    relation: str | None
    alias: str | None
    rows: float      # Actual Rows x Actual Loops (NaN without ANALYZE)
    loops: float
    inclusive_ms: float  # Actual Total Time x Actual Loops (NaN with TIMING FALSE)


def _top(plan_json: Any) -> Mapping[str, Any]:
    top = plan_json
    if isinstance(top, (list, tuple)):
        if len(top) == 1 and isinstance(top[0], (list, tuple)):
            top = top[0]
        if len(top) != 1:
            raise ProbeError(f"expected one EXPLAIN (FORMAT JSON) plan, got {len(top)}")
        top = top[0]
    if not isinstance(top, Mapping) or "Plan" not in top:
        raise ProbeError("expected EXPLAIN (FORMAT JSON) output: a list holding one object "
                         "with a 'Plan' key")
    return top


def plan_shape(plan_json: Any) -> list[PlanShape]:
    """The plan's nodes in EXPLAIN's output order: the numbering of the marker."""
    out: list[PlanShape] = []

    def num(x: Any) -> float:
        try:
            return float(x)
        except (TypeError, ValueError):
            return math.nan

    def visit(node: Mapping[str, Any], parent: int | None, depth: int) -> None:
        loops = num(node.get("Actual Loops"))
        rows = num(node.get("Actual Rows")) * loops
        total = num(node.get("Actual Total Time"))
        out.append(PlanShape(len(out), str(node.get("Node Type", "?")), parent, depth,
                             node.get("Relation Name"), node.get("Alias"),
                             rows, loops, total * loops))
        me = len(out) - 1
        for child in node.get("Plans", []) or []:
            visit(child, me, depth + 1)

    visit(_top(plan_json)["Plan"], None, 0)
    return out


def node_table(plan_json: Any, node_samples: Mapping[int, float], outside: float
               ) -> pd.DataFrame:
    """The per-node table of the stack method's builder (profkit.analyze.nodetime), so both
    methods give the same columns; nodes numbered in EXPLAIN's pre-order."""
    return stack_method.shares_from_node_samples(stack_method.plan_nodes(plan_json),
                                                 node_samples, outside)


@dataclass
class MarkerResult:
    """One query's per-node shares by the marker method."""

    sql: str
    plan: Any                     # EXPLAIN (ANALYZE, TIMING FALSE, FORMAT JSON)
    nodes: pd.DataFrame           # per node: samples, exclusive/inclusive shares
    samples: nm.NodeSamples
    executions: int
    seconds: float
    frequency: int
    method: str = "marker"

    @property
    def outside_share(self) -> float:
        return float(self.nodes.attrs.get("outside_executor_share", math.nan))


def _fetch_all(conn: psycopg.Connection, sql: str) -> Any:
    cur = conn.execute(sql)
    try:
        return cur.fetchall()
    except Exception:  # noqa: BLE001 - a statement without a result set
        return None


def check_marker_build(conn: psycopg.Connection) -> None:
    """A clear error when the server is not a node_marker build."""
    row = conn.execute("SELECT count(*) FROM pg_settings WHERE name = %s",
                       (SETTING,)).fetchone()
    if not row or int(row[0]) == 0:
        raise ProbeError(f"this server has no {SETTING} setting: run the query on a "
                         "node_marker build (profkit build node_marker, or pg19/node_marker)")


def run_marker(conn: psycopg.Connection, sql: str, *,
               frequency: int = DEFAULT_FREQUENCY, min_seconds: float = DEFAULT_MIN_SECONDS,
               max_executions: int = 100_000, min_executions: int = 1,
               min_cpu_seconds: float = 0.0, max_seconds: float = math.inf,
               warmup: bool = True,
               around: Callable[[Callable[[], None]], Any] | None = None) -> MarkerResult:
    """Per-node shares of *sql* on the node_marker server behind *conn* (see the module
    docstring).  Sets ``track_executor_node = on`` for the session (and leaves it on).

    After *min_executions*, the query repeats until *min_seconds* of wall time and
    *min_cpu_seconds* of the backend's CPU time (/proc/PID/schedstat: on a loaded machine
    more executions, not fewer samples) have passed, or *max_seconds* of wall time or
    *max_executions*, whichever comes first.

    *around*: called as ``around(loop)`` with the sampled loop of executions, inside the
    sampling (e.g. a perf recording of the same executions); it must call ``loop()``."""
    if min_seconds < 0 or min_cpu_seconds < 0 or max_executions < 1:
        raise ProbeError("min_seconds and min_cpu_seconds must be >= 0, max_executions >= 1")
    check_marker_build(conn)
    conn.execute(f"SET {SETTING} = on")
    plan = conn.execute(f"EXPLAIN (ANALYZE, TIMING FALSE, BUFFERS FALSE, FORMAT JSON) {sql}"
                        ).fetchone()[0]
    if warmup:
        _fetch_all(conn, sql)
    pid = int(conn.info.backend_pid)
    done = 0

    def runner() -> None:
        nonlocal done
        t0 = time.monotonic()
        cpu0 = schedstat(pid)
        while done < max_executions:
            if done >= min_executions:
                wall = time.monotonic() - t0
                now = schedstat(pid)
                cpu = (now[0] - cpu0[0]) / 1e9 if now and cpu0 else wall
                if wall >= max_seconds or (wall >= min_seconds and cpu >= min_cpu_seconds):
                    break
            _fetch_all(conn, sql)
            done += 1

    sampled = runner if around is None else (lambda: around(runner))
    samples = nm.record_node_samples(pid, sampled, frequency=frequency)
    table = node_table(plan, samples.node_samples, samples.outside)
    if not samples.node_samples:
        raise ProbeError(f"no sample landed in a plan node ({samples.backend_samples} samples "
                         f"of backend {pid}, {samples.read_errors} unreadable): is "
                         f"{SETTING} on, and did the query run long enough?")
    return MarkerResult(sql=sql, plan=plan, nodes=table, samples=samples, executions=done,
                        seconds=samples.seconds, frequency=int(frequency))
