"""What the node_marker patch costs, in instructions, with its setting off and on.

For the three seed workloads, callgrind counts one execution (after a warm-up) of the
plain query, rows-only EXPLAIN ANALYZE (TIMING FALSE, BUFFERS FALSE) and the default
EXPLAIN ANALYZE (TIMING and BUFFERS on) on

- vanilla (the reference: its plain query),
- node_marker with ``track_executor_node`` off (the default: what the patch costs every
  query),
- node_marker with ``track_executor_node`` on (what marking the running node costs),

with :func:`benchmarks.headline.measure` (the headline matrix's machinery and scales),
and sets each count against vanilla's plain query of the same major and workload.  The
goal for the plain query with the setting on is ≤ +2 %.  Vanilla's counts are reused from
``benchmarks/results/headline.csv`` when they were counted on the build this source and
compiler make now (the counts are deterministic), else counted again.

Under valgrind clock_gettime is a system call whose kernel work is not counted: the
EXPLAIN ANALYZE (TIMING) rows understate timing's cost; the plain and rows-only rows are
exact.

Usage::

    .venv/bin/python benchmarks/nodetime_cost.py                 # PostgreSQL 18
    .venv/bin/python benchmarks/nodetime_cost.py --majors 18,19
    .venv/bin/python benchmarks/nodetime_cost.py --check         # print the committed file

Writes ``benchmarks/results/nodetime_cost.csv`` and ``nodetime_cost.md`` (a later run
replaces the cells it measured and keeps the others).
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
from pathlib import Path
from types import ModuleType

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CSV_NAME = "nodetime_cost.csv"
MD_NAME = "nodetime_cost.md"
MODES = ("plain", "analyze_notiming", "analyze_timing_buffers")
SHORT = {"plain": "plain", "analyze_notiming": "rows only",
         "analyze_timing_buffers": "EXPLAIN ANALYZE"}
GOAL_PCT = 2.0
SETTING = "track_executor_node"
#: arm -> (variant, setting value or None)
ARMS: dict[str, tuple[str, str | None]] = {
    "vanilla": ("vanilla", None),
    "node_marker off": ("node_marker", "off"),
    "node_marker on": ("node_marker", "on"),
}
COLUMNS = ["pg_major", "pg_version", "arm", "build", "setting", "workload", "scale", "mode",
           "instructions", "vanilla_plain_instructions", "vs_vanilla_plain_pct", "goal_pct",
           "verdict", "build_key", "valgrind", "measured_at"]
KEY = ["pg_major", "arm", "workload", "mode"]


def headline() -> ModuleType:
    """benchmarks/headline.py, whose callgrind machinery this script reuses."""
    spec = importlib.util.spec_from_file_location("profkit_headline",
                                                  ROOT / "benchmarks" / "headline.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def reused_vanilla(h: ModuleType, major: str, workload: str) -> dict | None:
    """Vanilla's committed headline cells of this workload, if counted on today's build."""
    path = h.RESULTS / h.CSV_NAME
    if not path.exists():
        return None
    df = h.read_results(h.RESULTS)
    key = h.expected_key(h.build_name("vanilla", major, "gcc"))
    sel = df[(df["compiler"] == "gcc") & (df["pg_major"].astype(str) == major)
             & (df["build"] == "vanilla") & (df["workload"] == workload)
             & (df["scale"] == h.SCALES[workload]) & (df["mode"].isin(MODES))
             & (df["build_key"] == key)]
    if set(sel["mode"]) != set(MODES):
        return None
    return {"instructions": dict(zip(sel["mode"], sel["instructions"].astype(int),
                                     strict=True)),
            "pg_version": str(sel["pg_version"].iloc[0]), "build_key": key,
            "valgrind": str(sel["valgrind"].iloc[0]),
            "measured_at": str(sel["measured_at"].iloc[0])}


def with_reference(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["pg_major"] = df["pg_major"].astype(str)
    ref = df[(df["arm"] == "vanilla") & (df["mode"] == "plain")]
    ref = ref.set_index(["pg_major", "workload"])["instructions"]
    keys = list(zip(df["pg_major"], df["workload"], strict=True))
    df["vanilla_plain_instructions"] = [ref.get(k, math.nan) for k in keys]
    df["vs_vanilla_plain_pct"] = ((df["instructions"] - df["vanilla_plain_instructions"])
                                  / df["vanilla_plain_instructions"] * 100).round(3)
    goal = (df["arm"] == "node_marker on") & (df["mode"] == "plain")
    df["goal_pct"] = [GOAL_PCT if g else math.nan for g in goal]
    df["verdict"] = ["" if not g or math.isnan(v) else ("met" if v <= GOAL_PCT else "missed")
                     for g, v in zip(goal, df["vs_vanilla_plain_pct"], strict=True)]
    return df


def merge(old: pd.DataFrame | None, new: pd.DataFrame) -> pd.DataFrame:
    if old is not None and not old.empty:
        old = old.copy()
        old["pg_major"] = old["pg_major"].astype(str)
        new_keys = set(map(tuple, new[KEY].astype(str).values.tolist()))
        keep = [tuple(r) not in new_keys for r in old[KEY].astype(str).values.tolist()]
        new = pd.concat([old[keep], new], ignore_index=True)
    arm_rank = {a: i for i, a in enumerate(ARMS)}
    new = with_reference(new)
    new = new.assign(_a=new["arm"].map(arm_rank), _m=new["mode"].map(
        {m: i for i, m in enumerate(MODES)}))
    new = new.sort_values(["pg_major", "workload", "_a", "_m"]).drop(columns=["_a", "_m"])
    return new.reset_index(drop=True)[COLUMNS]


def fmt(v: float) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.2f} %"


def markdown(df: pd.DataFrame) -> str:
    out = ["# node_marker: instructions against vanilla's plain query", "",
           "Generated by `benchmarks/nodetime_cost.py` (callgrind via `benchmarks/headline.py`'s "
           "`measure`: one execution per mode after a warm-up, scope exec_simple_query, GCC). "
           f"Goal: the plain query with `{SETTING}` on ≤ +{GOAL_PCT:.1f} % (✓ met, ✗ missed). "
           "Under valgrind clock_gettime's kernel work is not counted: the EXPLAIN ANALYZE "
           "(TIMING) column understates timing's cost. Counts in `nodetime_cost.csv`.", ""]
    for _major, g in df.groupby("pg_major", sort=True):
        out += [f"## PostgreSQL {g['pg_version'].dropna().iloc[0]}", ""]
        wls = list(dict.fromkeys(g["workload"]))
        head = ["arm"] + [f"{w} {SHORT[m]}" for w in wls for m in MODES]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for arm in ARMS:
            cells = [arm]
            for w in wls:
                for m in MODES:
                    r = g[(g["arm"] == arm) & (g["workload"] == w) & (g["mode"] == m)]
                    if r.empty:
                        cells.append("–")
                        continue
                    r0 = r.iloc[0]
                    mark = {"met": " ✓", "missed": " ✗"}.get(str(r0["verdict"]), "")
                    cells.append(fmt(r0["vs_vanilla_plain_pct"]) + mark)
            out.append("| " + " | ".join(cells) + " |")
        vp = g[(g["arm"] == "vanilla") & (g["mode"] == "plain")]
        scales = ", ".join(f"{r.workload} {r.scale:g}: {int(r.instructions):,}"
                           for r in vp.itertuples())
        out += ["", f"vanilla's plain query (scale: instructions): {scales}.", ""]
        on = g[(g["arm"] == "node_marker on") & (g["mode"] == "plain")]
        off = g[(g["arm"] == "node_marker off") & (g["mode"] == "plain")]
        for r in on.itertuples():
            o = off[off["workload"] == r.workload]
            extra = int(r.instructions) - int(o["instructions"].iloc[0]) if not o.empty else None
            if extra is not None:
                out.append(f"- {r.workload}: setting on adds {extra:,} instructions to the plain "
                           f"query ({fmt(r.vs_vanilla_plain_pct)} of vanilla's).")
        out.append("")
    return "\n".join(out)


def header_lines(df: pd.DataFrame, major: str) -> str:
    """The patch header's cost paragraph for *major*, from the committed results."""
    g = with_reference(df)
    g = g[g["pg_major"].astype(str) == major]
    out = ["callgrind instructions against vanilla's plain query "
           "(benchmarks/nodetime_cost.py, results in benchmarks/results/nodetime_cost.csv; "
           "GCC, one execution after a warm-up), setting off / on:"]
    for w in dict.fromkeys(g["workload"]):
        cell = {}
        for arm in ("node_marker off", "node_marker on"):
            for m in MODES:
                r = g[(g["arm"] == arm) & (g["workload"] == w) & (g["mode"] == m)]
                cell[(arm, m)] = fmt(float(r["vs_vanilla_plain_pct"].iloc[0])) if len(r) else "n/a"
        on = g[(g["arm"] == "node_marker on") & (g["workload"] == w) & (g["mode"] == "plain")]
        verdict = f" ({on['verdict'].iloc[0]})" if len(on) and on["verdict"].iloc[0] else ""
        out.append(f"  {w}: plain {cell[('node_marker off', 'plain')]} / "
                   f"{cell[('node_marker on', 'plain')]}{verdict}; rows-only EXPLAIN ANALYZE "
                   f"{cell[('node_marker off', 'analyze_notiming')]} / "
                   f"{cell[('node_marker on', 'analyze_notiming')]}; default EXPLAIN ANALYZE "
                   f"{cell[('node_marker off', 'analyze_timing_buffers')]} / "
                   f"{cell[('node_marker on', 'analyze_timing_buffers')]}")
    out.append(f"The goal for the plain query with the setting on is <= +{GOAL_PCT:.1f} %.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--majors", default="18")
    ap.add_argument("--workloads", default="nested_loop,join_sum,count_star")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--check", action="store_true", help="print the committed results")
    ap.add_argument("--header", default=None, metavar="MAJOR",
                    help="print the patch header's cost paragraph for MAJOR (18 or 19) from "
                         "the committed results")
    args = ap.parse_args(argv)
    out: Path = args.out
    old = (pd.read_csv(out / CSV_NAME, dtype={"pg_major": str})
           if (out / CSV_NAME).exists() else None)
    if args.header:
        if old is None:
            raise SystemExit(f"nodetime_cost.py: no {out / CSV_NAME}: run it first")
        print(header_lines(old, args.header))
        return 0
    if args.check:
        if old is None:
            raise SystemExit(f"nodetime_cost.py: no {out / CSV_NAME}: run it first")
        print(markdown(merge(None, old)))
        return 0
    h = headline()
    majors = [m.strip() for m in args.majors.split(",") if m.strip()]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [w for w in workloads if w not in h.SCALES] + [a for a in arms if a not in ARMS]
    if bad:
        raise SystemExit(f"nodetime_cost.py: unknown {', '.join(bad)}")

    def say(s: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {s}", flush=True)

    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    for major in majors:
        for w in workloads:
            rows: list[dict] = []
            for arm in arms:
                variant, value = ARMS[arm]
                build = h.build_name(variant, major, "gcc")
                reuse = reused_vanilla(h, major, w) if arm == "vanilla" else None
                if reuse is not None:
                    say(f"{build} {w}: vanilla's committed headline counts reused "
                        f"(build {reuse['build_key']})")
                    counts, version = reuse["instructions"], reuse["pg_version"]
                    key, vg, when = reuse["build_key"], reuse["valgrind"], reuse["measured_at"]
                else:
                    c = h.measure(build, w, h.SCALES[w], MODES, say,
                                  settings={SETTING: value} if value else None)
                    counts, version, key, vg, when = (c.instructions, c.pg_version,
                                                      c.build_key, c.valgrind, stamp)
                for m, n in counts.items():
                    rows.append({"pg_major": major, "pg_version": version, "arm": arm,
                                 "build": build, "setting": value or "", "workload": w,
                                 "scale": h.SCALES[w], "mode": m, "instructions": int(n),
                                 "build_key": key, "valgrind": vg, "measured_at": when})
            old = merge(old, pd.DataFrame(rows))
            out.mkdir(parents=True, exist_ok=True)
            old.to_csv(out / CSV_NAME, index=False)
            (out / MD_NAME).write_text(markdown(old))
    assert old is not None
    print(markdown(old))
    print(f"wrote {out / CSV_NAME} and {out / MD_NAME}")
    return 0


if __name__ == "__main__":
    for _base in (ROOT.parent, ROOT.parent.parent):
        _tarball = _base / "shared" / "pg-sources" / "postgresql-19beta1.tar.bz2"
        if _tarball.is_file():
            os.environ.setdefault("PROFKIT_PG19_SOURCE", f"tarball:{_tarball}")
            break
    sys.exit(main())
