"""sampled_timing's residual bias per plan node, against exact timing minus its clock reads.

One ``profkit timing-accuracy`` run of the three seed workloads (plain, TIMING FALSE and
TIMING TRUE, interleaved) on the arms

- ``vanilla`` and ``tsc_clock``: exact timing (clock_gettime, profkit's TSC clock);
- ``sampled_timing`` at its default rate (100), and with ``--twin``
  ``sampled_timing_n1`` (the same build at rate 1: PostgreSQL's own code path);
- with ``--before NAME``, ``before``: a named build of an earlier sampled_timing patch,
  measured in the same run (``profkit build NAME --patch OLD.patch``).

The yardstick is the TSC arm's TIMING TRUE node time minus its own clock reads:
``corrected:tsc_clock`` = inclusive − (own calls + 2 × descendants' calls) × the in-situ
cost of one read (tsc_clock's TIMING TRUE − TIMING FALSE over its reads, per workload),
as :func:`profkit.analyze.timing_accuracy.bias_table` computes it; ``corrected`` (vanilla
minus its reads) and ``corrected:sampled_timing_n1`` are reported beside it.

Per node with a yardstick mean of at least ``--min-node-ms``: the signed mean error of
the inclusive time in % of the yardstick, its standard error, and a 95 % interval
(bias ± t(0.975, n − 1) × se, n repetitions).  Written to
``benchmarks/results/sampled_timing_bias.csv`` and ``.md`` (the run directory is named in
both).  The figures are times taken on a shared 2-vCPU VM (the load average is printed).

Usage::

    .venv/bin/python benchmarks/sampled_timing_bias.py --reps 9 --seed 20261201
    .venv/bin/python benchmarks/sampled_timing_bias.py --run profiles/<run>   # re-read
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from scipy import stats

from profkit.render.markdown import loadavg_span

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CSV = RESULTS / "sampled_timing_bias.csv"
MD = RESULTS / "sampled_timing_bias.md"
ARMS = ["vanilla", "tsc_clock", "sampled_timing"]
TWIN = "sampled_timing_n1=sampled_timing:explain_timing_sample_rate=1"
YARDSTICK = "corrected:tsc_clock"
OTHER_YARDSTICKS = ("corrected", "corrected:sampled_timing_n1")
ESTIMATORS = ("sampled_timing", "before")
COLUMNS = ["run_id", "workload", "node_id", "node_type", "arm", "yardstick", "n",
           "yard_mean_ms", "arm_mean_ms", "bias_pct", "se_pct", "ci_low_pct", "ci_high_pct"]


@dataclass(frozen=True)
class Summary:
    """Over the nodes of one arm against one yardstick: the range of the biases and the
    envelope of their 95 % intervals."""

    arm: str
    yardstick: str
    nodes: int
    bias_min_pct: float
    bias_max_pct: float
    ci_low_pct: float
    ci_high_pct: float

    @property
    def zero_in_every_interval(self) -> bool:
        return self.ci_low_pct <= 0.0 <= self.ci_high_pct

    def text(self) -> str:
        """How the docs, the patch header and the help text quote it."""
        return (f"{self.bias_min_pct:+.1f} % to {self.bias_max_pct:+.1f} % "
                f"(95 % intervals from {self.ci_low_pct:+.1f} % to {self.ci_high_pct:+.1f} %)")


def bias_rows(run: Path, min_node_ms: float) -> pd.DataFrame:
    """The per-node table of a run's ``bias.csv`` (inclusive times, nodes whose yardstick
    mean is at least *min_node_ms*), with 95 % intervals."""
    b = pd.read_csv(run / "bias.csv")
    prov = json.loads((run / "provenance.json").read_text())
    b = b[(b["metric"] == "inclusive_ms") & b["arm"].isin(ESTIMATORS)
          & b["yardstick"].isin((YARDSTICK, *OTHER_YARDSTICKS))]
    # a node is kept if the main yardstick has it at >= min_node_ms
    main = b[(b["yardstick"] == YARDSTICK) & (b["yard_mean_ms"] >= min_node_ms)]
    keep = set(zip(main["workload"], main["node_id"], strict=True))
    b = b[[(w, n) in keep for w, n in zip(b["workload"], b["node_id"], strict=True)]].copy()
    t = b["n"].map(lambda n: float(stats.t.ppf(0.975, max(int(n) - 1, 1))))
    b["ci_low_pct"] = b["bias_pct"] - t * b["se_pct"]
    b["ci_high_pct"] = b["bias_pct"] + t * b["se_pct"]
    b["run_id"] = prov.get("run_id", run.name)
    return b[COLUMNS].sort_values(["arm", "yardstick", "workload", "node_id"],
                                  ignore_index=True)


def paired_rows(run: Path, min_node_ms: float) -> pd.DataFrame:
    """The same bias, paired by repetition (the arms of one repetition ran interleaved, so
    drift of the shared machine cancels in their ratio): per node, the mean over
    repetitions of sampled_timing / (tsc_clock minus its reads) − 1, in %, its standard
    error and 95 % interval."""
    from profkit.analyze import timing_accuracy as ta

    nodes = pd.read_parquet(run / "nodes.parquet")
    prov = json.loads((run / "provenance.json").read_text())
    ns = ((prov.get("analysis") or {}).get("in_situ_read_ns_twins") or {}).get(YARDSTICK, {})
    t = nodes[nodes["mode"] == ta.TIMING_MODE]
    out = []
    for wl, w in t.groupby("workload", sort=True):
        if str(wl) not in ns:
            continue
        ref = pd.concat([ta.corrected_times(g, ns[str(wl)])
                         for _, g in w[w["arm"] == "tsc_clock"].groupby("rep", sort=True)])
        est = w[w["arm"] == "sampled_timing"]
        j = est.merge(ref[["rep", "node_id", ta.INCLUSIVE]], on=["rep", "node_id"],
                      suffixes=("", "_yard"))
        for nid, g in j.groupby("node_id", sort=True):
            if g[f"{ta.INCLUSIVE}_yard"].mean() < min_node_ms:
                continue
            r = (g[ta.INCLUSIVE] / g[f"{ta.INCLUSIVE}_yard"] - 1.0) * 100.0
            n = len(r)
            se = float(r.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
            q = float(stats.t.ppf(0.975, max(n - 1, 1)))
            out.append({"workload": wl, "node_id": int(nid),
                        "node_type": g["node_type"].iloc[0], "n": n,
                        "paired_bias_pct": float(r.mean()), "paired_se_pct": se,
                        "paired_ci_low_pct": float(r.mean()) - q * se,
                        "paired_ci_high_pct": float(r.mean()) + q * se})
    return pd.DataFrame(out)


def summarize(rows: pd.DataFrame, arm: str, yardstick: str = YARDSTICK) -> Summary | None:
    r = rows[(rows["arm"] == arm) & (rows["yardstick"] == yardstick)]
    if r.empty:
        return None
    return Summary(arm, yardstick, len(r), round(float(r["bias_pct"].min()), 1),
                   round(float(r["bias_pct"].max()), 1), round(float(r["ci_low_pct"].min()), 1),
                   round(float(r["ci_high_pct"].max()), 1))


def render(rows: pd.DataFrame, run: Path, min_node_ms: float) -> str:
    prov = json.loads((run / "provenance.json").read_text())
    cmd = " ".join(prov.get("command_line") or []) or "?"
    lines = [
        "# sampled_timing: residual bias per plan node", "",
        f"Run `{prov.get('run_id', run.name)}` ({prov.get('started_at', '?')} → "
        f"{prov.get('ended_at', '?')}), made by `benchmarks/sampled_timing_bias.py` "
        f"(`{cmd}`): {prov.get('reps')} interleaved repetitions (seed "
        f"{prov.get('order_seed')}), workloads "
        + ", ".join(f"{w} @ {s:g}" for w, s in (prov.get("scales") or {}).items())
        + f"; load average {loadavg_span(prov)}. "
        "Times taken on a shared 2-vCPU VM.", "",
        f"Yardstick `{YARDSTICK}`: tsc_clock's TIMING TRUE inclusive time minus its own clock "
        "reads at their in-situ cost (TIMING TRUE − FALSE over its reads, per workload); "
        "`corrected` is vanilla's, `corrected:sampled_timing_n1` the rate-1 twin's. Bias = "
        "(mean of the arm − mean of the yardstick) / mean of the yardstick, inclusive time, "
        f"nodes ≥ {min_node_ms:g} ms; 95 % interval = bias ± t(0.975, n−1) × se.", ""]
    for arm in ESTIMATORS:
        for y in (YARDSTICK, *OTHER_YARDSTICKS):
            s = summarize(rows, arm, y)
            if s is not None:
                lines.append(f"- **{arm} vs {y}**: {s.text()} on {s.nodes} nodes"
                             + (" — 0 is inside every interval" if s.zero_in_every_interval
                                else ""))
    lines += ["", "| arm | yardstick | workload | node | yardstick ms | bias | ± se | "
              "95 % interval |", "|---|---|---|---|---|---|---|---|"]
    for r in rows.itertuples():
        lines.append(f"| {r.arm} | {r.yardstick} | {r.workload} | {r.node_id} {r.node_type} "
                     f"| {r.yard_mean_ms:.3g} | {r.bias_pct:+.1f} % | {r.se_pct:.1f} | "
                     f"{r.ci_low_pct:+.1f} … {r.ci_high_pct:+.1f} % |")
    p = paired_rows(run, min_node_ms)
    if not p.empty:
        lines += ["", "Paired by repetition (sampled_timing / yardstick − 1 per repetition, mean "
                  "± se, 95 % interval; the arms of a repetition ran interleaved):", "",
                  "| workload | node | n | paired bias | ± se | 95 % interval |",
                  "|---|---|---|---|---|---|"]
        for r in p.itertuples():
            lines.append(f"| {r.workload} | {r.node_id} {r.node_type} | {r.n} | "
                         f"{r.paired_bias_pct:+.1f} % | {r.paired_se_pct:.1f} | "
                         f"{r.paired_ci_low_pct:+.1f} … {r.paired_ci_high_pct:+.1f} % |")
        lines += ["", f"Paired, over these nodes: {p['paired_bias_pct'].min():+.1f} % to "
                  f"{p['paired_bias_pct'].max():+.1f} % (95 % intervals from "
                  f"{p['paired_ci_low_pct'].min():+.1f} % to "
                  f"{p['paired_ci_high_pct'].max():+.1f} %)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, help="re-read this run directory instead of measuring")
    ap.add_argument("--out", type=Path, help="run directory (default profiles/<run_id>)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--before", default="",
                    help="named build of an earlier sampled_timing patch (adds arm before)")
    ap.add_argument("--twin", action="store_true",
                    help="add sampled_timing at rate 1 (PostgreSQL's own code path) as an arm")
    ap.add_argument("--min-node-ms", type=float, default=1.0)
    ap.add_argument("--no-write", action="store_true",
                    help="print only; leave benchmarks/results/ as it is")
    args = ap.parse_args(argv)
    from profkit.experiments.timing_accuracy import analyze_run, run_timing_accuracy

    if args.run:
        run = args.run
    else:
        arms = (list(ARMS) + ([TWIN] if args.twin else [])
                + ([f"before={args.before}"] if args.before else []))
        res = run_timing_accuracy(arms, None, reps=args.reps, seed=args.seed,
                                  out_dir=args.out, min_node_ms=args.min_node_ms,
                                  progress=lambda s: print(s, file=sys.stderr))
        run = res.run_dir
    analyze_run(run, reference="tsc_clock", min_node_ms=args.min_node_ms)
    rows = bias_rows(run, args.min_node_ms)
    if rows.empty or summarize(rows, "sampled_timing") is None:
        print(f"{run}: no sampled_timing node ≥ {args.min_node_ms:g} ms against {YARDSTICK}",
              file=sys.stderr)
        return 1
    text = render(rows, run, args.min_node_ms)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        rows.to_csv(CSV, index=False, float_format="%.4f")
        MD.write_text(text)
    print(text)
    print(f"run: {run}")
    return 0 if not math.isnan(rows["bias_pct"].iloc[0]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
