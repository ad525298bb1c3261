"""Can a user trust the colours of a repeated-recordings differential? Checked both ways.

1. **A/A**: vanilla against vanilla (separate recordings, each on its own cluster and
   backend), *--aa-repeats* times. Every flagged frame is a false positive. Printed: per
   repeat and pooled, the share of frames flagged, by stack path and by function, self
   and total, the pooled rate with its binomial (Wilson score) 95 % interval. (The frames
   of one comparison are not independent — a recording on a slow vCPU slows them all —
   so the per-repeat rates are printed too.)
2. **Known cost**: vanilla against ``tests/fixtures/patches/material-spin.patch`` (16
   increments of a volatile counter in every ExecMaterial call, in ExecMaterial's own
   frame), *--cost-repeats* times. Printed: ExecMaterial's change (self and total, by
   function) with its interval and whether it is flagged dearer, the stack paths ending
   in ExecMaterial flagged, and the share of the other frames flagged.

Everything goes through :func:`profkit.experiments.flamediff.record_diff` (the engine
that ``profkit perf A B`` and ``make demo`` use). The runs stay in *--out* (default a
temporary folder); the figures are written as JSON with ``--json``.

Measured here (taken under load: a 2-vCPU VM shared with other work and PostgreSQL
builds; 4 + 4 recordings of 2 executions of Query-2, nested_loop at scale 0.02, perf at
999 Hz; ~90 s per comparison, most of it cluster starts):

- A/A, ``--aa-repeats 4 --cost-repeats 0`` (``results/flamediff_check_aa.json``): no
  frame flagged in any repeat: 0 of 249 stack paths (self) [Wilson 95 %: 0, 1.5 %], 0 of
  776 (total), 0 of 157 functions (self) [0, 2.4 %], 0 of 555 (total);
- known cost, the cached double-clock build (``--cost-build test-pk15-double-clock
  --cost-patch tests/fixtures/patches/instrstop-double-clock.patch --target
  InstrStopNode --cost-mode analyze_timing --cost-repeats 2``,
  ``results/flamediff_check_double_clock.json``): the second clock read shows in the
  ``__vdso_clock_gettime`` frames (frame-pointer unwinding through the vDSO skips
  InstrStopNode), flagged dearer in both runs, +23 to +27 ms per execution with
  intervals excluding 0; InstrStopNode's own frame unchanged; 5 of 176 other stack
  paths flagged (2.8 %);
- known cost, material-spin.patch: not measured yet (its build waited behind other
  builds past the deadline).

Usage::

    .venv/bin/python benchmarks/flamediff_check.py --aa-repeats 4 --cost-repeats 3 \\
        --json benchmarks/results/flamediff_check.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from profkit.analyze.flamediff import aa_flag_rate
from profkit.analyze.stats import wilson_interval
from profkit.experiments.flamediff import DiffRun, check_request, record_diff
from profkit.pg.build import BuildSpec, get_build

ROOT = Path(__file__).resolve().parents[1]
SPIN_PATCH = ROOT / "tests" / "fixtures" / "patches" / "material-spin.patch"
SPIN_BUILD = "test-material-spin"
TARGET = "ExecMaterial"
COMBOS = (("path", "self"), ("path", "total"), ("function", "self"), ("function", "total"))


def spin_spec(name: str = SPIN_BUILD, patch: Path = SPIN_PATCH) -> BuildSpec:
    return BuildSpec(name, patches=(str(patch),),
                     description="vanilla + a known cost (test patch)")


def rate_line(hits: int, n: int) -> str:
    lo, hi = wilson_interval(hits, n)
    return f"{hits} of {n} = {hits / n:.2%} [Wilson 95 %: {lo:.2%}, {hi:.2%}]" if n else "none"


def known_cost_figures(res: DiffRun, target: str = TARGET) -> dict[str, Any]:
    """What the known-cost check asserts, from one comparison vanilla → the patch."""
    d = res.diff
    out: dict[str, Any] = {"run": str(res.run.path)}
    for basis in ("self", "total"):
        r = d.lookup("function", basis).get(target)
        out[f"function_{basis}"] = None if r is None else {
            k: (float(r[k]) if k not in ("flag",) else int(r[k]))
            for k in ("a_mean", "b_mean", "change", "low", "high", "change_pct", "pct_low",
                      "pct_high", "flag")}
    ps = d.rows("path", "self")
    mine = ps[ps["frame"].str.endswith(";" + target)]
    other = ps[~ps["frame"].str.endswith(";" + target)]
    out["paths_target"] = int(len(mine))
    out["paths_target_dearer"] = int((mine["flag"] > 0).sum())
    out["other_paths"] = int(len(other))
    out["other_paths_flagged"] = int((other["flag"] != 0).sum())
    out["other_flagged_frames"] = [
        f"{r['frame'].rsplit(';', 1)[-1]} {r['change']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}]"
        for r in other[other["flag"] != 0].to_dict("records")]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aa-repeats", type=int, default=4)
    ap.add_argument("--cost-repeats", type=int, default=3)
    ap.add_argument("--recordings", type=int, default=4, help="per build")
    ap.add_argument("--executions", type=int, default=2, help="per recording")
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--mode", default="analyze_notiming")
    ap.add_argument("--freq", type=int, default=999)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--cost-patch", type=Path, default=SPIN_PATCH,
                    help="the known-cost patch (default: material-spin.patch)")
    ap.add_argument("--cost-build", default=SPIN_BUILD, help="its build's name")
    ap.add_argument("--target", default=TARGET, help="the function the patch makes dearer")
    ap.add_argument("--cost-mode", default=None, help="mode of the known-cost runs "
                    "(default: --mode)")
    args = ap.parse_args(argv)

    out = args.out or Path(tempfile.mkdtemp(prefix="flamediff-check-"))
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.monotonic()
    vanilla = get_build("vanilla")
    common = dict(scale=args.scale, mode=args.mode, recordings=args.recordings,
                  executions=args.executions, freq=args.freq)
    print(f"runs in {out}; {args.recordings} recordings per build of {args.executions} "
          f"execution(s), nested_loop {args.mode} at scale {args.scale}, perf {args.freq} Hz",
          flush=True)
    figures: dict[str, Any] = {"settings": {k: (str(v) if isinstance(v, Path) else v)
                                            for k, v in vars(args).items()}}

    # ---- A/A
    aa: list[DiffRun] = []
    for i in range(args.aa_repeats):
        t0 = time.monotonic()
        req = check_request("vanilla", "vanilla", order_seed=1000 + i, **common)
        res = record_diff(req, base=out, builds={a.label: vanilla for a in req.arms})
        aa.append(res)
        rates = ", ".join(f"{k} {b} {h}/{n}" for k, b in COMBOS
                          for h, n in [res.diff.flag_rate(k, b)])  # type: ignore[arg-type]
        print(f"A/A {i + 1}: {rates} ({time.monotonic() - t0:.0f} s)", flush=True)
    figures["aa"] = {}
    if aa:
        print("A/A pooled (frames flagged of frames tested):")
        for k, b in COMBOS:
            hits, n = aa_flag_rate([r.diff for r in aa], k, b)  # type: ignore[arg-type]
            per = [r.diff.flag_rate(k, b) for r in aa]  # type: ignore[arg-type]
            lo, hi = wilson_interval(hits, n)
            figures["aa"][f"{k}_{b}"] = {"hits": hits, "n": n, "rate": hits / n if n else None,
                                         "wilson": [lo, hi], "per_repeat": per}
            print(f"  by {k}, {b}: {rate_line(hits, n)}; per repeat "
                  + ", ".join(f"{h}/{m}" for h, m in per))

    # ---- known cost
    spin = get_build(spin_spec(args.cost_build, args.cost_patch)) if args.cost_repeats else None
    target = args.target
    cost_common = {**common, "mode": args.cost_mode or args.mode}
    costs = []
    for i in range(args.cost_repeats):
        t0 = time.monotonic()
        req = check_request("vanilla", f"spin={args.cost_build}", order_seed=2000 + i,
                            known=[args.cost_build], **cost_common)
        res = record_diff(req, base=out, builds={"vanilla": vanilla, "spin": spin})
        fig = known_cost_figures(res, target)
        costs.append(fig)
        fs = fig["function_self"] or {}
        ft = fig["function_total"] or {}
        print(f"known cost {i + 1} ({time.monotonic() - t0:.0f} s): {target} self "
              f"{fs.get('a_mean', 0):.3f} → {fs.get('b_mean', 0):.3f} ms/exec, change "
              f"{fs.get('change', 0):+.3f} [{fs.get('low', 0):+.3f}, {fs.get('high', 0):+.3f}] "
              f"= {fs.get('change_pct', 0):+.1f} %, flag {fs.get('flag')}; total change "
              f"{ft.get('change', 0):+.3f} [{ft.get('low', 0):+.3f}, {ft.get('high', 0):+.3f}]"
              f", flag {ft.get('flag')}; stack paths ending in {target} dearer "
              f"{fig['paths_target_dearer']}/{fig['paths_target']}; other paths flagged "
              f"{fig['other_paths_flagged']}/{fig['other_paths']}", flush=True)
        for line in fig["other_flagged_frames"]:
            print(f"    other flagged: {line}")
    figures["known_cost"] = costs
    if costs:
        found = sum(1 for c in costs if (c["function_self"] or {}).get("flag") == 1)
        oth = sum(c["other_paths_flagged"] for c in costs)
        n_oth = sum(c["other_paths"] for c in costs)
        print(f"known cost: {target} (function, self) flagged dearer in {found} of "
              f"{len(costs)} runs; other stack paths flagged: {rate_line(oth, n_oth)}")
        figures["known_cost_summary"] = {"found": found, "runs": len(costs),
                                         "other_flagged": oth, "other_n": n_oth}
    figures["seconds"] = round(time.monotonic() - t_all, 1)
    print(f"wall time {figures['seconds']:.0f} s (taken under load)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1, default=str) + "\n")
        print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
