"""The benchmark report: the seed-style table beside the seed's figures, and a chart.

Input is the summary table of :func:`profkit.analyze.stats.summarize` (optionally with
``instr`` / ``instr_overhead_pct`` from :func:`~profkit.analyze.stats.attach_instructions`)
and a provenance dict written by the benchmark runner. Three outputs:

- :func:`render_markdown` — ``report.md``: provenance header, the seed-style table
  (per build: plain median, Query-2 and Query-3 overhead % with 95 % CI, instruction
  overhead %, the seed's published Query-2 figure), the full per-mode table (n, median,
  mean, sample variance) and optional build-to-build tests.
- :func:`render_console` — a :class:`rich.table.Table` for the terminal.
- :func:`plot_overheads` — PNG + SVG bar chart (Agg, no pyplot global state,
  deterministic output for identical input).
"""
from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
from rich.table import Table

from profkit.render import seed_figures as _seed
from profkit.analyze.stats import (
    METRICS,
    MIN_VERDICT_REPS,
    SLOW_MIN_EXCESS,
    SLOW_Z,
    BenchExtras,
    bench_extras,
    summary_table,
    build_order,
    reference_comparisons,
    simultaneous_level,
    few_reps_text,
    plain_suspect,
    time_below_instructions,
    too_few_count,
)
from profkit.errors import ProfkitError
from profkit.pg.workloads import SEED_QUERY_NAMES
from profkit.render.markdown import table as md_table


class ReportError(ProfkitError):
    """The summary given to a renderer cannot be rendered (the message says why)."""


Q2, Q3 = "analyze_notiming", "analyze_timing"
MODE_LABELS = {
    "plain": "Query-1 (plain)",
    Q2: "Query-2 (ANALYZE, TIMING off)",
    Q3: "Query-3 (ANALYZE, TIMING on)",
}
_REQUIRED = ("build", "mode", "n", "median_ms", "overhead_pct", "ci_low_pct", "ci_high_pct")


def _check(summary: pd.DataFrame) -> pd.DataFrame:
    if not isinstance(summary, pd.DataFrame):
        raise ReportError(f"expected the summary DataFrame from stats.summarize, not "
                          f"{type(summary).__name__}")
    missing = [c for c in _REQUIRED if c not in summary.columns]
    if missing:
        raise ReportError(f"summary lacks columns {missing}: pass the output of "
                          "profkit.analyze.stats.summarize (plus attach_instructions)")
    out = summary.copy()
    if "instr" not in out.columns:
        out["instr"] = pd.array([pd.NA] * len(out), dtype="Int64")
    if "instr_overhead_pct" not in out.columns:
        out["instr_overhead_pct"] = math.nan
    return out


def _isnum(x: object) -> bool:
    try:
        return x is not None and x is not pd.NA and math.isfinite(float(x))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def _fmt_pct(v: object, ci: tuple[object, object] | None = None, digits: int = 2,
             method: object = None) -> str:
    """*v* with its interval *ci* in brackets; when *method* (a ``ci_method``) says the
    interval came from fewer repetitions than a verdict needs, the value and
    ", too few (n = N)" instead: such an interval covers far less than its level."""
    if not _isnum(v):
        return "–"
    s = f"{float(v):.{digits}f}"  # type: ignore[arg-type]
    few = few_reps_text(method)
    if ci is not None and few is not None:
        return f"{s}, {few}"
    if ci is not None and _isnum(ci[0]) and _isnum(ci[1]):
        s += f" [{float(ci[0]):.{digits}f}, {float(ci[1]):.{digits}f}]"  # type: ignore[arg-type]
    return s


def _fmt_ms(v: object) -> str:
    if not _isnum(v):
        return "–"
    return f"{float(v):.2f}"  # type: ignore[arg-type]


def _fmt_int(v: object) -> str:
    return f"{int(v):,}" if _isnum(v) else "–"  # type: ignore[arg-type]


def _cell(summary: pd.DataFrame, build: str, mode: str) -> pd.Series | None:
    rows = summary[(summary["build"] == build) & (summary["mode"] == mode)]
    return None if rows.empty else rows.iloc[0]


def seed_table(summary: pd.DataFrame, seed: ModuleType = _seed) -> pd.DataFrame:
    """One row per build: the figures of the seed's table, measured here, and the seed's.

    Columns: build, seed_name, n, plain_median_ms, q2_overhead_pct, q2_ci_low, q2_ci_high,
    seed_q2_overhead_pct, q3_overhead_pct, q3_ci_low, q3_ci_high, seed_q3_overhead_pct,
    q2_instr_overhead_pct, q3_instr_overhead_pct, plain_instr, q2_ci_method, q3_ci_method
    (how each interval was drawn; "too few" when fewer repetitions than a verdict needs
    stand behind it, see :func:`profkit.analyze.stats.too_few_reps`), n_q2, n_q3.
    ``n`` is the plain query's executions kept, ``n_q2``/``n_q3`` Query-2's and
    Query-3's: the vCPU rule leaves different ones out (:func:`n_text` shows all three
    where they differ).
    """
    s = _check(summary)
    rows = []
    for b in build_order(s["build"].unique().tolist()):
        plain, q2, q3 = (_cell(s, b, m) for m in ("plain", Q2, Q3))

        def g(r: pd.Series | None, c: str) -> Any:
            return r[c] if r is not None else math.nan

        rows.append({
            "build": b, "seed_name": seed.SEED_BUILD_LABELS.get(b, ""),
            "n": int(plain["n"]) if plain is not None else 0,
            "plain_median_ms": g(plain, "median_ms"),
            "q2_overhead_pct": g(q2, "overhead_pct"), "q2_ci_low": g(q2, "ci_low_pct"),
            "q2_ci_high": g(q2, "ci_high_pct"),
            "seed_q2_overhead_pct": seed.seed_overhead_pct(b, Q2),
            "q3_overhead_pct": g(q3, "overhead_pct"), "q3_ci_low": g(q3, "ci_low_pct"),
            "q3_ci_high": g(q3, "ci_high_pct"),
            "seed_q3_overhead_pct": seed.seed_overhead_pct(b, Q3),
            "q2_instr_overhead_pct": g(q2, "instr_overhead_pct"),
            "q3_instr_overhead_pct": g(q3, "instr_overhead_pct"),
            "plain_instr": g(plain, "instr"),
            "q2_ci_method": q2.get("ci_method") if q2 is not None else None,
            "q3_ci_method": q3.get("ci_method") if q3 is not None else None,
            "n_q2": int(q2["n"]) if q2 is not None else 0,
            "n_q3": int(q3["n"]) if q3 is not None else 0,
        })
    return pd.DataFrame(rows)


def n_text(r: Any) -> str:
    """A seed-table row's executions: "10" when plain, Query-2 and Query-3 kept as many,
    else "9 / 7 / 6" (plain / Query-2 / Query-3), so that an overhead's interval is not
    read as resting on more repetitions than its mode kept."""
    ns = (int(r.n), int(getattr(r, "n_q2", r.n)), int(getattr(r, "n_q3", r.n)))
    return str(ns[0]) if len(set(ns)) == 1 else " / ".join(map(str, ns))


