"""The headline matrix: what each instrumentation variant costs, in instructions.

For the three seed workloads × PostgreSQL 18 and 19 × GCC and clang × the modes a user
meets —

- ``plain``: the query without EXPLAIN (what a patch costs every query),
- ``analyze_notiming``: rows only, ``EXPLAIN (ANALYZE, TIMING FALSE, BUFFERS FALSE)``
  (the seed's Query-2),
- ``analyze_buffers``: the default ``EXPLAIN (ANALYZE, TIMING FALSE)`` of PostgreSQL 18/19
  (BUFFERS is on by default since 18),
- ``analyze_timing_buffers``: the default ``EXPLAIN ANALYZE`` (TIMING and BUFFERS on),

— every variant (vanilla, the row-counting steps, the timing variants) is counted with
callgrind (one execution per mode after a warm-up plain execution, in a single-user
backend on a cluster loaded at the workload's scale: :func:`measure`), and every count
is set against **vanilla's plain query of the same major and compiler**.  The goals
(≤ 1.0 % for rows only, ≤ 0.3 % for the plain query, ≤ 3.0 % for the default
``EXPLAIN (ANALYZE, TIMING FALSE)`` with BUFFERS on) are printed met or missed per cell
as measured; nothing is rounded towards them.

Instruction counts are deterministic (the same binary, data and statement give the same
count within a few hundred instructions), so they are the figures that hold on a VM whose
CPU time moves by ±30 %.  Under valgrind ``clock_gettime`` is a system call whose kernel
work is not counted: the TIMING TRUE column understates what timing costs.  CPU time is
not measured here (``cpu_ms`` stays empty); ``profkit bench`` measures it with intervals.

The results go to ``benchmarks/results/headline.csv`` (one row per cell) and
``headline.md`` (one table per compiler and major; where both compilers counted a cell,
a table per major with GCC's and clang's figures side by side, and the list of cells where
the compilers disagree: a different met/missed, or overheads more than
:data:`DISAGREE_PTS` percentage points apart); a later run replaces the cells it
measured and keeps the others (any compiler, major, variant, workload or mode it did not
count), so the matrix can be filled in parts.  Numbers the README
or a patch header quotes carry a tag that names their cell,
``+0.32 % [headline: pg18 gcc step5 join_sum plain]``, and
``tests/test_headline_quotes.py`` fails when a tagged number is not the committed one.

Usage::

    .venv/bin/python benchmarks/headline.py                       # everything (long)
    .venv/bin/python benchmarks/headline.py --majors 18 --compilers gcc --builds vanilla,step4,step5
    .venv/bin/python benchmarks/headline.py --compilers clang --builds vanilla,step4,step5
    .venv/bin/python benchmarks/headline.py --check               # print the committed matrix

(``PROFKIT_PG19_SOURCE=tarball:...`` names the PostgreSQL 19 source, as for any pg19 build.)
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CSV_NAME = "headline.csv"
MD_NAME = "headline.md"

MAJORS = ("18", "19")
COMPILERS = ("gcc", "clang")
WORKLOADS = ("nested_loop", "join_sum", "count_star")
# callgrind scale per workload, small enough for CI: nested_loop 0.02 (800,000 Nested Loop
# rows, 355 M instructions in vanilla's plain query; its work grows with scale²), join_sum
# 0.2 (200,000 outer rows, 125 M: at 0.02 planning and EXPLAIN's fixed work would be a
# large share of 13 M and flatter every overhead), count_star 0.02 (200,000 rows, 88 M)
SCALES: dict[str, float] = {"nested_loop": 0.02, "join_sum": 0.2, "count_star": 0.02}
MODES = ("plain", "analyze_notiming", "analyze_buffers", "analyze_timing_buffers")
MODE_LABELS = {
    "plain": "plain",
    "analyze_notiming": "rows only (TIMING FALSE, BUFFERS FALSE)",
    "analyze_buffers": "default EXPLAIN ANALYZE, TIMING FALSE (BUFFERS on)",
    "analyze_timing_buffers": "default EXPLAIN ANALYZE (TIMING, BUFFERS on)",
}
SHORT_MODE = {"plain": "plain", "analyze_notiming": "rows only",
              "analyze_buffers": "default, TIMING FALSE", "analyze_timing_buffers": "default"}
# the goals, against vanilla's plain query of the same major and compiler (percent); the
# default EXPLAIN ANALYZE with TIMING FALSE (BUFFERS on) within 3 % is step6's target
GOALS: dict[str, float] = {"plain": 0.3, "analyze_notiming": 1.0, "analyze_buffers": 3.0}
# GCC's and clang's overheads of one cell (percent of each compiler's own vanilla plain
# query) further apart than this, in percentage points, are listed as a disagreement in
# headline.md, as is every cell whose met/missed differs.  Half the rows-only goal: a gap
# that size moves a cell a long way towards or past its goal.
DISAGREE_PTS = 0.5
# the variants of each major, in table order (vanilla first: the reference)
VARIANTS: dict[str, tuple[str, ...]] = {
    "18": ("vanilla", "step1", "step2", "step3", "step4", "step5", "step6", "coarse_clock",
           "tsc_clock", "sampled_timing", "fast_timing"),
    "19": ("vanilla", "step1", "step2", "step3", "step4", "step5", "step6", "fast_timing"),
}
COLUMNS = ["compiler", "pg_major", "pg_version", "build", "workload", "scale", "mode",
           "instructions", "vanilla_plain_instructions", "vs_vanilla_plain_pct", "goal_pct",
           "verdict", "cpu_ms", "build_key", "valgrind", "measured_at"]
KEY = ["compiler", "pg_major", "build", "workload", "scale", "mode"]

Say = Callable[[str], None]


def build_name(variant: str, major: str, compiler: str) -> str:
    """The profkit build name of a cell: ``step5``, ``pg19/step5``, ``step5@clang``."""
    name = variant if major == "18" else f"pg{major}/{variant}"
    return name if compiler == "gcc" else f"{name}@{compiler}"


@dataclass(frozen=True)
class Count:
    """Instructions of one (build, workload) callgrind session, per mode."""

    build: str
    workload: str
    scale: float
    instructions: dict[str, int]
    pg_version: str
    build_key: str
    valgrind: str
    seconds: float


def measure(build: str, workload: str, scale: float, modes: Sequence[str] = MODES,
            say: Say | None = None, settings: Mapping[str, str] | None = None) -> Count:
    """Count the instructions of one execution of *workload*'s query in each of *modes*
    on *build* (built first if it is not cached): a fresh cluster loaded at *scale*,
    stopped, then one single-user backend under callgrind runs a warm-up plain execution
    (not counted) and each mode once (scope: exec_simple_query).  *settings* are given to
    that backend (``-c name=value``), e.g. a patch's GUC."""
    from profkit.collect.callgrind import collect_callgrind
    from profkit.parse.callgrind import instr_counts_from_session
    from profkit.pg.build import get_build
    from profkit.pg.cluster import Cluster
    from profkit.pg.workloads import get_workload

    say = say or (lambda s: None)
    b = get_build(build, progress=say)
    wl = get_workload(workload)
    t0 = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="profkit-headline-"))
    try:
        with Cluster(b, name=f"headline-{build.replace('/', '-').replace('@', '-')}") as c:
            with c.connect() as conn:
                wl.load(conn, scale)
            c.pause()
            session = collect_callgrind(
                postgres=b.postgres, datadir=c.datadir, os_user=c.os_user,
                queries={m: wl.query(m) for m in modes}, out_dir=scratch / "callgrind",
                warmup_sql="", settings=settings)
        df = instr_counts_from_session(session, build=build, workload=workload)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    counts = {str(m): int(n) for m, n in zip(df["mode"], df["instructions"], strict=True)}
    secs = time.monotonic() - t0
    say(f"{build} {workload} {scale}: " + ", ".join(f"{m} {n:,}" for m, n in counts.items())
        + f" ({secs:.0f} s)")
    return Count(build, workload, scale, counts, b.version.removeprefix("PostgreSQL "),
                 b.key[:12],
                 session.valgrind_version, secs)


