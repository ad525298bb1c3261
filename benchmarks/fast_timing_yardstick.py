"""pg19/fast_timing's node times against yardsticks without clock reads (not only "lower").

Reads a Query-3 run of ``benchmarks/bench_query3_timing.py`` (default: the committed
``profiles/20261130-query3-pg19-timing``) in a scratch copy, analyses it with the current
``profkit timing-accuracy`` analysis (baseline pg19tsc, reference pg19sys) and compares,
per node of at least 1 ms (inclusive time, mean over repetitions):

- ``corrected``: pg19tsc's TIMING TRUE time minus its own clock reads, at their in-situ
  cost (pg19tsc's TIMING TRUE − TIMING FALSE over its reads);
- ``corrected:pg19sys``: the same from the system-clock arm;

how far fast_timing and pg19tsc (upstream's TSC timing) are from each (signed bias ± se,
95 % interval), and by how many percentage points fast_timing is closer
(|pg19tsc's bias| − |fast_timing's bias|).  Beside them, the root against the plain
query's execution (``truth.csv``), the one yardstick with no per-node clock at all.

Writes ``benchmarks/results/fast_timing_yardstick.csv`` and ``.md``.  Times taken under
load on a shared 2-vCPU VM.

Usage::

    .venv/bin/python benchmarks/fast_timing_yardstick.py [--run profiles/<query3 run>]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pandas as pd
from scipy import stats

from profkit.render.markdown import loadavg_span

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "profiles" / "20261130-query3-pg19-timing"
RESULTS = ROOT / "benchmarks" / "results"
CSV = RESULTS / "fast_timing_yardstick.csv"
MD = RESULTS / "fast_timing_yardstick.md"
ARM, UPSTREAM = "fast", "pg19tsc"
YARDSTICKS = ("corrected", "corrected:pg19sys")
COLUMNS = ["run_id", "workload", "node_id", "node_type", "yardstick", "yard_mean_ms",
           "read_ns", "fast_bias_pct", "fast_se_pct", "fast_ci_low_pct", "fast_ci_high_pct",
           "upstream_bias_pct", "upstream_se_pct", "closer_by_pp"]
INPUTS = ("provenance.json", "timings.csv", "plans.jsonl")


def analyse(run: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(bias.csv, truth.csv, provenance) of *run*, analysed in a scratch copy."""
    from profkit.experiments.timing_accuracy import analyze_run

    with tempfile.TemporaryDirectory(prefix="pk-ft-yard-") as tmp:
        t = Path(tmp) / run.name
        t.mkdir()
        for f in INPUTS:
            shutil.copyfile(run / f, t / f)
        analyze_run(t, baseline=UPSTREAM, reference="pg19sys", min_node_ms=1.0)
        return (pd.read_csv(t / "bias.csv"), pd.read_csv(t / "truth.csv"),
                json.loads((t / "provenance.json").read_text()))


def table(bias: pd.DataFrame, prov: dict, min_node_ms: float = 1.0) -> pd.DataFrame:
    a = prov.get("analysis") or {}
    read_ns = {"corrected": a.get("in_situ_read_ns") or {},
               **{k: v for k, v in (a.get("in_situ_read_ns_twins") or {}).items()}}
    b = bias[(bias["metric"] == "inclusive_ms") & bias["yardstick"].isin(YARDSTICKS)
             & (bias["yard_mean_ms"] >= min_node_ms)]
    rows = []
    for (wl, nid, y), g in b.groupby(["workload", "node_id", "yardstick"], sort=True):
        g = g.set_index("arm")
        if ARM not in g.index or UPSTREAM not in g.index:
            continue
        f, u = g.loc[ARM], g.loc[UPSTREAM]
        t = float(stats.t.ppf(0.975, max(int(f["n"]) - 1, 1)))
        rows.append({
            "run_id": prov.get("run_id"), "workload": wl, "node_id": int(nid),
            "node_type": f["node_type"], "yardstick": y, "yard_mean_ms": f["yard_mean_ms"],
            "read_ns": float((read_ns.get(y) or {}).get(wl, float("nan"))),
            "fast_bias_pct": f["bias_pct"], "fast_se_pct": f["se_pct"],
            "fast_ci_low_pct": f["bias_pct"] - t * f["se_pct"],
            "fast_ci_high_pct": f["bias_pct"] + t * f["se_pct"],
            "upstream_bias_pct": u["bias_pct"], "upstream_se_pct": u["se_pct"],
            "closer_by_pp": abs(u["bias_pct"]) - abs(f["bias_pct"]),
        })
    return pd.DataFrame(rows, columns=COLUMNS)


def render(df: pd.DataFrame, truth: pd.DataFrame, prov: dict, run: Path) -> str:
    lines = ["# pg19/fast_timing against yardsticks without clock reads", "",
             f"Run `{prov.get('run_id')}` (`{run.relative_to(ROOT) if run.is_relative_to(ROOT) else run}`"
             f", {prov.get('reps')} interleaved repetitions, nested_loop @ "
             f"{(prov.get('scales') or {}).get('nested_loop')}; load average "
             f"{loadavg_span(prov)}), re-analysed by "
             "`benchmarks/fast_timing_yardstick.py`. Times taken under load.", "",
             "`corrected` = pg19tsc's inclusive time minus its own clock reads at their "
             "in-situ cost; `corrected:pg19sys` the same from the system-clock arm. "
             "closer by = |pg19tsc's bias| − |fast_timing's bias| (percentage points).", "",
             "| yardstick | node | yardstick ms | ns per read | fast_timing | 95 % interval "
             "| pg19tsc | closer by |", "|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        lines.append(f"| {r.yardstick} | {r.node_id} {r.node_type} | {r.yard_mean_ms:.1f} | "
                     f"{r.read_ns:.2f} | {r.fast_bias_pct:+.1f} % ±{r.fast_se_pct:.1f} | "
                     f"{r.fast_ci_low_pct:+.1f} … {r.fast_ci_high_pct:+.1f} % | "
                     f"{r.upstream_bias_pct:+.1f} % ±{r.upstream_se_pct:.1f} | "
                     f"{r.closer_by_pp:.1f} pp |")
    tr = truth.set_index("arm") if "arm" in truth else pd.DataFrame()
    if {ARM, UPSTREAM} <= set(tr.index):
        lines += ["", f"Root against the plain query's execution (`truth.csv`): fast_timing "
                  f"{tr.at[ARM, 'root_vs_truth_pct']:+.1f} %, pg19tsc "
                  f"{tr.at[UPSTREAM, 'root_vs_truth_pct']:+.1f} %."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, default=RUN)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    run = args.run.resolve()
    bias, truth, prov = analyse(run)
    df = table(bias, prov)
    if df.empty:
        print(f"{run}: no node ≥ 1 ms with both {ARM} and {UPSTREAM}", file=sys.stderr)
        return 1
    text = render(df, truth, prov, run)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        df.to_csv(CSV, index=False, float_format="%.4f")
        MD.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
