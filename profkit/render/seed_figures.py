"""The figures the seed article publishes, as data, with the sentence each comes from.

Source: ../shared/seeds/explain-analyze-87pct-overhead-cut.txt (Hironobu Suzuki,
"Cut the overhead of EXPLAIN ANALYZE by roughly 87%", August 2025; benchmark at
github.com/s-hironobu/explain_analyze_bench). The article's result tables were images
and are missing from the text: only numbers the text states are recorded here (no
figure is derived or read off a picture). Query-3 (TIMING on) overheads, the variances
and the per-build means other than step 3's are therefore unknown.

Seed environment: PostgreSQL 19dev, Ubuntu 24.04 in Vagrant on macOS, each query run 10
times, mean execution time and sample variance reported, overhead by means.
Build names follow profkit's (the seed says Original / Step 1 / Step 2 / Step 3).
"""
from __future__ import annotations

from dataclasses import dataclass

SEED_SOURCE = "seeds/explain-analyze-87pct-overhead-cut.txt"
SEED_TITLE = "Cut the overhead of EXPLAIN ANALYZE by roughly 87% (H. Suzuki, Aug 2025)"
SEED_ENVIRONMENT = "PostgreSQL 19dev, Ubuntu 24.04 in Vagrant on macOS, 10 runs per query, means"
SEED_REPS = 10

#: profkit build name -> the seed's name for it
SEED_BUILD_LABELS: dict[str, str] = {
    "vanilla": "Original", "step1": "Step 1", "step2": "Step 2", "step3": "Step 3",
}


@dataclass(frozen=True)
class SeedFigure:
    """One number the seed text states."""

    key: str
    build: str | None  # profkit build name, None if not about one build
    query: str | None  # "Query-1" (plain), "Query-2" (TIMING off), "Query-3" (TIMING on)
    value: float
    unit: str
    quote: str  # the sentence of the seed it comes from
    source: str = SEED_SOURCE


FIGURES: tuple[SeedFigure, ...] = (
    SeedFigure("q2_overhead_pct", "vanilla", "Query-2", 29.36, "%",
               "In Step 1, Query-2's execution time decreased by 3.9681 [sec], reducing its "
               "overhead from 29.36 [%] to 20.59 [%]."),
    SeedFigure("q2_overhead_pct", "step1", "Query-2", 20.59, "%",
               "In Step 1, Query-2's execution time decreased by 3.9681 [sec], reducing its "
               "overhead from 29.36 [%] to 20.59 [%]."),
    SeedFigure("q2_overhead_pct", "step2", "Query-2", 10.77, "%",
               "In Step 2, Query-2's execution time decreased by 8.3584 [sec] compared with "
               "the original, reducing the overhead to 10.77 [%]."),
    SeedFigure("q2_overhead_pct", "step3", "Query-2", 3.77, "%",
               "The overhead is now just 3.77[%], which means it has been reduced by "
               "roughly 87[%]."),
    SeedFigure("q2_time_saved_vs_original_s", "step1", "Query-2", 3.9681, "s",
               "In Step 1, Query-2's execution time decreased by 3.9681 [sec]"),
    SeedFigure("q2_time_saved_vs_original_s", "step2", "Query-2", 8.3584, "s",
               "In Step 2, Query-2's execution time decreased by 8.3584 [sec] compared with "
               "the original"),
    SeedFigure("mean_time_s", "step3", "Query-1", 45.9527, "s",
               "In Step 3, Query-1 (a normal SELECT) took 45.9527 [sec]"),
    SeedFigure("mean_time_s", "step3", "Query-2", 47.6872, "s",
               "while Query-2 took 47.6872 [sec], reducing the gap to 1.7345 [sec]."),
    SeedFigure("q2_minus_q1_s", "step3", None, 1.7345, "s",
               "reducing the gap to 1.7345 [sec]."),
    SeedFigure("overhead_reduction_pct", "step3", "Query-2", 87.0, "%",
               "reduced its overhead from 29.36[%] to 3.77[%] in three steps"
               " ... reduced by roughly 87[%]."),
    SeedFigure("q1_regression_vs_original_s", "step3", "Query-1", 0.5, "s",
               "execution time increased by about 0.5 [sec] compared with the original – "
               "roughly a 1[%] slowdown."),
    SeedFigure("q1_regression_vs_original_pct", "step3", "Query-1", 1.0, "%",
               "roughly a 1[%] slowdown."),
    SeedFigure("ns_per_instr_call", "step1", None, 0.496, "ns",
               "3.9681 [sec] / (2 x 4 x 10^9 [times]) = 0.496 [nsec]"),
    SeedFigure("instrumentation_share_pct_low", None, None, 25.0, "%",
               "When counting rows, the instrumentation module can consume 25–30% of total "
               "execution time."),
    SeedFigure("instrumentation_share_pct_high", None, None, 30.0, "%",
               "When counting rows, the instrumentation module can consume 25–30% of total "
               "execution time."),
    # gprof call counts on vanilla (exact counts, from the two gprof excerpts)
    SeedFigure("gprof_calls_ExecInterpExpr", "vanilla", "Query-1", 4000040003, "calls",
               "27.38 34.05 34.05 4000040003 0.00 0.00 ExecInterpExpr"),
    SeedFigure("gprof_calls_ExecNestLoop", "vanilla", "Query-1", 2000000001, "calls",
               "15.68 53.55 19.50 2000000001 0.00 0.00 ExecNestLoop"),
    SeedFigure("gprof_calls_InstrStartNode", "vanilla", "Query-2", 4000215014, "calls",
               "6.01 108.44 10.29 4000215014 0.00 0.00 InstrStartNode"),
    SeedFigure("gprof_calls_InstrStopNode", "vanilla", "Query-2", 4000215014, "calls",
               "5.32 126.86 9.12 4000215014 0.00 0.00 InstrStopNode"),
    SeedFigure("gprof_calls_ExecProcNodeInstr", "vanilla", "Query-2", 4000215015, "calls",
               "4.13 142.94 7.07 4000215015 0.00 0.00 ExecProcNodeInstr"),
)

#: Query-2 (EXPLAIN ANALYZE, TIMING off) overhead % over Query-1, by build.
Q2_OVERHEAD_PCT: dict[str, float] = {
    f.build: f.value for f in FIGURES if f.key == "q2_overhead_pct" and f.build is not None
}

#: Query-3 (TIMING on) overhead %: the text gives no number ("much larger overhead").
Q3_OVERHEAD_PCT: dict[str, float] = {}

#: profkit mode name -> the seed's query name
MODE_TO_QUERY: dict[str, str] = {
    "plain": "Query-1", "analyze_notiming": "Query-2", "analyze_timing": "Query-3",
}


def seed_overhead_pct(build: str, mode: str) -> float | None:
    """The seed's published overhead % of *mode* for *build*, or None if it gives none."""
    if mode == "analyze_notiming":
        return Q2_OVERHEAD_PCT.get(build)
    if mode == "analyze_timing":
        return Q3_OVERHEAD_PCT.get(build)
    return None


def figures(key: str | None = None, build: str | None = None) -> list[SeedFigure]:
    """Seed figures filtered by key and/or build."""
    return [f for f in FIGURES
            if (key is None or f.key == key) and (build is None or f.build == build)]