def expected_key(build: str) -> str:
    """The cache key (12 hex digits) *build* has with today's source, patches and compiler,
    computed without building."""
    from profkit.pg import build as B

    spec = B.resolve_spec(build)
    src = B.resolve_source(spec)
    files = [B.patch_path(p, src.major) for p in spec.patches]
    return B.cache_key(spec, src, files, B.compiler_identity(spec.cc))[:12]


_MEASURED: dict[tuple[str, str, float, tuple[str, ...]], Count] = {}


def measure_once(build: str, workload: str, scale: float, modes: Sequence[str] = MODES,
                 say: Say | None = None) -> Count:
    """:func:`measure`, counted once per process (the tests share vanilla's counts)."""
    key = (build, workload, scale, tuple(modes))
    if key not in _MEASURED:
        _MEASURED[key] = measure(build, workload, scale, modes, say)
    return _MEASURED[key]


def measure_many(keys: Sequence[tuple[str, str, float, Sequence[str]]], jobs: int | None = None,
                 say: Say | None = None) -> None:
    """Count every (build, workload, scale, modes) of *keys* that :func:`measure_once` has not
    counted yet, *jobs* callgrind sessions at a time (default: one per core), and keep them
    for it.  The builds come first, one at a time (make uses every core).  Instruction
    counts do not depend on what else runs, so sessions side by side give the counts one
    at a time gives; each has its own cluster directory and socket."""
    from concurrent.futures import as_completed

    from profkit.pg.build import get_build

    todo = [k for k in dict.fromkeys((b, w, float(s), tuple(m)) for b, w, s, m in keys)
            if k not in _MEASURED]
    for name in dict.fromkeys(k[0] for k in todo):
        get_build(name, progress=say)
    ex = ThreadPoolExecutor(max_workers=max(1, jobs or os.cpu_count() or 1),
                            thread_name_prefix="callgrind")
    try:
        futs = {ex.submit(measure, b, w, s, m, say): (b, w, s, m) for b, w, s, m in todo}
        for f in as_completed(futs):
            _MEASURED[futs[f]] = f.result()
    except BaseException:
        # an error or Ctrl-C: no new session starts; the ones running (each in its own
        # process group, out of the terminal's reach) finish and stop their clusters
        ex.shutdown(wait=True, cancel_futures=True)
        raise
    ex.shutdown(wait=True)


