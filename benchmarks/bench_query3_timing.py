"""Query-3 (EXPLAIN ANALYZE, TIMING TRUE) on nested_loop: PG18 and PG19 clocks side by side.

One ``profkit timing-accuracy`` run (plain, TIMING FALSE and TIMING TRUE of the
nested_loop query, interleaved, backend CPU time from /proc/PID/schedstat) of:

- ``vanilla`` and ``tsc_clock`` (PostgreSQL 18: clock_gettime, and profkit's TSC backport),
  ``pg18fast`` (pg18/fast_timing: the lean wrappers, clock_gettime) and, with
  ``--tsc-fast NAME``, ``tscfast`` (a named build of tsc_clock + pg18/fast_timing.patch),
- ``pg19sys`` / ``pg19tsc``: PostgreSQL 19 vanilla with ``timing_clock_source`` = system / tsc
  (upstream's TSC clock: the anchor),
- ``fast``: ``pg19/fast_timing`` (profkit's lean TIMING wrappers on upstream's TSC clock),
- ``nullclk`` (with ``--null-clock NAME``): fast_timing with each RDTSC replaced by an xor
  (benchmarks/patches/pg19_fast_timing_null_clock.patch, a named build): everything the
  wrapper does except reading the clock.  fast − nullclk = what the clock reads cost in place.

Then, per arm: TIMING TRUE over its own plain query and over vanilla's plain query of the
same version (median of per-repetition overheads, paired bootstrap 95 % CI); per-node
error of the inclusive times against the baseline (pg19tsc; nodes ≥ --min-node-ms, matched
by their place in the plan); clock reads per execution from the plan itself (two per
ExecProcNode call = rows + loops per node; two per loop for MultiExecProcNode nodes) and
per row of the Nested Loop; ns per read measured by ``profkit clock-cost``'s loop and, for
fast_timing, in place (fast − nullclk); and the floor: reads × in-place cost / vanilla's plain.

Usage::

    .venv/bin/profkit build ft_nullclock --base pg19/fast_timing \\
        --source tarball:../shared/pg-sources/postgresql-19beta1.tar.bz2 \\
        --patch benchmarks/patches/pg19_fast_timing_null_clock.patch
    .venv/bin/profkit build tsc_fast --base tsc_clock --patch profkit/patches/pg18/fast_timing.patch
    .venv/bin/python benchmarks/bench_query3_timing.py --null-clock ft_nullclock --tsc-fast tsc_fast
    .venv/bin/python benchmarks/bench_query3_timing.py --run /tmp/q3   # re-read a run
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

TARGET_PCT = 15.0
BASELINE = "pg19tsc"
REFERENCE = "pg19sys"
ARMS = ["vanilla", "tsc_clock", "pg18fast=fast_timing",
        "pg19sys=pg19/vanilla:timing_clock_source=system",
        "pg19tsc=pg19/vanilla:timing_clock_source=tsc",
        "fast=pg19/fast_timing:timing_clock_source=tsc"]
# the clock each arm reads per node transition, as clock_cost.csv names it
CLOCK_OF = {"vanilla": "clock_monotonic", "pg19sys": "clock_monotonic", "tsc_clock": "rdtsc",
            "pg18fast": "clock_monotonic", "tscfast": "rdtsc",
            "pg19tsc": "rdtsc", "fast": "rdtsc", "nullclk": None}
MULTIEXEC = {"Hash", "Bitmap Index Scan", "BitmapAnd", "BitmapOr"}


def clock_reads(plan: dict) -> tuple[int, int]:
    """(clock reads of the per-node instrumentation, rows of the Nested Loop) of one
    EXPLAIN (ANALYZE, FORMAT JSON) document: two reads per ExecProcNode call (rows +
    loops: each loop ends with a call that returns nothing), two per loop for nodes run
    by MultiExecProcNode."""
    reads, nl_rows = 0, 0

    def walk(n: dict) -> None:
        nonlocal reads, nl_rows
        loops = int(n.get("Actual Loops", 0))
        rows = round(float(n.get("Actual Rows", 0)) * loops)
        if n.get("Node Type") in MULTIEXEC:
            reads += 2 * loops
        else:
            reads += 2 * (rows + loops)
        if n.get("Node Type") == "Nested Loop":
            nl_rows = max(nl_rows, rows)
        for c in n.get("Plans", []) or []:
            walk(c)

    doc = plan[0] if isinstance(plan, list) else plan
    walk(doc["Plan"])
    return reads, nl_rows


def query3_table(run: Path, min_node_ms: float = 1.0) -> pd.DataFrame:
    """The Query-3 table of a timing-accuracy run directory (already analysed)."""
    cost = pd.read_csv(run / "cost.csv").set_index("arm")
    vsv = pd.read_csv(run / "cost_vs_vanilla.csv").set_index("arm")
    acc = pd.read_csv(run / "accuracy.csv")
    prov = json.loads((run / "provenance.json").read_text())
    baseline = (prov.get("analysis") or {}).get("baseline") or prov.get("baseline")
    ref_file = run / f"accuracy_vs_{REFERENCE}.csv"
    acc_ref = pd.read_csv(ref_file) if ref_file.exists() else None
    clock = {}
    if (run / "clock_cost.csv").exists():
        cc = pd.read_csv(run / "clock_cost.csv")
        clock = dict(zip(cc["source"], cc["ns_per_call"], strict=True))
    plans: dict[str, dict] = {}
    with open(run / "plans.jsonl", encoding="utf-8") as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r["mode"] == "analyze_timing" and r["arm"] not in plans:
                plans[r["arm"]] = r["plan"]

    def err(a: pd.DataFrame | None, arm: str) -> tuple[float, float]:
        if a is None:
            return math.nan, math.nan
        x = a[(a["arm"] == arm) & (a["metric"] == "inclusive_ms")
              & (a["base_median_ms"] >= min_node_ms)]["rel_err_pct"].dropna()
        if x.empty:
            return math.nan, math.nan
        return float(x.abs().median()), float(x.loc[x.abs().idxmax()])

    rows = []
    for arm in cost.index:
        reads, nl_rows = clock_reads(plans[arm]) if arm in plans else (0, 0)
        e_med, e_max = err(acc, arm)
        r_med, r_max = err(acc_ref, arm)
        c = cost.loc[arm]
        v = vsv.loc[arm] if arm in vsv.index else None
        ns = clock.get(CLOCK_OF.get(arm) or "", math.nan)
        rows.append({
            "arm": arm,
            "version": v["version"] if v is not None else "?",
            "plain_ms": c["plain_ms"], "timing_ms": c["timing_ms"],
            "q3_vs_own_plain_pct": c["overhead_timing_pct"],
            "q3_vs_own_plain_ci": f"[{c['overhead_timing_ci_low']:+.1f}, "
                                  f"{c['overhead_timing_ci_high']:+.1f}]",
            "q3_vs_vanilla_plain_pct": v["timing_vs_plain_of_pct"] if v is not None else math.nan,
            "q3_vs_vanilla_plain_ci": (f"[{v['timing_vs_plain_of_ci_low']:+.1f}, "
                                       f"{v['timing_vs_plain_of_ci_high']:+.1f}]"
                                       if v is not None else ""),
            "vanilla_plain_ms": v["plain_of_ms"] if v is not None else math.nan,
            "node_err_vs_base_median_pct": e_med, "node_err_vs_base_worst_pct": e_max,
            "node_err_vs_ref_median_pct": r_med, "node_err_vs_ref_worst_pct": r_max,
            "clock_reads": reads, "reads_per_nl_row": reads / nl_rows if nl_rows else math.nan,
            "ns_per_read_loop": ns,
        })
    df = pd.DataFrame(rows)
    df.attrs["baseline"] = baseline
    # in place: what fast_timing's reads cost inside the executor (fast - null)
    t = df.set_index("arm")
    if {"fast", "nullclk"} <= set(t.index):
        extra_ms = t.at["fast", "timing_ms"] - t.at["nullclk", "timing_ms"]
        ns_in_place = extra_ms * 1e6 / t.at["fast", "clock_reads"]
        df["ns_per_read_in_place"] = math.nan
        df.loc[df["arm"] == "fast", "ns_per_read_in_place"] = ns_in_place
        plain = t.at["fast", "vanilla_plain_ms"]
        df.attrs["floor"] = {
            "reads": int(t.at["fast", "clock_reads"]),
            "reads_per_nl_row": float(t.at["fast", "reads_per_nl_row"]),
            "ns_per_read_in_place": ns_in_place,
            "reads_ms": extra_ms,
            "reads_pct_of_vanilla_plain": extra_ms / plain * 100,
            "wrapper_pct_of_vanilla_plain": float(t.at["nullclk", "q3_vs_vanilla_plain_pct"]),
            "vanilla_plain_ms": plain,
        }
    return df


def render(df: pd.DataFrame) -> str:
    lines = [f"Query-3 (TIMING TRUE) on nested_loop; per-node errors of inclusive times vs "
             f"{df.attrs.get('baseline')} and vs {REFERENCE}; target: best ≤ +{TARGET_PCT:g}% "
             "over plain", "",
             "| arm | PG | plain ms | Q3 vs own plain | Q3 vs vanilla plain | node err vs base "
             "median \\|err\\| / worst | vs ref median \\|err\\| / worst | clock reads/row "
             "| ns/read (loop) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        lines.append(
            f"| {r.arm} | {r.version} | {r.plain_ms:.1f} | {r.q3_vs_own_plain_pct:+.1f}% "
            f"{r.q3_vs_own_plain_ci} | {r.q3_vs_vanilla_plain_pct:+.1f}% "
            f"{r.q3_vs_vanilla_plain_ci} | {r.node_err_vs_base_median_pct:.1f}% / "
            f"{r.node_err_vs_base_worst_pct:+.1f}% | {r.node_err_vs_ref_median_pct:.1f}% / "
            f"{r.node_err_vs_ref_worst_pct:+.1f}% | {r.reads_per_nl_row:.2f} | "
            f"{r.ns_per_read_loop:.1f} |")
    fl = df.attrs.get("floor")
    if fl:
        lines += ["", "Floor (fast_timing, measured in place as fast − nullclk): "
                  f"{fl['reads']:,} clock reads ({fl['reads_per_nl_row']:.2f} per Nested Loop "
                  f"row) × {fl['ns_per_read_in_place']:.2f} ns = {fl['reads_ms']:.1f} ms = "
                  f"{fl['reads_pct_of_vanilla_plain']:+.1f}% of vanilla's plain "
                  f"{fl['vanilla_plain_ms']:.1f} ms; everything else the wrapper does "
                  f"(null clock, TIMING TRUE vs vanilla plain): "
                  f"{fl['wrapper_pct_of_vanilla_plain']:+.1f}%."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, help="re-read this run directory instead of measuring")
    ap.add_argument("--out", type=Path, help="run directory (default profiles/<run_id>)")
    ap.add_argument("--scale", type=float, default=0.05, help="nested_loop scale")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--null-clock", default="",
                    help="named build of fast_timing + the null-clock patch (adds arm null)")
    ap.add_argument("--tsc-fast", default="",
                    help="named build of tsc_clock + pg18/fast_timing.patch (adds arm tscfast)")
    ap.add_argument("--min-node-ms", type=float, default=1.0)
    args = ap.parse_args(argv)
    from profkit.experiments.timing_accuracy import analyze_run, run_timing_accuracy

    if args.run:
        run = args.run
        analyze_run(run, baseline=BASELINE, reference=REFERENCE, min_node_ms=args.min_node_ms)
    else:
        arms = list(ARMS)
        if args.null_clock:
            arms.append(f"nullclk={args.null_clock}:timing_clock_source=tsc")
        if args.tsc_fast:
            arms.append(f"tscfast={args.tsc_fast}")
        res = run_timing_accuracy(arms, {"nested_loop": args.scale}, reps=args.reps,
                                  baseline=BASELINE, out_dir=args.out,
                                  min_node_ms=args.min_node_ms,
                                  progress=lambda s: print(s, file=sys.stderr))
        run = res.run_dir
        analyze_run(run, baseline=BASELINE, reference=REFERENCE, min_node_ms=args.min_node_ms)
    df = query3_table(run, args.min_node_ms)
    df.to_csv(run / "query3.csv", index=False)
    text = render(df)
    (run / "query3.md").write_text(text)
    print(text)
    print(f"run: {run}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
