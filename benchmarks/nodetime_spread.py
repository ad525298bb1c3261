"""How far per-node shares move from one server process to the next, and how far the
stack method is from the node marker on the same executions.

    .venv/bin/python benchmarks/nodetime_spread.py [--processes 20] [--workloads ...]

Per seed workload, ``--processes`` times, interleaved:

- **vanilla, stack method**: a throwaway cluster (a new postmaster: its own code and
  data addresses), the workload loaded, ``profkit nodetime`` by call stack until
  ``--min-samples`` samples;
- **node_marker, both methods on the same executions**: a throwaway cluster of the
  node_marker build, ``method="marker", stacks=True``: bcc reads the node marker while
  ``perf record -g`` records the same backend, so the two tables differ only by how a
  sample finds its node.

Printed and written (``results/nodetime_spread.md``, ``.csv``), per node with ≥ 5 % of the
time: the median share of each series over the processes, its range, the runs farther
than 5 pp from that median, the spread sampling alone would give (±2 binomial standard
deviations at the run's sample count), and the same-execution difference stack − marker
(median and largest). Take it with the machine otherwise idle.

    .venv/bin/python benchmarks/nodetime_spread.py --same-exec [CSV]

reads a run's CSV (default ``results/nodetime_spread.csv``) and prints, per node with
≥ 5 % of the time, what notebook 08's same-execution bound rests on: the mean difference
stack − marker over the processes, its standard deviation, the part binomial sampling
explains at the runs' sample counts, the excess beyond it (process to process), and the
bound ``OFFSET + Z·sd`` the notebook draws at 500 and 1,000 samples per sampler.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import statistics
import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the seed workloads at the accuracy benchmark's scales
from nodetime_accuracy import MIN_SHARE, SEED_SCALES  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FAR_PP = 5.0


def one_round(workload: str, scale: float, min_samples: int, i: int) -> list[dict]:
    from profkit.experiments.nodetime import nodetime_build

    rows: list[dict] = []
    van = nodetime_build("vanilla", workload, scale=scale, min_samples=min_samples)
    mk = nodetime_build("node_marker", workload, scale=scale, method="marker", stacks=True,
                        min_samples=min_samples)
    for series, res in (("vanilla stacks", van), ("node_marker marker", mk),
                        ("node_marker stacks (same executions)", mk.stacks)):
        assert res is not None
        for r in res.df.itertuples():
            rows.append({"workload": workload, "process": i, "series": series,
                         "node_id": r.node_id, "node_type": r.node_type,
                         "share": float(r.exclusive_share),
                         "executor_samples": res.executor_samples,
                         "ms_per_execution": 1000 * float(res.facts["seconds"])
                         / max(1, int(res.facts["reps"])),
                         "ambiguous_samples": float(r.ambiguous_samples)})
    return rows


def summary(df: pd.DataFrame) -> pd.DataFrame:
    out = []
    for (wl, nid), g in df.groupby(["workload", "node_id"], sort=False):
        ref = g[g["series"] == "node_marker marker"]["share"]
        if ref.median() < MIN_SHARE:
            continue
        row = {"workload": wl, "node": f"{nid} {g['node_type'].iloc[0]}"}
        for series, key in (("vanilla stacks", "vanilla"), ("node_marker marker", "marker")):
            s = g[g["series"] == series]["share"] * 100
            n = g[g["series"] == series]["executor_samples"].median()
            med = float(s.median())
            p = med / 100
            row.update({f"{key} median": med, f"{key} min": float(s.min()),
                        f"{key} max": float(s.max()),
                        f"{key} runs >{FAR_PP:g} pp off": int(((s - med).abs() > FAR_PP).sum()),
                        f"{key} ±2σ sampling": 200 * math.sqrt(p * (1 - p) / n)})
        m = g[g["series"] == "node_marker marker"].set_index("process")["share"]
        st = g[g["series"] == "node_marker stacks (same executions)"].set_index("process")["share"]
        d = ((st - m) * 100).dropna()
        row.update({"same-exec diff median": float(d.median()),
                    "same-exec |diff| max": float(d.abs().max())})
        out.append(row)
    return pd.DataFrame(out)


def farthest(df: pd.DataFrame) -> list[str]:
    """Per workload and series: the run farthest from the median on some node ≥ 5 %, with
    its time per execution against the series' median and its rank (1 = slowest)."""
    out = []
    for (wl, series), g in df[df["series"] != "node_marker stacks (same executions)"].groupby(
            ["workload", "series"], sort=False):
        med = g.groupby("node_id")["share"].median()
        big = med[med >= MIN_SHARE].index
        g = g[g["node_id"].isin(big)].copy()
        g["off"] = (g["share"] - g["node_id"].map(med)).abs() * 100
        worst = g.loc[g["off"].idxmax()]
        per = g.groupby("process")["ms_per_execution"].first()
        rank = int((per > per[worst["process"]]).sum()) + 1
        out.append(f"- {wl}, {series}: process {int(worst['process'])}, {worst['node_type']} "
                   f"{worst['off']:.1f} pp from the median; {per[worst['process']]:.2f} ms per "
                   f"execution against a median of {per.median():.2f} (rank {rank} of "
                   f"{len(per)}, 1 = slowest)")
    return out