def cells_of(count: Count, compiler: str, major: str, variant: str) -> list[dict]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return [{"compiler": compiler, "pg_major": major, "pg_version": count.pg_version,
             "build": variant, "workload": count.workload, "scale": count.scale, "mode": m,
             "instructions": n, "build_key": count.build_key, "valgrind": count.valgrind,
             "measured_at": stamp} for m, n in count.instructions.items()]


def with_reference(df: pd.DataFrame) -> pd.DataFrame:
    """Each cell against vanilla's plain query of its compiler, major, workload and scale,
    with the goal and the verdict (met / missed; empty where the mode has no goal or
    vanilla's plain count is missing)."""
    df = df.copy()
    df["pg_major"] = df["pg_major"].astype(str)
    ref = df[(df["build"] == "vanilla") & (df["mode"] == "plain")]
    ref = ref.set_index(["compiler", "pg_major", "workload", "scale"])["instructions"]
    keys = list(zip(df["compiler"], df["pg_major"], df["workload"], df["scale"], strict=True))
    df["vanilla_plain_instructions"] = [ref.get(k, math.nan) for k in keys]
    df["vs_vanilla_plain_pct"] = ((df["instructions"] - df["vanilla_plain_instructions"])
                                  / df["vanilla_plain_instructions"] * 100).round(3)
    df["goal_pct"] = df["mode"].map(GOALS)
    met = df["vs_vanilla_plain_pct"] <= df["goal_pct"]
    df["verdict"] = ["" if math.isnan(g) or math.isnan(v) else ("met" if ok else "missed")
                     for g, v, ok in zip(df["goal_pct"], df["vs_vanilla_plain_pct"], met,
                                         strict=True)]
    if "cpu_ms" not in df:
        df["cpu_ms"] = math.nan
    return df