def reference_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per build: its plain Query-1, Query-2 and Query-3 against **vanilla's**
    plain Query-1 of the same PostgreSQL major (what a patch costs against an unpatched
    server; columns from
    :func:`profkit.analyze.stats.attach_reference`). Empty when the summary lacks them."""
    cols = ["build", "pg_version", "ref_build", "plain_vs_ref_pct", "plain_vs_ref_ci_low",
            "plain_vs_ref_ci_high", "plain_vs_ref_instr_pct", "q2_vs_ref_pct", "q2_vs_ref_ci_low",
            "q2_vs_ref_ci_high", "q2_vs_ref_instr_pct", "q3_vs_ref_pct", "q3_vs_ref_ci_low",
            "q3_vs_ref_ci_high", "q3_vs_ref_instr_pct", "plain_vs_ref_ci_method",
            "q2_vs_ref_ci_method", "q3_vs_ref_ci_method"]
    if "ref_build" not in summary.columns or summary["ref_build"].isna().all():
        return pd.DataFrame(columns=cols)
    rows = []
    for b in build_order(summary["build"].unique().tolist()):
        row: dict[str, Any] = {"build": b}
        for tag, mode in (("plain", "plain"), ("q2", Q2), ("q3", Q3)):
            r = _cell(summary, b, mode)
            if r is None:
                continue
            row["pg_version"], row["ref_build"] = r.get("pg_version"), r.get("ref_build")
            row[f"{tag}_vs_ref_pct"] = r.get("vs_ref_pct")
            row[f"{tag}_vs_ref_ci_low"] = r.get("vs_ref_ci_low_pct")
            row[f"{tag}_vs_ref_ci_high"] = r.get("vs_ref_ci_high_pct")
            row[f"{tag}_vs_ref_instr_pct"] = r.get("vs_ref_instr_pct")
            row[f"{tag}_vs_ref_ci_method"] = r.get("vs_ref_ci_method")
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


def reference_levels(summary: pd.DataFrame) -> tuple[int, float, bool]:
    """(comparisons, level of each interval, simultaneous?) of the against-vanilla
    intervals: from :func:`~profkit.analyze.stats.attach_reference`'s ``attrs``, else
    counted from the rows as its default draws them (simultaneous, 95 %)."""
    a = summary.attrs
    if "vs_ref_family" in a:
        return int(a["vs_ref_family"]), float(a["vs_ref_level"]), bool(a["vs_ref_simultaneous"])
    if "ref_build" not in summary.columns:
        return 0, 0.95, False
    k = reference_comparisons(summary["build"], summary["mode"], summary["ref_build"])
    return k, simultaneous_level(0.95, k), True


def _reference_ci_words(summary: pd.DataFrame) -> tuple[str, str]:
    """The header's bracket label and the sentence saying what the brackets are."""
    k, level, simultaneous = reference_levels(summary)
    if simultaneous and k > 1:
        return ("95% sim. CI",
                f"brackets: 95 % intervals that hold together over the table's {k} comparisons "
                f"(each at {level * 100:.2f} %, Bonferroni), so the chance that any of them "
                "excludes 0 where nothing differs is at most 5 %, not 5 % per interval")
    return "95% CI", "brackets: 95 % CI"


def reference_markdown(summary: pd.DataFrame) -> list[str]:
    """The report's section for :func:`reference_table` ([] when there is nothing)."""
    rt = reference_table(summary)
    if rt.empty or rt["ref_build"].isna().all():
        return []
    metric = str(summary["metric"].iloc[0]) if "metric" in summary.columns else "time"
    label, words = _reference_ci_words(summary)
    out = ["## Against vanilla's plain Query-1", "",
           (f"Each build's plain query, Query-2 and Query-3 against the plain Query-1 of the "
            f"vanilla build of the same PostgreSQL major (`ref`), by `{metric}` (median of the "
            f"per-repetition ratios: the builds are interleaved; {words}) and in "
            "instructions (callgrind). The plain column is what a patch costs a query that is "
            "not explained (target: ≤ 0.3 %); Query-2's is the row-counting cost "
            "a user sees against an unpatched server (target: ≤ 1.0 %). Between two binaries "
            "CPU time also carries code layout (step2's plain query, vanilla's instruction "
            "count, ran 3.3–3.7 % slower here): judge a 1 % difference by the instructions."),
           ""]
    rows = [_reference_cells(r) for r in rt.itertuples()]
    out += [_md_table(["build", "PostgreSQL", "ref", f"plain vs ref % [{label}]",
                       "plain vs ref instr %", f"Q2 vs ref % [{label}]", "Q2 vs ref instr %",
                       f"Q3 vs ref % [{label}]", "Q3 vs ref instr %"], rows), ""]
    return out


def reference_console(summary: pd.DataFrame) -> Table | None:
    """:func:`reference_table` for the terminal (None when there is nothing)."""
    rt = reference_table(summary)
    if rt.empty or rt["ref_build"].isna().all():
        return None
    label, _words = _reference_ci_words(summary)
    k, level, simultaneous = reference_levels(summary)
    title = "against vanilla's plain Query-1 (same PostgreSQL major)"
    if simultaneous and k > 1:
        title += f"; {k} intervals that hold together at 95 % (each {level * 100:.2f} %)"
    t = Table(title=title, title_justify="left", header_style="bold")
    for col in ("build", "PG", "ref", f"plain % [{label}]", "plain instr %", f"Q2 % [{label}]",
                "Q2 instr %", f"Q3 % [{label}]", "Q3 instr %"):
        t.add_column(col, justify="left" if col in ("build", "PG", "ref") else "right")
    for r in rt.itertuples():
        t.add_row(*_reference_cells(r))
    return t


def _reference_cells(r: Any) -> list[str]:
    """One :func:`reference_table` row as text: build, PG, ref, then per query the time
    against the reference [CI] and the instructions against it."""
    cells = [str(r.build), str(r.pg_version) if _present(r.pg_version) else "–",
             str(r.ref_build) if _present(r.ref_build) else "–"]
    for tag in ("plain", "q2", "q3"):
        g = lambda k, tag=tag: getattr(r, f"{tag}_vs_ref_{k}")  # noqa: E731
        cells += [_fmt_pct(g("pct"), (g("ci_low"), g("ci_high")), method=g("ci_method")),
                  _fmt_pct(g("instr_pct"), digits=3)]
    return cells


def _present(x: object) -> bool:
    return x is not None and x is not pd.NA and not (isinstance(x, float) and math.isnan(x))


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]],
              align: Sequence[str] | None = None) -> str:
    return md_table(header, rows, align or ["l"] + ["r"] * (len(header) - 1))