def same_exec_calibration(df: pd.DataFrame, offset_pp: float, run_pp: float, z: float
                          ) -> pd.DataFrame:
    """Per node with ≥ MIN_SHARE by the marker: the same-execution difference stack −
    marker (pp) over the processes — mean, sd, the sd binomial sampling gives, the excess
    sd beyond it — and notebook 08's bound at 500 and 1,000 samples per sampler (its
    shares at the node's median)."""
    same = "node_marker stacks (same executions)"
    out = []
    for (wl, nid), g in df.groupby(["workload", "node_id"], sort=False):
        m = g[g["series"] == "node_marker marker"].set_index("process")
        st = g[g["series"] == same].set_index("process")
        pm = m["share"]
        ps = st["share"].reindex(pm.index)
        if pm.median() < MIN_SHARE:
            continue
        d = (ps - pm) * 100
        sampling = 100 * (pm * (1 - pm) / m["executor_samples"]
                          + ps * (1 - ps) / st["executor_samples"].reindex(pm.index)) ** 0.5
        excess = max(float(d.var(ddof=1) - (sampling ** 2).mean()), 0.0) ** 0.5
        row = {"workload": wl, "node": f"{nid} {g['node_type'].iloc[0]}",
               "mean diff": float(d.mean()), "sd": float(d.std(ddof=1)),
               "sampling sd": float(sampling.mean()), "excess sd": excess,
               "samples": float(m["executor_samples"].median())}
        p_m, p_s = float(pm.median()), float(ps.median())
        for n in (500, 1000):
            sd = 100 * (p_m * (1 - p_m) / n + p_s * (1 - p_s) / n + (run_pp / 100) ** 2) ** 0.5
            row[f"bound at {n}"] = offset_pp + z * sd
        out.append(row)
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=20)
    ap.add_argument("--workloads", default=",".join(SEED_SCALES))
    ap.add_argument("--min-samples", type=int, default=500)
    ap.add_argument("--out", default=str(RESULTS / "nodetime_spread"))
    ap.add_argument("--same-exec", nargs="?", const=str(RESULTS / "nodetime_spread.csv"),
                    default=None, metavar="CSV",
                    help="print what notebook 08's same-execution bound rests on, from CSV")
    a = ap.parse_args(argv)
    if a.same_exec:
        offset_pp, run_pp, z = 2.6, 1.5, 3.5  # notebook 08's OFFSET_PP, RUN_PP, Z
        print(f"# {a.same_exec}: stack - marker on the same executions, pp; bound = "
              f"{offset_pp} + {z} sd (binomial at N samples per sampler and {run_pp} pp "
              "process to process)")
        print(same_exec_calibration(pd.read_csv(a.same_exec), offset_pp, run_pp, z)
              .to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        return 0
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    started = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows: list[dict] = []
    for wl in a.workloads.split(","):
        for i in range(a.processes):
            rows.extend(one_round(wl, SEED_SCALES[wl], a.min_samples, i))
            print(f"{wl}: process {i + 1}/{a.processes}", file=sys.stderr, flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(a.out + ".csv", index=False)
    s = summary(df)
    head = (f"# Per-node shares from process to process, and stack vs marker on the same "
            f"executions\n\nGenerated by `benchmarks/nodetime_spread.py --processes "
            f"{a.processes}` on {started} ({time.monotonic() - t0:.0f} s; 1-minute load "
            f"average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end). Each "
            f"process is a new throwaway cluster; at least {a.min_samples} samples per run "
            f"(999 Hz); the marker runs sample ≥ 3 s. Shares in % of the executor's samples, "
            f"nodes with ≥ {MIN_SHARE:.0%} by the marker; '±2σ sampling' is the spread "
            f"binomial sampling alone gives at the run's median sample count.\n\n")
    cols = ["workload", "node",
            "vanilla median", "vanilla min", "vanilla max", f"vanilla runs >{FAR_PP:g} pp off",
            "vanilla ±2σ sampling",
            "marker median", "marker min", "marker max", f"marker runs >{FAR_PP:g} pp off",
            "marker ±2σ sampling", "same-exec diff median", "same-exec |diff| max"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in s[cols].itertuples(index=False):
        vals = [str(v) if isinstance(v, (str, int)) else f"{v:.1f}" for v in r]
        lines.append("| " + " | ".join(vals) + " |")
    amb = df[df["series"] == "node_marker stacks (same executions)"].groupby(
        ["workload", "process"])["ambiguous_samples"].sum()
    tail = (f"\n\nAmbiguous samples of the same-execution stack runs (shared in proportion): "
            f"median {statistics.median(amb):.0f}, at most {amb.max():.0f} per run.\n")
    tail += ("\nThe run farthest from the median, and how fast its executions were (the "
             "executions' wall time over their count):\n\n" + "\n".join(farthest(df)) + "\n")
    text = head + "\n".join(lines) + tail
    Path(a.out + ".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