def _order(df: pd.DataFrame) -> pd.DataFrame:
    var_rank = {(m, v): i for m, vs in VARIANTS.items() for i, v in enumerate(vs)}
    df = df.assign(
        _c=df["compiler"].map({c: i for i, c in enumerate(COMPILERS)}),
        _v=[var_rank.get((str(m), b), 99) for m, b in zip(df["pg_major"], df["build"],
                                                           strict=True)],
        _w=df["workload"].map({w: i for i, w in enumerate(WORKLOADS)}),
        _m=df["mode"].map({m: i for i, m in enumerate(MODES)}))
    df = df.sort_values(["_c", "pg_major", "_w", "scale", "_v", "_m"], kind="stable")
    return df.drop(columns=["_c", "_v", "_w", "_m"]).reset_index(drop=True)


def merge(old: pd.DataFrame | None, new: pd.DataFrame) -> pd.DataFrame:
    """*new*'s cells replace the same cells of *old*; the others stay."""
    if old is None or old.empty:
        both = new
    else:
        old = old.copy()
        old["pg_major"] = old["pg_major"].astype(str)
        idx_new = set(map(tuple, new[KEY].astype(str).values.tolist()))
        keep = [tuple(r) not in idx_new for r in old[KEY].astype(str).values.tolist()]
        both = pd.concat([old[keep], new], ignore_index=True)
    return _order(with_reference(both[[c for c in both.columns
                                       if c not in ("vanilla_plain_instructions",
                                                    "vs_vanilla_plain_pct", "goal_pct",
                                                    "verdict")]]))[COLUMNS]


def read_results(folder: Path = RESULTS) -> pd.DataFrame:
    df = pd.read_csv(folder / CSV_NAME, dtype={"pg_major": str})
    return df


#: Cells of the matrix ``make test`` holds that no committed run has counted yet, as
#: (compiler, major, build).  The tests check this list against the committed file both
#: ways (a counted cell must leave it, a cell may not vanish into it), and the live
#: checks (a variant's counts against vanilla's) still run for these builds.  A run of
#: this script that counts them empties it.
NOT_YET_COUNTED: frozenset[tuple[str, str, str]] = frozenset()


def committed(df: pd.DataFrame, *, compiler: str, major: str, build: str, workload: str,
              mode: str) -> pd.Series | None:
    """:func:`lookup`, or None for a cell of :data:`NOT_YET_COUNTED` (KeyError for any
    other missing cell)."""
    if (compiler, str(major), build) in NOT_YET_COUNTED:
        return None
    return lookup(df, compiler=compiler, major=major, build=build, workload=workload, mode=mode)


def lookup(df: pd.DataFrame, *, compiler: str, major: str, build: str, workload: str,
           mode: str) -> pd.Series:
    """The one committed row of a cell (KeyError naming it when absent)."""
    sel = df[(df["compiler"] == compiler) & (df["pg_major"].astype(str) == str(major))
             & (df["build"] == build) & (df["workload"] == workload) & (df["mode"] == mode)]
    if len(sel) != 1:
        raise KeyError(f"{len(sel)} rows for pg{major} {compiler} {build} {workload} {mode}")
    return sel.iloc[0]


def fmt_pct(v: float) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.2f} %"


PAIR_KEY = ["pg_major", "build", "workload", "scale", "mode"]