def _provenance_lines(prov: Mapping[str, Any]) -> list[str]:
    """Key provenance fields first, in a fixed order; anything else after, as given."""
    lines: list[str] = []
    shown: set[str] = set()

    def take(*keys: str) -> Any:
        for k in keys:
            if k in prov and prov[k] not in (None, ""):
                shown.add(k)
                return prov[k]
        return None

    run_id = take("run_id", "run")
    date = take("date", "started_at", "start")
    ended = take("ended_at", "end")
    cmd = take("command_line", "command", "argv")
    workload = take("workload")
    scale = take("scale")
    reps = take("reps", "repetitions")
    metric = take("metric")
    counter = take("instruction_counter", "instr_tool")
    machine = take("machine")
    builds = take("builds")
    if not builds and isinstance(prov.get("build"), Mapping):  # a one-build run
        builds = [take("build")]
        shown.add("build_name")
    settings = take("settings")
    tools = take("tools")
    artifacts = take("artifacts")
    if run_id:
        lines.append(f"- **Run:** `{run_id}`")
    if date:
        lines.append(f"- **Date:** {date}" + (f" → {ended}" if ended else ""))
    if cmd:
        c = " ".join(map(str, cmd)) if isinstance(cmd, (list, tuple)) else str(cmd)
        lines.append(f"- **Command line:** `{c}`")
    if workload or scale or reps:
        lines.append(f"- **Workload:** {workload or '?'} at scale {scale if scale else '?'}, "
                     f"{reps if reps else '?'} repetitions per build and mode (interleaved)")
    if metric:
        lines.append(f"- **Time measured:** {metric}")
    if counter:
        lines.append(f"- **Instruction counts:** {counter}")
    if isinstance(machine, Mapping):
        parts = [f"{k}: {v}" for k, v in machine.items() if v not in (None, "")]
        lines.append("- **Machine:** " + "; ".join(parts))
    elif machine:
        lines.append(f"- **Machine:** {machine}")
    if builds:
        lines.append("- **Builds:**")
        items = builds.items() if isinstance(builds, Mapping) else (
            (b.get("build", b.get("name", "?")), b) for b in builds)
        for name, info in items:
            lines.append(f"  - `{name}`: {_build_line(info)}")
    if isinstance(settings, Mapping) and settings:
        lines.append("- **Settings:** " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    if isinstance(tools, Mapping) and tools:
        lines.append("- **Tools:** " + "; ".join(f"{k}: {v}" for k, v in tools.items() if v))
    if isinstance(artifacts, Mapping) and artifacts:
        lines.append("- **Files:** " + ", ".join(f"`{k}`" for k in artifacts))
    for k, v in prov.items():
        if k in shown or v in (None, "", [], {}):
            continue
        if isinstance(v, Mapping):
            v = "; ".join(f"{kk}: {vv}" for kk, vv in v.items())
        lines.append(f"- **{k}:** {v}")
    return lines


def _build_line(info: Any) -> str:
    if not isinstance(info, Mapping):
        return str(info)
    parts = []
    pgc = info.get("pg_config") or {}
    version = pgc.get("VERSION") if isinstance(pgc, Mapping) else None
    src = info.get("source") or {}
    version = version or info.get("version") or (
        src.get("version") if isinstance(src, Mapping) else None)
    if version:
        parts.append(str(version))
    patches = info.get("patches") or []
    if patches:
        ps = []
        for p in patches:
            if isinstance(p, Mapping):
                h = str(p.get("sha256", p.get("hash", "")))[:12]
                ps.append(f"{p.get('name', '?')} (sha256 {h})" if h else str(p.get("name")))
            else:
                ps.append(str(p))
        parts.append("patches " + ", ".join(ps))
    else:
        parts.append("no patches")
    cflags = info.get("cflags") or (pgc.get("CFLAGS") if isinstance(pgc, Mapping) else None)
    if cflags:
        parts.append(f"CFLAGS `{cflags}`")
    if info.get("key"):
        parts.append(f"key {str(info['key'])[:12]}")
    arm = info.get("arm_settings")
    if isinstance(arm, Mapping) and arm:
        pre = f"preset `{info['preset']}`, " if info.get("preset") else ""
        parts.append(pre + "settings " + ", ".join(f"`{k}={v}`" for k, v in arm.items()))
    return "; ".join(parts)


def render_markdown(
    summary: pd.DataFrame,
    provenance: Mapping[str, Any],
    seed: ModuleType = _seed,
    *,
    comparisons: pd.DataFrame | None = None,
    chart: str | None = None,
    title: str = "EXPLAIN ANALYZE overhead: plain vs ANALYZE (TIMING off / on)",
) -> str:
    """The markdown report. *comparisons* is :func:`~profkit.analyze.stats.compare_chain`
    output; *chart* a relative path of the PNG to embed.

    An empty summary gives a report that says no data was measured (with provenance),
    not an error: a run that died before its first repetition still leaves a report.
    """
    s = _check(summary)
    out: list[str] = [f"# {title}", ""]
    out += _provenance_lines(provenance or {})
    out.append("")
    if s.empty:
        out += [("**No data:** the run recorded no timings (it stopped before the first "
                "repetition, or every execution failed). Check the run's log."), ""]
        return "\n".join(out)

    metric = str(s["metric"].iloc[0]) if "metric" in s.columns else "server_ms"
    center = str(s["center"].iloc[0]) if "center" in s.columns else "median"
    st = seed_table(s, seed)
    out += [
        "## Overhead over the plain query (seed-style table)",
        "",
        (f"Overhead % of a mode over the plain query of the same build, from `{metric}`: "
         f"the {center} over repetitions of (mode_r − plain_r) / plain_r × 100 when the "
         "repetitions were interleaved (`paired`), else "
         f"({center}(mode) − {center}(plain)) / {center}(plain) × 100. Brackets: bootstrap "
         "95 % confidence interval (BCa, seeded). Instruction overhead: one execution "
         "counted by callgrind (repeatable to ~0.0001 %; it understates TIMING on, whose "
         "clock reads are system calls under valgrind). The seed's figures are means of 10 "
         "runs on another machine (PostgreSQL 19dev): compare the ordering and rough size, "
         "not the digits. n: the executions kept (plain / Query-2 / Query-3 where they "
         "differ; an overhead pairs its mode with plain on the repetitions that kept "
         "both)."),
        "",
    ]
    header = ["build", "n", "plain median ms", "Query-2 overhead % [95% CI]", "seed Query-2 %",
              "Query-3 overhead % [95% CI]", "Q2 instr. overhead %", "Q3 instr. overhead %"]
    rows = []
    for r in st.itertuples():
        rows.append([
            f"{r.build}" + (f" ({r.seed_name})" if r.seed_name else ""), n_text(r),
            _fmt_ms(r.plain_median_ms),
            _fmt_pct(r.q2_overhead_pct, (r.q2_ci_low, r.q2_ci_high), method=r.q2_ci_method),
            _fmt_pct(r.seed_q2_overhead_pct),
            _fmt_pct(r.q3_overhead_pct, (r.q3_ci_low, r.q3_ci_high), method=r.q3_ci_method),
            _fmt_pct(r.q2_instr_overhead_pct), _fmt_pct(r.q3_instr_overhead_pct),
        ])
    out += [_md_table(header, rows), ""]
    if not seed.Q3_OVERHEAD_PCT:
        out += [("The seed's text gives no Query-3 figure (its tables were images); "
                f"source: `{seed.SEED_SOURCE}`."), ""]
    q2_seed = ", ".join(f"{seed.SEED_BUILD_LABELS.get(b, b)} {v:.2f} %"
                        for b, v in seed.Q2_OVERHEAD_PCT.items())
    out += [(f"Seed ({seed.SEED_TITLE}): Query-2 overhead {q2_seed}; step 3 Query-1 "
            "45.9527 s, Query-2 47.6872 s."), ""]

    out += reference_markdown(s)
    if chart:
        out += [f"![overhead chart]({chart})", ""]

    out += ["## Every build and mode", "",
            ("Times in ms; variance is the sample variance (ddof = 1) in ms², as the seed "
            "reports; `paired` says whether the CI resampled repetitions jointly."), ""]
    header2 = ["build", "mode", "n", "median ms", "mean ms", "variance ms²", "overhead %",
               "95% CI", "mean-based overhead %", "paired", "instructions", "instr. overhead %"]
    rows2 = []
    for r in s.itertuples():
        few = few_reps_text(getattr(r, "ci_method", None))
        ci = (few if few else f"[{r.ci_low_pct:.2f}, {r.ci_high_pct:.2f}]"
              if _isnum(r.ci_low_pct) and _isnum(r.ci_high_pct) else "–")
        rows2.append([
            r.build, r.mode, str(r.n), _fmt_ms(r.median_ms), _fmt_ms(getattr(r, "mean_ms", None)),
            (f"{r.variance:.4g}" if _isnum(getattr(r, "variance", None)) else "–"),
            _fmt_pct(r.overhead_pct), ci, _fmt_pct(getattr(r, "overhead_mean_pct", None)),
            str(bool(getattr(r, "paired", False))).lower(), _fmt_int(r.instr),
            _fmt_pct(r.instr_overhead_pct),
        ])
    out += [_md_table(header2, rows2, ["l", "l"] + ["r"] * 10), ""]

    if comparisons is not None and not comparisons.empty:
        out += ["## Does each step change the overhead?", "",
                ("Difference of overhead (b − a, percentage points) with its bootstrap 95 % CI; "
                "Mann–Whitney U p-values on the mode's per-repetition times and on the "
                "per-repetition overheads. \"differs?\": yes when the interval excludes 0 "
                "and the rank test on the overheads agrees (p below 0.05); where the "
                "interval alone would say yes and the test does not, no, with its p. "
                "\"too few\": fewer than "
                f"{MIN_VERDICT_REPS} repetitions behind the interval, which then covers far "
                "less than 95 %: no verdict."), ""]
        header3 = ["a → b", "mode", "overhead a %", "overhead b %", "b − a [95% CI]",
                   "differs?", "p (overheads)", "p (times)"]
        rows3 = []
        for r in comparisons.itertuples():
            rows3.append([
                f"{r.a} → {r.b}", r.mode, _fmt_pct(r.overhead_a_pct), _fmt_pct(r.overhead_b_pct),
                _fmt_pct(r.overhead_diff_pct, (r.diff_ci_low_pct, r.diff_ci_high_pct),
                         method=r.ci_method),
                differs_text(r),
                f"{r.overhead_p_value:.3g}" if _isnum(r.overhead_p_value) else "–",
                f"{r.time_p_value:.3g}" if _isnum(r.time_p_value) else "–",
            ])
        out += [_md_table(header3, rows3, ["l", "l"] + ["r"] * 6), ""]
    return "\n".join(out)


def render_console(summary: pd.DataFrame, seed: ModuleType = _seed,
                   title: str | None = "EXPLAIN ANALYZE overhead vs plain") -> Table:
    """A rich Table of the seed-style view (empty summary: a table with one 'no data' row)."""
    s = _check(summary)
    t = Table(title=title, title_justify="left", header_style="bold")
    for col, just in (("build", "left"), ("n", "right"), ("plain median ms", "right"),
                      ("Q2 overhead % [95% CI]", "right"), ("seed Q2 %", "right"),
                      ("Q3 overhead % [95% CI]", "right"), ("Q2 instr %", "right"),
                      ("Q3 instr %", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    if s.empty:
        t.add_row("no data", *([""] * 7))
        return t
    for r in seed_table(s, seed).itertuples():
        t.add_row(
            r.build, n_text(r), _fmt_ms(r.plain_median_ms),
            _fmt_pct(r.q2_overhead_pct, (r.q2_ci_low, r.q2_ci_high), method=r.q2_ci_method),
            _fmt_pct(r.seed_q2_overhead_pct),
            _fmt_pct(r.q3_overhead_pct, (r.q3_ci_low, r.q3_ci_high), method=r.q3_ci_method),
            _fmt_pct(r.q2_instr_overhead_pct), _fmt_pct(r.q3_instr_overhead_pct),
        )
    return t


# ---------------------------------------------------------------------------
# chart

_COLORS = {Q2: "#4C72B0", Q3: "#DD8452"}
_OTHER_COLORS = ("#55A868", "#8172B3", "#937860", "#DA8BC3")


def _footer(prov: Mapping[str, Any] | None) -> str:
    if not prov:
        return ""
    bits = []
    for k in ("run_id", "date", "started_at"):
        if prov.get(k):
            bits.append(str(prov[k]))
            break
    if prov.get("workload"):
        bits.append(f"{prov['workload']} scale {prov.get('scale', '?')}")
    if prov.get("reps"):
        x = prov.get("extra_repetitions")
        extra = int(x.get("extra_reps") or 0) if isinstance(x, Mapping) else 0
        bits.append(f"{prov['reps']} reps" + (f" + {extra} extra (vCPU rule)" if extra else ""))
    m = prov.get("machine")
    if isinstance(m, Mapping):
        for k in ("cpu", "cpu_model", "kernel", "clocksource", "virtualization"):
            if m.get(k):
                bits.append(str(m[k]))
    if prov.get("instruction_counter"):
        bits.append(f"instructions: {prov['instruction_counter']}")
    return " · ".join(bits)


def plot_overheads(
    summary: pd.DataFrame,
    path_png: str | os.PathLike[str] | None,
    path_svg: str | os.PathLike[str] | None = None,
    *,
    seed: ModuleType = _seed,
    provenance: Mapping[str, Any] | None = None,
    dpi: int = 110,
) -> Any:
    """Bar charts of overhead % per build: one panel per mode, then instruction overhead.

    Wall-clock panels (one per non-plain mode, builds on the x axis): bars with
    asymmetric error bars from the bootstrap CI; on the Query-2 panel the seed's
    published figures as hollow black diamonds. The modes get a panel each rather than
    sharing one axis because TIMING-on overhead is often ten times TIMING-off on a VM
    (clock reads cost ~30 ns each), which would flatten the Query-2 bars whose
    step-to-step differences are the point. Last panel: instruction overhead of one
    execution, bars grouped by build, one bar per mode (callgrind overheads are of one
    size). Writes *path_png* / *path_svg* when given and returns the Figure. An empty
    summary draws a placeholder saying "no data" (no exception).
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    s = _check(summary)
    # Fixed hash salt and no timestamps: identical input gives identical SVG bytes.
    rc = {"svg.hashsalt": "profkit", "font.size": 9, "axes.titlesize": 10,
          "path.simplify": False}
    with matplotlib.rc_context(rc):
        if s.empty or s[s["mode"] != "plain"].empty:
            fig = Figure(figsize=(8.6, 3.0), dpi=dpi, layout="constrained")
            FigureCanvasAgg(fig)
            ax = fig.add_subplot(1, 1, 1)
            ax.set_axis_off()
            ax.text(0.5, 0.5, "no data: the run measured no EXPLAIN ANALYZE executions",
                    ha="center", va="center", fontsize=12, transform=ax.transAxes)
            _save(fig, path_png, path_svg, provenance)
            return fig

        builds = build_order(s["build"].unique().tolist())
        modes = [m for m in (Q2, Q3) if m in set(s["mode"])]
        modes += sorted(set(s["mode"]) - {"plain", Q2, Q3})
        colors = {m: _COLORS.get(m, _OTHER_COLORS[i % len(_OTHER_COLORS)])
                  for i, m in enumerate(modes)}
        has_instr = bool(s["instr_overhead_pct"].notna().any())
        metric = str(s["metric"].iloc[0]) if "metric" in s.columns else "server_ms"
        center = str(s["center"].iloc[0]) if "center" in s.columns else "median"
        xs = list(range(len(builds)))
        xlabels = [f"{b}\n({seed.SEED_BUILD_LABELS[b]})" if b in seed.SEED_BUILD_LABELS else b
                   for b in builds]

        npanels = len(modes) + 1
        fig = Figure(figsize=(8.6, 2.6 * npanels + 0.4), dpi=dpi, layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(npanels, 1, sharex=True)
        for ax, m in zip(axes, modes, strict=False):
            vals, lo, hi, labels = [], [], [], []
            for b in builds:
                r = _cell(s, b, m)
                v = float(r["overhead_pct"]) if r is not None and _isnum(r["overhead_pct"]) \
                    else math.nan
                vals.append(v)
                # an interval from too few repetitions gets no whisker: its bar says n
                few = too_few_count(r.get("ci_method")) if r is not None else None
                labels.append(_bar_label(v) + (f"\nn = {few}: no CI" if few is not None
                                               and _isnum(v) else ""))
                if few is not None:  # NaN: matplotlib draws neither whisker nor cap
                    lo.append(math.nan)
                    hi.append(math.nan)
                elif r is not None and _isnum(r["ci_low_pct"]) and _isnum(r["ci_high_pct"]):
                    lo.append(max(v - float(r["ci_low_pct"]), 0.0))
                    hi.append(max(float(r["ci_high_pct"]) - v, 0.0))
                else:
                    lo.append(0.0)
                    hi.append(0.0)
            bars = ax.bar(xs, vals, 0.6, color=colors[m], yerr=[lo, hi], capsize=4,
                          error_kw={"elinewidth": 1, "ecolor": "#333333"},
                          label="measured here (bar: " + center + ", whisker: 95 % CI)")
            ax.bar_label(bars, labels=labels, padding=3, fontsize=8,
                         label_type="edge")
            seed_pts = [(x, seed.seed_overhead_pct(b, m)) for x, b in zip(xs, builds, strict=True)
                        if seed.seed_overhead_pct(b, m) is not None]
            if seed_pts:
                ax.scatter([p[0] + 0.36 for p in seed_pts], [p[1] for p in seed_pts],
                           marker="D", s=34, facecolor="white", edgecolor="black",
                           linewidth=1.3, zorder=5,
                           label="seed's published figure (means, other machine)")
                for x, y in seed_pts:
                    ax.annotate(f"{y:.2f}", (x + 0.36, y), xytext=(0, 7),
                                textcoords="offset points", ha="center", fontsize=7,
                                color="#333333")
            ax.set_title(f"{MODE_LABELS.get(m, m)}: overhead over plain "
                         f"({center} of {metric})")
            ax.set_ylabel("overhead, %")
            ax.axhline(0, color="black", linewidth=0.8)
            ax.grid(axis="y", alpha=0.3)
            ax.margins(y=0.2)
            ax.legend(loc="upper right", fontsize=7.5, frameon=False)

        ax_i = axes[-1]
        width = 0.8 / max(len(modes), 1)
        if has_instr:
            for j, m in enumerate(modes):
                off = (j - (len(modes) - 1) / 2) * width
                iv = []
                for b in builds:
                    r = _cell(s, b, m)
                    iv.append(float(r["instr_overhead_pct"])
                              if r is not None and _isnum(r["instr_overhead_pct"]) else math.nan)
                ib = ax_i.bar([x + off for x in xs], iv, width * 0.92, color=colors[m],
                              label=MODE_LABELS.get(m, m))
                ax_i.bar_label(ib, labels=[_bar_label(v) for v in iv], padding=2, fontsize=8)
            ax_i.legend(loc="upper right", fontsize=7.5, frameon=False)
        else:
            ax_i.text(0.5, 0.5, "no instruction counts in this run", ha="center",
                      va="center", transform=ax_i.transAxes, color="#666666")
            ax_i.set_yticks([])
        ax_i.set_title("Instructions of one execution: overhead over plain "
                       "(callgrind understates TIMING on)")
        ax_i.set_ylabel("instructions, %")
        ax_i.axhline(0, color="black", linewidth=0.8)
        ax_i.grid(axis="y", alpha=0.3)
        ax_i.margins(y=0.2)
        ax_i.set_xticks(xs, xlabels)
        # at least four build slots wide, so one or two builds do not get fat bars
        pad = max(0.0, (4 - len(builds)) / 2)
        ax_i.set_xlim(-0.6 - pad, len(builds) - 0.4 + pad)
        _save(fig, path_png, path_svg, provenance)
        return fig


def _bar_label(v: float) -> str:
    return "" if not _isnum(v) else f"{v:.1f}"


def _save(fig: Any, path_png: str | os.PathLike[str] | None,
          path_svg: str | os.PathLike[str] | None, provenance: Mapping[str, Any] | None) -> None:
    foot = _footer(provenance)
    if foot:
        # supxlabel takes part in the constrained layout, so it never overlaps the ticks
        fig.supxlabel(foot, fontsize=6.5, color="#555555", x=0.01, ha="left")
    if path_png is not None:
        Path(path_png).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path_png, format="png", metadata={"Software": None})
    if path_svg is not None:
        Path(path_svg).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path_svg, format="svg", metadata={"Date": None, "Creator": None})


def summary_csv(summary: pd.DataFrame, instr_counts: pd.DataFrame | None = None,
                path: str | Path | None = None) -> str:
    """The ``summary.csv`` text (:func:`profkit.analyze.stats.summary_table`; NaN → empty
    cell); also written to *path* when given."""
    import io


    buf = io.StringIO()
    summary_table(summary, instr_counts).to_csv(buf, index=False, na_rep="",
                                                lineterminator="\n")
    text = buf.getvalue()
    if path is not None:
        Path(path).write_text(text)
    return text


def write_summary_csv(summary: pd.DataFrame, path: str | Path) -> Path:
    summary_csv(summary, path=path)
    return Path(path)


# --------------------------------------------------------------------------- the bench's report

def report_provenance(prov: Mapping[str, Any]) -> dict[str, Any]:
    """The provenance fields a reader of the report needs, in the report's vocabulary."""
    m = prov.get("machine") or {}
    machine = {k: m.get(k) for k in ("cpu_model", "cpus", "kernel", "clocksource",
                                     "virtualization", "governor") if k in m}
    cmd = prov.get("command_line")
    out: dict[str, Any] = {
        "run_id": prov.get("run_id"), "started_at": prov.get("started_at"),
        "ended_at": prov.get("ended_at"),
        "command_line": " ".join(cmd) if isinstance(cmd, list) else cmd,
        "workload": prov.get("workload"), "scale": prov.get("scale"),
        "reps": prov.get("reps"), "metric": prov.get("report_metric"),
        "instruction_counter": prov.get("instruction_counter"),
        "machine": machine, "builds": _ordered_builds(prov.get("builds")),
        "settings": prov.get("settings"),
        "status": prov.get("status"),
        "instructions counted at scale": prov.get("instr_scale"),
        "load average (1/5/15 min) at start": _loadavg(prov.get("loadavg_start")),
        "load average at end": _loadavg(prov.get("loadavg_end")),
        "order seed": prov.get("order_seed"),
    }
    if prov.get("error"):
        out["error"] = prov["error"]
    if prov.get("instructions_error"):
        out["instruction counts failed"] = prov["instructions_error"]
    return out


def _ordered_builds(builds: Any) -> Any:
    """The builds in the seed's order (provenance.json stores them sorted by name)."""
    if not isinstance(builds, Mapping):
        return builds
    return {b: builds[b] for b in build_order(list(builds))}


def _loadavg(x: Any) -> str | None:
    if not isinstance(x, list):
        return None
    return " / ".join(f"{v:.2f}" for v in x)


def bench_extra_sections(timings: pd.DataFrame, instr: pd.DataFrame | None, metric: str,
                         center: str) -> str:
    """:func:`extra_sections` of :func:`profkit.analyze.stats.bench_extras` (the call
    experiments/bench.py makes; it can call the two itself)."""
    return extra_sections(bench_extras(timings, instr, metric, center))


def extra_sections(x: BenchExtras) -> str:
    """The other time measures and the raw instruction counts, after the main report."""
    metric = x.metric
    out = ["", "## The time measures", "",
           (f"The tables above use `{metric}`. `cpu_ms`: the backend's on-CPU time over the "
            "execution (/proc/PID/schedstat), blind to waiting for a core on a shared machine; "
            "`server_ms`: pg_stat_statements' total_exec_time delta (EXPLAIN's includes "
            "planning its query, ~0.2 ms); `client_ms`: the client's round trip, rows "
            "fetched. Overhead % by each, same executions (brackets: 95 % CI):"), ""]
    header = ["build", "mode", *(h for m in METRICS
                                 for h in (f"{m} median", f"{m} overhead % [95% CI]"))]
    rows = []
    sums = x.by_metric
    if sums:
        first = next(iter(sums.values()))
        for key in first.index:
            cells = []
            for m in METRICS:
                r = sums[m].loc[key] if m in sums and key in sums[m].index else None
                if r is None:
                    cells += ["–", "–"]
                    continue
                ci = ("" if not (_num(r.ci_low_pct) and _num(r.ci_high_pct))
                      else f" [{r.ci_low_pct:.2f}, {r.ci_high_pct:.2f}]")
                cells += [f"{r.median_ms:.2f}", f"{r.overhead_pct:.2f}{ci}"]
            rows.append([key[0], key[1], *cells])
    out.append(md_table(header, rows, ["l", "l"] + ["r"] * (2 * len(METRICS))))
    out += vcpu_section(x)
    out += _plain_across_builds(x)
    instr, it = x.instr, x.instructions
    if instr is not None and it is not None:
        tools = ", ".join(sorted(set(instr["tool"].astype(str))))
        scopes = ", ".join(sorted(set(instr["scope"].astype(str))))
        scales = ", ".join(str(v) for v in sorted(set(instr.get("scale", pd.Series([])))))
        out += ["", "## Instruction counts (one execution each)", "",
                (f"Counter: {tools}; scope: {scopes}; scale {scales}. `executor` is the "
                 "inclusive count of standard_ExecutorRun (no parse, plan or EXPLAIN output)."),
                ""]
        irows = [[r.build, r.mode, f"{r.instructions:,}", f"{r.overhead_pct:.2f}",
                  f"{int(r.executor_instructions):,}" if _num(r.executor_instructions)
                  else "–",
                  "–" if math.isnan(r.executor_overhead_pct)
                  else f"{r.executor_overhead_pct:.2f}"] for r in it.itertuples()]
        out.append(md_table(["build", "mode", "instructions", "overhead %",
                             "executor instructions", "executor overhead %"], irows,
                            ["l", "l", "r", "r", "r", "r"]))
    return "\n".join(out) + "\n"


#: The precision a Query-2 overhead needs to judge a 1 % target (CI half-width, percentage
#: points).
Q2_HALF_WIDTH_GOAL_PP = 1.0


def vcpu_section(x: BenchExtras) -> list[str]:
    """The vCPU's speed per execution, what disturbed the backends, and whether the
    Query-2 CIs are narrow enough to judge 1 %."""
    if x.vcpu is None or x.vcpu_table is None:
        return []
    metric, table = x.metric, x.vcpu_table
    out = ["", "## The vCPU's speed and what disturbed the backends", "",
           ("A fixed calibration work (~3 ms, profkit/collect/vcpu_calib.c) ran on the "
            "backend's CPU just before and just after every execution; its CPU time is the "
            "vCPU's speed then (the host slows a vCPU in bursts, which a backend's CPU time "
            f"cannot tell from work). {x.vcpu.describe()}. Threshold: the run's median "
            f"calibration + {SLOW_Z:g} × 1.4826 × MAD, at least +{SLOW_MIN_EXCESS:.0%}; an "
            "execution is rejected (`cpu_kept_ms`) when either of its calibrations is above "
            "it."), ""]
    cols = list(table.attrs.get("columns", []))
    modes = sorted(table["mode"].unique(), key=lambda m: (m not in MODE_LABELS,
                                                          list(MODE_LABELS).index(m)
                                                          if m in MODE_LABELS else 0, m))
    by_key = {(r["build"], r["mode"]): r for r in table.to_dict("records")}
    rows = []
    for b in dict.fromkeys(table["build"]):
        for m in modes:
            r = by_key.get((b, m))
            if r is None:
                continue
            rows.append([str(b), str(m), f"{r['rejected']}/{r['n']}",
                         *(f"{r[c + '_median']:.2f}" if c == "speed_factor" else
                           f"{r[c + '_median']:.0f} (max {r[c + '_max']:.0f})" for c in cols)])
    out.append(md_table(["build", "mode", "rejected", *(f"{c} median" for c in cols)], rows,
                        ["l", "l"] + ["r"] * (len(cols) + 1)))
    if x.q2_half_width is None:
        return out
    hw = x.q2_half_width["half_width_pp"]
    worst = float(hw.max()) if hw.notna().any() else math.nan
    parts = ", ".join(f"{b} ±{h:.2f}" for b, h in zip(x.q2_half_width["build"], hw,
                                                       strict=True))
    out += ["", f"Query-2 overhead CI half-width by `{metric}` (percentage points): {parts}."]
    if _num(worst) and worst <= Q2_HALF_WIDTH_GOAL_PP:
        out.append(f"Every Query-2 CI is within ±{Q2_HALF_WIDTH_GOAL_PP:g} pp: the times can "
                   "judge a 1 % difference in this run.")
    else:
        out.append(f"**Not every Query-2 CI is within ±{Q2_HALF_WIDTH_GOAL_PP:g} pp** (widest "
                   f"±{worst:.3f}): on this machine in this run the times cannot judge a 1 % "
                   "difference; the claim rests on the instruction counts (callgrind).")
    return out


def _plain_across_builds(x: BenchExtras) -> list[str]:
    """Query-1 of every build against the first (the seed's step 3 slowed it by ~1 %)."""
    if x.plain_base is None or x.plain_vs_base is None:
        return []
    base, metric = x.plain_base, x.metric
    out = ["", f"## The plain query across builds (against {base})", "",
           (f"Median `{metric}` of Query-1 relative to {base}'s and its instruction "
            "count: what a patch costs a query that is not being explained. p: Mann–Whitney "
            "U on the units that are independent, each backend's median where the builds "
            "ran on several backends (the executions of one backend move together: "
            "backends of one binary differ by several percent here), else the executions. "
            "A time difference at the same instruction count is no result until it exceeds "
            "what an A/A pair (`--aa`) shows."), ""]
    rows = [[r.build, f"{r.median_ms:.2f}", f"{r.time_pct:+.2f}",
             "–" if math.isnan(r.p_value) else f"{r.p_value:.3g}", str(r.p_unit),
             "–" if math.isnan(r.instr_pct) else f"{r.instr_pct:+.2f}"]
            for r in x.plain_vs_base.itertuples()]
    out.append(md_table(["build", "median ms", f"time vs {base} %", "p", "p on",
                         f"instructions vs {base} %"], rows, ["l", "r", "r", "r", "l", "r"]))
    return out


def _num(x: Any) -> bool:
    try:
        return x is not None and x is not pd.NA and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False



SEED_BUILDS: tuple[str, ...] = ("vanilla", "step1", "step2", "step3")


def ordering_check(summary: pd.DataFrame, comparisons: pd.DataFrame | None = None, *,
                   builds: Sequence[str] = SEED_BUILDS, mode: str = "analyze_notiming",
                   ) -> list[str]:
    """Sentences on whether *mode*'s overhead falls along *builds* (the seed's claim).

    Checked in instructions (``instr_overhead_pct``) and in wall-clock overhead; for the
    latter, each neighbouring pair says whether the bootstrap CI of the difference (from
    *comparisons*, :func:`profkit.analyze.stats.compare_chain`) excludes zero. Empty when
    fewer than two of *builds* are in the summary.
    """

    s = summary[summary["mode"] == mode].set_index("build")
    present = [b for b in builds if b in s.index]
    if len(present) < 2:
        return []
    out = []
    metric = str(s["metric"].iloc[0]) if "metric" in s.columns and len(s) else "time"
    for col, what in (("instr_overhead_pct", "instructions"), ("overhead_pct", f"time ({metric})")):
        if col not in s.columns:
            continue
        vals = [s.loc[b, col] for b in present]
        if not all(_num(v) for v in vals):
            continue
        fv = [float(v) for v in vals]
        holds = all(a > b for a, b in itertools.pairwise(fv))
        chain = " > ".join(f"{b} {v:.2f} %" for b, v in zip(present, fv, strict=True))
        line = (f"{SEED_QUERY_NAMES.get(mode, mode)} overhead by {what}: {chain} — the ordering "
                f"{'holds' if holds else 'does NOT hold'}")
        if col == "overhead_pct" and comparisons is not None and not comparisons.empty:
            c = comparisons[comparisons["mode"] == mode]
            sep = []
            for r in c.itertuples():
                if r.a in present and r.b in present:
                    sep.append(f"{r.a}→{r.b} " + (
                        "too few repetitions to tell" if _too_few_reps(r) else
                        f"{'beyond' if r.overhead_differs else 'within'} noise"))
            if sep:
                line += " (" + ", ".join(sep) + ")"
        out.append(line)
    return out


def _too_few_reps(r: Any) -> bool:
    return too_few_count(getattr(r, "ci_method", None)) is not None


def differs_text(r: Any) -> str:
    """The "differs?" cell of a :func:`profkit.analyze.stats.compare_chain` row: yes, no,
    or "too few (n = N)" when its interval came from fewer repetitions than a verdict
    needs (:data:`profkit.analyze.stats.MIN_VERDICT_REPS`).  An interval that excludes 0
    beside a "no" would read as a contradiction: the rank test on the per-repetition
    overheads disagreed there, and the cell says so ("no (rank test p = 0.053)")."""
    few = few_reps_text(getattr(r, "ci_method", None))
    if few:
        return few
    if r.overhead_differs:
        return "yes"
    lo, hi = r.diff_ci_low_pct, r.diff_ci_high_pct
    p = getattr(r, "overhead_p_value", math.nan)
    if _isnum(lo) and _isnum(hi) and (lo > 0 or hi < 0) and _isnum(p):
        return f"no (rank test p = {p:.2g})"
    return "no"


def comparisons_table(comps: pd.DataFrame) -> Table:
    """A rich Table of :func:`profkit.analyze.stats.compare_chain`'s rows."""
    t = Table(title="Does each step change the overhead? (b − a, percentage points)",
              title_justify="left", header_style="bold")
    for c in ("a → b", "mode", "b − a [95% CI]", "differs?", "p (overheads)"):
        t.add_column(c, justify="left" if c in ("a → b", "mode") else "right")
    for r in comps.itertuples():
        ci = _fmt_pct(r.overhead_diff_pct, (r.diff_ci_low_pct, r.diff_ci_high_pct),
                      method=getattr(r, "ci_method", None))
        p = "–" if math.isnan(r.overhead_p_value) else f"{r.overhead_p_value:.3g}"
        t.add_row(f"{r.a} → {r.b}", r.mode, ci, differs_text(r), p)
    return t


def console_report(summary: pd.DataFrame, comparisons: pd.DataFrame | None = None
                   ) -> list[Table | str]:
    """What ``profkit bench`` prints, in order: the seed-style table, the table against
    the reference build, the step-to-step comparisons and the ordering sentences."""
    out: list[Table | str] = [render_console(summary)]
    ref = reference_console(summary)
    if ref is not None:
        out.append(ref)
    if comparisons is not None and not comparisons.empty:
        out.append(comparisons_table(comparisons))
    return out + ordering_check(summary, comparisons)


# --------------------------------------------------------------------------- the engine's facts


def extra_reps_note(provenance: Mapping[str, Any]) -> str:
    """One line on the repetitions run because the vCPU rule left a cell short
    (``extra_repetitions`` of the provenance); "" when none ran and none is short."""
    x = provenance.get("extra_repetitions")
    if not isinstance(x, Mapping) or not x.get("min_kept"):
        return ""
    n, want = int(x.get("extra_reps") or 0), int(x["min_kept"])
    short = x.get("short_after_extra") or {}
    if not n and not short:
        return ""
    text = (f"vCPU rule: {n} extra repetition{'s' if n != 1 else ''} of every cell ran "
            f"because a cell kept fewer than {want} of its repetitions")
    if short:
        text += ("; still short after them: "
                 + ", ".join(f"{k} kept {v}" for k, v in short.items()))
    return text


def _reps_behind(r: Any) -> int:
    """The repetitions behind a summary row's interval: the pairs its overhead used when
    fewer than a verdict needs (``ci_method`` says so), else its executions kept."""
    n = too_few_count(getattr(r, "ci_method", None))
    return n if n is not None else int(r.n)


def few_reps_note(summary: pd.DataFrame) -> str:
    """A line naming the (build, mode) cells with fewer repetitions behind them than a
    verdict needs (:data:`~profkit.analyze.stats.MIN_VERDICT_REPS`: executions kept, or
    the plain/mode pairs of its overhead; none kept: their own note)."""
    if summary.empty or "n" not in summary.columns:
        return ""
    short = [(r, _reps_behind(r)) for r in summary.itertuples()
             if 0 < _reps_behind(r) < MIN_VERDICT_REPS]
    if not short:
        return ""
    if len(short) == len(summary):
        ns = sorted({k for _r, k in short})
        cells = (f"every (build, mode) ({ns[0]}" + (f"-{ns[-1]}" if len(ns) > 1 else "")
                 + " each)")
    else:
        cells = ", ".join(f"{r.build} {r.mode} ({k})" for r, k in short)
    return (f"fewer than {MIN_VERDICT_REPS} repetitions behind {cells}: their intervals "
            "cover well under 95 %, and no step-to-step verdict rests on them (more --reps)")


def engine_notes(summary: pd.DataFrame, provenance: Mapping[str, Any],
                 aa: Any | None = None) -> list[str]:
    """One line each, for the console and the report: different plans, executions
    rejected to the last one, a mode faster than its plain query beyond noise
    (:func:`profkit.analyze.stats.plain_suspect`) or below it by time while not by
    instructions (:func:`profkit.analyze.stats.time_below_instructions`), the A/A
    reading, the backends behind the intervals."""
    lines: list[str] = []
    if provenance.get("plan_differs"):
        lines.append("PLANS DIFFER between builds (--allow-plan-differences): their times "
                     "compare different work; every row of summary.csv says so")
    if "note" in summary.columns:
        for r in summary.itertuples():
            note = str(getattr(r, "note", "") or "")
            if note and note != "nan" and "plans differ" not in note:
                lines.append(f"{r.build} {r.mode}: {note}")
    for r in summary.itertuples():
        # at most one of the two speaks (time_below_instructions stops where the other starts)
        lines += [x for x in (
            plain_suspect(str(r.build), str(r.mode), r.overhead_pct, r.ci_low_pct,
                          r.ci_high_pct),
            time_below_instructions(str(r.build), str(r.mode), r.overhead_pct, r.ci_low_pct,
                                    r.ci_high_pct, getattr(r, "instr_overhead_pct", None)))
            if x]
    extra = extra_reps_note(provenance)
    if extra:
        lines.append(extra)
    few = few_reps_note(summary)
    if few:
        lines.append(few)
    if aa is not None:
        lines.append(aa.describe())
    k = provenance.get("backends")
    layouts = provenance.get("layouts")
    if isinstance(layouts, int) and layouts > 1:
        lines.append(f"every build ran in {layouts} code layouts (the same code linked in "
                     "other function orders), one backend each: the between-backend share "
                     "below includes layout effects")
    if isinstance(k, int) and k > 1 and "between_share_pct" in summary.columns:
        sh = pd.to_numeric(summary["between_share_pct"], errors="coerce").dropna()
        reps = provenance.get("reps")
        if isinstance(reps, int) and 0 < reps <= k:
            # one repetition per backend: the backends are the units, so the share is
            # 100 % by construction (the last backend's extra repetitions aside)
            lines.append(f"{k} backends per build (fresh clusters), one repetition each: "
                         "every interval resamples backends, so process-to-process "
                         "variance is all in it")
        elif len(sh):
            lines.append(f"{k} backends per build (fresh clusters): between-backend variance "
                         f"is {sh.median():.0f} % (median; {sh.min():.0f}-{sh.max():.0f} %) "
                         "of the overhead intervals' variance")
    elif k == 1:
        lines.append("one backend per build: the intervals cannot see backend-to-backend "
                     "variance (--backends K measures it)")
    return lines


def engine_sections(summary: pd.DataFrame, provenance: Mapping[str, Any],
                    aa: Any | None = None) -> str:
    """report.md: the plans, what was not measured, the A/A check and the backends."""
    out = ["", "## Plans, backends, A/A", ""]
    notes = engine_notes(summary, provenance, aa)
    out += [f"- {x}" for x in notes] or ["- nothing to note"]
    plans = provenance.get("plans") or {}
    if plans:
        groups: dict[str, list[str]] = {}
        for label, plan in plans.items():
            groups.setdefault(str(plan), []).append(str(label))
        out += ["", "Plans chosen (`EXPLAIN (COSTS OFF)` of the query, first backend of each "
                "build): " + ("one plan for every build." if len(groups) == 1 else
                              f"{len(groups)} different plans."), ""]
        for plan, labels in groups.items():
            out += [f"{', '.join(labels)}:", "", "```", plan, "```", ""]
    if "between_share_pct" in summary.columns:
        rows = [r for r in summary.itertuples()
                if _isnum(getattr(r, "between_share_pct", None))
                or _isnum(getattr(r, "vs_ref_between_share_pct", None))]
        if rows:
            out += ["", "Share of each interval's variance that lies between backends "
                    "(hierarchical bootstrap: backends, then repetitions):", "",
                    "| build | mode | backends | overhead: between % | vs vanilla's plain: "
                    "between % |", "|---|---|---|---|---|"]
            for r in rows:
                b1 = r.between_share_pct if _isnum(r.between_share_pct) else None
                b2 = getattr(r, "vs_ref_between_share_pct", None)
                out.append(f"| {r.build} | {r.mode} | {r.backends} | "
                           f"{'–' if b1 is None else f'{b1:.0f}'} | "
                           f"{f'{b2:.0f}' if _isnum(b2) else '–'} |")
    return "\n".join(out) + "\n"
