"""How a workload's query runs: plain, or under EXPLAIN ANALYZE with TIMING off/on (and
BUFFERS). A module of constants only, so that the command line can offer the modes as
choices without importing the workload machinery (:mod:`profkit.pg.workloads`
re-exports them)."""
from __future__ import annotations

MODES: tuple[str, ...] = ("plain", "analyze_notiming", "analyze_timing")
EXPLAIN_PREFIX: dict[str, str] = {
    "plain": "",
    "analyze_notiming": "EXPLAIN (ANALYZE TRUE, TIMING FALSE, BUFFERS FALSE) ",
    "analyze_timing": "EXPLAIN (ANALYZE TRUE, TIMING TRUE, BUFFERS FALSE) ",
    "analyze_buffers": "EXPLAIN (ANALYZE TRUE, TIMING FALSE, BUFFERS TRUE) ",
    "analyze_timing_buffers": "EXPLAIN (ANALYZE TRUE, TIMING TRUE, BUFFERS TRUE) ",
}
# the seed's names for the triple
SEED_QUERY_NAMES: dict[str, str] = {"plain": "Query-1", "analyze_notiming": "Query-2",
                                    "analyze_timing": "Query-3"}