def compiler_pairs(df: pd.DataFrame) -> pd.DataFrame:
    """The cells counted with both GCC and clang, one row each, in the matrix's order:
    ``pg_version``, the key, then ``pct_gcc``/``pct_clang`` (each against its own
    compiler's vanilla plain query), ``verdict_gcc``/``verdict_clang`` and
    ``instructions_gcc``/``instructions_clang``."""
    df = _order(df)
    cols = [*PAIR_KEY, "pg_version", "vs_vanilla_plain_pct", "verdict", "instructions"]
    g = df[df["compiler"] == "gcc"][cols]
    c = df[df["compiler"] == "clang"][cols].drop(columns=["pg_version"])
    both = g.merge(c, on=PAIR_KEY, how="inner", suffixes=("_gcc", "_clang"))
    both = both.rename(columns={"vs_vanilla_plain_pct_gcc": "pct_gcc",
                                "vs_vanilla_plain_pct_clang": "pct_clang"})
    for col in ("verdict_gcc", "verdict_clang"):
        both[col] = both[col].fillna("").astype(str)
    return both.reset_index(drop=True)


@dataclass(frozen=True)
class Disagreement:
    """One cell where GCC and clang tell different stories."""

    major: str
    build: str
    workload: str
    mode: str
    pct_gcc: float
    pct_clang: float
    verdict_gcc: str
    verdict_clang: str

    @property
    def gap_pts(self) -> float:
        """clang's overhead minus GCC's, in percentage points."""
        return self.pct_clang - self.pct_gcc

    @property
    def verdicts_differ(self) -> bool:
        return self.verdict_gcc != self.verdict_clang

    def line(self) -> str:
        why = []
        if self.verdicts_differ:
            why.append(f"GCC {self.verdict_gcc}, clang {self.verdict_clang}")
        if abs(self.gap_pts) > DISAGREE_PTS:
            why.append(f"{abs(self.gap_pts):.2f} points apart")
        return (f"pg{self.major} {self.build} {self.workload} {SHORT_MODE[self.mode]}: "
                f"GCC {fmt_pct(self.pct_gcc)}{_mark(self.verdict_gcc)}, clang "
                f"{fmt_pct(self.pct_clang)}{_mark(self.verdict_clang)} ({'; '.join(why)})")


def disagreements(df: pd.DataFrame, pts: float = DISAGREE_PTS) -> list[Disagreement]:
    """The cells counted with both compilers whose met/missed differs or whose overheads
    are more than *pts* percentage points apart, in the matrix's order."""
    out = []
    for r in compiler_pairs(df).itertuples():
        if math.isnan(r.pct_gcc) or math.isnan(r.pct_clang):
            continue  # a compiler's vanilla is not counted yet: nothing to compare
        d = Disagreement(str(r.pg_major), str(r.build), str(r.workload), str(r.mode),
                         float(r.pct_gcc), float(r.pct_clang), r.verdict_gcc, r.verdict_clang)
        if d.verdicts_differ or abs(d.gap_pts) > pts:
            out.append(d)
    return out


def _mark(verdict: str) -> str:
    return {"met": " ✓", "missed": " ✗"}.get(verdict, "")


def compilers_markdown(df: pd.DataFrame) -> list[str]:
    """Where both compilers counted a cell: a table per major with GCC's and clang's
    figures side by side, vanilla's plain query of each, and the disagreements."""
    pairs = compiler_pairs(df)
    if pairs.empty:
        return []
    out: list[str] = []
    for _major, g in pairs.groupby("pg_major", sort=False):
        version = g["pg_version"].dropna().iloc[0]
        out += [f"## PostgreSQL {version}, gcc and clang side by side", "",
                "Each cell: GCC / clang, each against vanilla's plain query of its own "
                "compiler.", ""]
        modes = [m for m in MODES if (g["mode"] == m).any()]
        head = ["workload", "variant", *[SHORT_MODE[m] for m in modes]]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for (b, w), rows in g.groupby(["build", "workload"], sort=False):
            cells = [str(w), str(b)]
            for m in modes:
                r = rows[rows["mode"] == m]
                if r.empty:
                    cells.append("–")
                    continue
                r0 = r.iloc[0]
                cells.append(f"{fmt_pct(r0['pct_gcc'])}{_mark(r0['verdict_gcc'])} / "
                             f"{fmt_pct(r0['pct_clang'])}{_mark(r0['verdict_clang'])}")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        vp = g[(g["build"] == "vanilla") & (g["mode"] == "plain")]
        if not vp.empty:
            out.append("vanilla's plain query, clang against GCC: " + ", ".join(
                f"{r.workload} {int(r.instructions_clang):,} vs {int(r.instructions_gcc):,} "
                f"({fmt_pct((r.instructions_clang - r.instructions_gcc) / r.instructions_gcc * 100)})"
                for r in vp.itertuples()) + " instructions.")
            out.append("")
    found = disagreements(df)
    out += ["## Where the compilers disagree", "",
            f"The cells counted with both compilers whose met/missed differs, or whose "
            f"overheads are more than {DISAGREE_PTS:g} percentage points apart: "
            f"{len(found)} of {len(pairs)}.", ""]
    out += [f"- {d.line()}" for d in found] or ["- none"]
    out.append("")
    return out


def markdown(df: pd.DataFrame) -> str:
    """One table per compiler and major: rows = variants, columns = workload × mode
    (percent against vanilla's plain query; met/missed where the mode has a goal); then,
    where both compilers counted cells, :func:`compilers_markdown`."""
    out = ["# Headline matrix: instructions against vanilla's plain query", "",
           "Generated by `benchmarks/headline.py` (callgrind, one execution per mode after a "
           "warm-up; scope exec_simple_query). Each figure is the cell's instructions against "
           "vanilla's plain query of the same PostgreSQL major, compiler, workload and scale. "
           "Goals: rows only ≤ +1.0 %, plain ≤ +0.3 %, default with TIMING FALSE (BUFFERS on) "
           "≤ +3.0 % (✓ met, ✗ missed). TIMING TRUE under "
           "valgrind leaves out the kernel's clock_gettime work: that column understates "
           "timing's cost. Instruction counts in `headline.csv`.", ""]
    scales = ", ".join(f"{w} {s:g}" for w, s in
                       df.groupby("workload")["scale"].first().reindex(WORKLOADS)
                       .dropna().items())
    out += [f"Scales: {scales}.", ""]
    for (comp, _major), g in df.groupby(["compiler", "pg_major"], sort=False):
        version = g["pg_version"].dropna().iloc[0]
        out += [f"## PostgreSQL {version}, {comp}", ""]
        cols = [(w, m) for w in WORKLOADS for m in MODES
                if ((g["workload"] == w) & (g["mode"] == m)).any()]
        head = ["variant"] + [f"{w} {SHORT_MODE[m]}" for w, m in cols]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for b in dict.fromkeys(g["build"]):
            cells = [b]
            for w, m in cols:
                r = g[(g["build"] == b) & (g["workload"] == w) & (g["mode"] == m)]
                if r.empty:
                    cells.append("–")
                    continue
                r0 = r.iloc[0]
                cells.append(fmt_pct(r0["vs_vanilla_plain_pct"]) + _mark(str(r0["verdict"])))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        vp = g[(g["build"] == "vanilla") & (g["mode"] == "plain")]
        out.append("vanilla's plain query: " + ", ".join(
            f"{r.workload} {int(r.instructions):,}" for r in vp.itertuples()) + " instructions.")
        out.append("")
    out += compilers_markdown(df)
    return "\n".join(out)


def verdict_lines(df: pd.DataFrame) -> list[str]:
    lines = []
    for r in df[df["verdict"].isin(["met", "missed"])].itertuples():
        lines.append(f"pg{r.pg_major} {r.compiler:5s} {r.build:15s} {r.workload:11s} "
                     f"{SHORT_MODE[r.mode]:9s} {fmt_pct(r.vs_vanilla_plain_pct):>9s} "
                     f"goal ≤ {r.goal_pct:.1f} %: {r.verdict.upper()}")
    return lines


def write(df: pd.DataFrame, folder: Path = RESULTS) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    df.to_csv(folder / CSV_NAME, index=False)
    (folder / MD_NAME).write_text(markdown(df))


def _split(s: str | None, allowed: Iterable[str] | None = None) -> list[str] | None:
    if s is None:
        return None
    out = [x.strip() for x in s.split(",") if x.strip()]
    if allowed is not None:
        bad = [x for x in out if x not in allowed]
        if bad:
            raise SystemExit(f"headline.py: unknown {', '.join(bad)}; "
                             f"choose from {', '.join(allowed)}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--majors", default=",".join(MAJORS))
    ap.add_argument("--compilers", default=",".join(COMPILERS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--builds", default=None,
                    help="variants to measure (default: every variant of each major); "
                         "vanilla is always measured too (the reference)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--jobs", type=int, default=1,
                    help="callgrind sessions at once (builds are made one at a time)")
    ap.add_argument("--reuse-vanilla", action="store_true",
                    help="keep vanilla's committed cells instead of counting it again (the "
                         "counts are deterministic; its build must still be the same key)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--check", action="store_true",
                    help="measure nothing: print the committed matrix and its verdicts")
    args = ap.parse_args(argv)

    out: Path = args.out
    old = read_results(out) if (out / CSV_NAME).exists() else None
    if args.check:
        if old is None:
            raise SystemExit(f"headline.py: no {out / CSV_NAME}: run without --check first")
        df = merge(None, old)
        print(markdown(df))
        print("\n".join(verdict_lines(df)))
        return 0

    majors = _split(args.majors, MAJORS) or []
    compilers = _split(args.compilers, COMPILERS) or []
    workloads = _split(args.workloads, WORKLOADS) or []
    modes = _split(args.modes, MODES) or []
    if "plain" not in modes:
        modes = ["plain", *modes]
    wanted = _split(args.builds)
    jobs: list[tuple[str, str, str]] = []  # (compiler, major, variant)
    for comp in compilers:
        for major in majors:
            variants = VARIANTS[major] if wanted is None else \
                [v for v in VARIANTS[major] if v in wanted or v == "vanilla"]
            jobs += [(comp, major, v) for v in variants]
    if args.reuse_vanilla and old is not None:
        # only where the committed cells were counted on the build this source and
        # compiler make now (same cache key)
        have = {(str(r.compiler), str(r.pg_major)) for r in old.itertuples()
                if r.build == "vanilla"
                and r.build_key == expected_key(build_name("vanilla", str(r.pg_major),
                                                           str(r.compiler)))}
        jobs = [j for j in jobs if not (j[2] == "vanilla" and (j[0], j[1]) in have)]
    if wanted:
        unknown = [w for w in wanted if not any(w in VARIANTS[m] for m in majors)]
        if unknown:
            raise SystemExit(f"headline.py: no variant {', '.join(unknown)} in PostgreSQL "
                             f"{', '.join(majors)}")

    def say(s: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {s}", flush=True)

    from profkit.pg.build import get_build

    t0 = time.monotonic()
    for comp, major, v in jobs:  # builds first, one at a time (make uses every core)
        get_build(build_name(v, major, comp), progress=say)
    say(f"builds ready in {time.monotonic() - t0:.0f} s; counting "
        f"{len(jobs) * len(workloads)} sessions")

    def one(job: tuple[str, str, str, str]) -> list[dict]:
        comp, major, v, w = job
        c = measure(build_name(v, major, comp), w, SCALES[w], modes, say)
        return cells_of(c, comp, major, v)

    work = [(c, m, v, w) for c, m, v in jobs for w in workloads]
    rows: list[dict] = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        for part in ex.map(one, work):
            rows += part
            # written as it goes: an interrupted run keeps what it counted
            old = merge(old, pd.DataFrame(rows))
            write(old, out)
            rows = []
    df = read_results(out)
    df = merge(None, df)
    print(markdown(df))
    print("\n".join(verdict_lines(df)))
    print(f"wrote {out / CSV_NAME} and {out / MD_NAME}")
    return 0


if __name__ == "__main__":
    for _base in (ROOT.parent, ROOT.parent.parent):  # the clone, or a worktree beside it
        _tarball = _base / "shared" / "pg-sources" / "postgresql-19beta1.tar.bz2"
        if _tarball.is_file():
            os.environ.setdefault("PROFKIT_PG19_SOURCE", f"tarball:{_tarball}")
            break
    sys.exit(main())
