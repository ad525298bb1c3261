"""Repeated perf recordings of two builds, interleaved, and a differential a user can trust.

``profkit perf A B --recordings N`` and ``make demo``'s vanilla → step3 graph come here:

1. the request is checked before anything is built (:func:`check_request`);
2. the engine (:class:`profkit.experiments.harness.Session`) runs the two arms: each
   recording on a fresh cluster and backend of its own by default (*backends*), the
   workload loaded and the query run once unrecorded (warm-up) before it, the arms
   interleaved in a seeded order (A B B A ...); a recording is ``perf record`` of that
   backend (:func:`profkit.collect.perf.record_pid`) while the engine runs the query
   *executions* times (:meth:`Session.execute`, THE timed execution);
3. every recording is a perf run of its own under ``<run>/recordings/<arm>/rNN/``
   (perf.data, folded stacks, provenance: executions, frequency), folded after the
   session so folding never runs between recordings;
4. the recordings become :class:`profkit.analyze.flamediff.Recording` s (samples ×
   1000/freq ms ÷ executions: ms of CPU per execution), the bootstrap
   (:func:`profkit.analyze.flamediff.bootstrap_diff`) gives every frame's change with its
   interval, written to ``flamediff.csv``; the SVG colours only the frames whose
   interval excludes 0.

:func:`read_recordings` reads such a folder of recordings back (``profkit flamegraph
--diff A_DIR B_DIR``): perf runs (per execution) or bare ``.folded`` files (samples per
recording).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from profkit import rundir
from profkit.analyze import flamediff as FD
from profkit.analyze.stacks import EXECUTOR_WRAPPERS, drop_frames
from profkit.collect import perf as perf_mod
from profkit.errors import ProfkitError
from profkit.experiments import harness
from profkit.parse.folded import read_folded
from profkit.pg.build import Build, presets
from profkit.pg.cluster import BENCH_SETTINGS
from profkit.pg.workloads import SEED_QUERY_NAMES, check_args, get_workload
from profkit.render.flamegraph import render, write_svg

Say = Callable[[str], None]

#: Recordings per build unless asked otherwise: enough for the expanded interval to
#: flag a real change (with 2 it can hardly flag anything), few enough to stay short.
DEFAULT_RECORDINGS = 4
RECORDINGS_DIR = "recordings"
TABLE_FILE = "flamediff.csv"
RECORDING_COLUMNS = ("arm", "preset", "rep", "block", "order", "run_id", "executions",
                     "freq", "client_ms", "cpu_ms", "backend_pid")


class FlameDiffError(ProfkitError):
    """A repeated-recordings differential that cannot be made as asked."""


@dataclass(frozen=True)
class DiffRequest:
    """Two arms (before A, after B) and how they are recorded; checked up front."""

    arms: tuple[harness.Arm, harness.Arm]
    workload: str
    scale: float
    mode: str
    recordings: int
    executions: int
    freq: int
    backends: int
    align: bool = True
    order_seed: int = 0


def check_request(a: str | harness.Arm, b: str | harness.Arm, *,
                  workload: str = "nested_loop", scale: float = 0.05,
                  mode: str = "analyze_notiming", recordings: int = DEFAULT_RECORDINGS,
                  executions: int = 1, freq: int = perf_mod.DEFAULT_FREQ,
                  backends: int | None = None, align: bool = True,
                  order_seed: int | None = None,
                  known: Sequence[str] = ()) -> DiffRequest:
    """Validate a request before anything is built or started.

    *a*, *b*: arms as ``profkit bench --builds`` writes them (``PRESET`` or
    ``LABEL=PRESET[:guc=v]``); the same preset twice is an A/A check (labelled
    ``PRESET-a`` and ``PRESET-b`` unless labelled). *backends*: fresh backends per arm
    (None: one per recording). *align*: drop the executor's wrapper frames inside the
    stacks of both builds (:func:`profkit.analyze.stacks.drop_frames`) so plan nodes line
    up when one build has no wrapper."""
    check_args(workload, scale=scale, reps=executions, mode=mode)
    for name, v, lo in (("recordings", recordings, 2), ("executions", executions, 1),
                        ("freq", freq, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise FlameDiffError(f"{name} must be an integer >= {lo}, got {v!r}"
                                 + (" (a bootstrap over recordings needs at least 2 per "
                                    "build)" if name == "recordings" else ""))
    k = recordings if backends is None else backends
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= recordings:
        raise FlameDiffError(f"backends must be an integer from 1 to recordings "
                             f"({recordings}), got {backends!r}")
    texts = [x if isinstance(x, harness.Arm) else str(x) for x in (a, b)]
    if not any(isinstance(x, harness.Arm) for x in texts) and texts[0] == texts[1] \
            and "=" not in str(texts[0]):
        p = str(texts[0])
        lab = p.partition(":")[0].replace("/", "-").replace("@", "-")
        texts = [f"{lab}-a={p}", f"{lab}-b={p}"]
    try:
        arms = harness.parse_arms(texts, set(known) | set(presets()))
    except harness.HarnessError as e:
        raise FlameDiffError(f"build {e}") from None
    seed = order_seed if order_seed is not None else harness.new_seed()
    return DiffRequest((arms[0], arms[1]), workload, float(scale), mode, recordings,
                       executions, freq, k, bool(align), int(seed))


@dataclass
class DiffRun:
    """A repeated-recordings differential: its run directory, the recordings of each arm
    (after alignment), the bootstrap's answer and the SVG."""

    run: rundir.RunDir
    request: DiffRequest | None
    a: list[FD.Recording]
    b: list[FD.Recording]
    diff: FD.FlameDiff
    svg: Path | None = None
    recordings: pd.DataFrame = field(default_factory=pd.DataFrame)
    perf_runs: dict[str, list[rundir.RunDir]] = field(default_factory=dict)

    @property
    def labels(self) -> tuple[str, str]:
        arms = self.run.provenance.get("arms") or ["A", "B"]
        return str(arms[0]), str(arms[1])

    def pooled(self, side: str) -> dict[str, float]:
        """Every recording of *side* ("a" or "b") summed: samples, for a plain graph."""
        out: dict[str, float] = {}
        for r in (self.a if side == "a" else self.b):
            for k, v in r.counts.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def console(self, top: int = 10) -> str:
        a, b = self.labels
        lines = [f"run {self.run.run_id}: {a} → {b}, {self.diff.describe()}"]
        for key, basis in (("function", "self"), ("function", "total")):
            hits, n = self.diff.flag_rate(key, basis)
            lines.append(f"by function, {basis}: {hits} of {n} frames flagged "
                         "(interval excludes 0)")
            fl = self.diff.flagged(key, basis).head(top)
            if len(fl):
                lines.append(flagged_text(fl, self.diff.unit))
        hits, n = self.diff.flag_rate("path", "self")
        lines.append(f"by stack path, self (the graph's colours): {hits} of {n} flagged")
        lines.append(f"table: {self.run.file(TABLE_FILE)}")
        if self.svg is not None:
            lines.append(f"flamegraph: {self.svg}")
        rec = self.run.path / RECORDINGS_DIR
        lines.append(f"redraw: profkit flamegraph --diff {rec / a} {rec / b}"
                     + (" --align" if self.run.provenance.get("align") else ""))
        return "\n".join(lines)


def flagged_text(rows: pd.DataFrame, unit: str) -> str:
    """Flagged rows as an aligned text table: change with interval, in the unit and %."""
    u = "ms/exec" if unit == "ms per execution" else "samples/rec"
    out = []
    for r in rows.to_dict("records"):
        pct = ("new" if not math.isfinite(r["change_pct"]) else
               f"{r['change_pct']:+.1f} % [{r['pct_low']:+.0f}, {r['pct_high']:+.0f}]")
        out.append(f"  {'dearer ' if r['flag'] > 0 else 'cheaper'} {r['frame'][:48]:<48} "
                   f"{r['a_mean']:9.3f} → {r['b_mean']:9.3f} {u}  change {r['change']:+.3f} "
                   f"[{r['low']:+.3f}, {r['high']:+.3f}]  {pct}")
    return "\n".join(out)


# --------------------------------------------------------------------------- recording

def record_diff(req: DiffRequest, *, out: str | Path | None = None,
                base: str | Path | None = None, flamegraph: str | Path | None = None,
                builds: dict[str, Build] | None = None, n_boot: int = FD.DEFAULT_N_BOOT,
                boot_seed: int = FD.DEFAULT_SEED, title: str | None = None,
                progress: Say | None = None) -> DiffRun:
    """Record *req* (see the module docstring), bootstrap, draw; returns the run.

    *out*: the run directory (new or empty; default ``profiles/<run_id>``, or under
    *base*); *flamegraph*: the SVG path (default ``<run>/flamegraph-diff.svg`` only);
    *builds*: label → Build already at hand (else built or taken from the cache)."""
    say = progress or (lambda _m: None)
    perf_mod.perf_path()
    wl = get_workload(req.workload)
    sql = wl.query(req.mode)
    a_arm, b_arm = req.arms
    try:
        run_id, path = rundir.place("flamediff", a_arm.label, "vs", b_arm.label,
                                    path=out, base=base)
    except rundir.RunDirError as e:
        raise FlameDiffError(str(e)) from None
    built: dict[str, Build] = dict(builds or {})
    for arm in req.arms:
        if arm.label not in built:
            b = harness.resolve_build(arm, progress=say)
            assert b is not None
            built[arm.label] = b
    qname = (SEED_QUERY_NAMES.get(req.mode, req.mode) if req.workload == "nested_loop"
             else req.mode)
    rows: list[dict[str, Any]] = []
    runs: dict[str, list[rundir.RunDir]] = {a_arm.label: [], b_arm.label: []}
    with rundir.open_run(
            "flamediff", path=path, run_id=run_id, workload=req.workload, mode=req.mode,
            tools=("perf", "gcc"), arms=[a_arm.label, b_arm.label],
            presets={a.label: a.preset for a in req.arms},
            builds={a.label: built[a.label].provenance() for a in req.arms},
            scale=req.scale, recordings=req.recordings, executions=req.executions,
            freq=req.freq, backends=req.backends, align=req.align,
            order_seed=req.order_seed, query=sql, query_name=qname,
            cluster_settings=dict(BENCH_SETTINGS)) as rd:
        session = harness.Session(
            list(req.arms), built, name="flamediff", log_dir=rd.path / "logs",
            options=harness.SessionOptions(backends=req.backends, pgss=False),
            say=say, arm_word="build")

        def prepare(t: harness.Target) -> None:
            assert t.conn is not None
            say(f"{t.label}: cluster {t.block} of {req.backends} on port {t.cluster.port}, "
                f"loading {wl.name} at scale {req.scale}")
            wl.load(t.conn, req.scale)

        def warm(t: harness.Target, _cell: Any) -> None:
            session.execute(t, sql, what=f"{qname} (warm-up)")

        def record(t: harness.Target, _cell: Any, rep: int, _slot: int, order: int) -> None:
            parent = rd.path / RECORDINGS_DIR / t.label
            parent.mkdir(parents=True, exist_ok=True)
            timed: list[harness.Timed] = []

            def go() -> None:
                for i in range(req.executions):
                    timed.append(session.execute(
                        t, sql, what=f"{qname}, recording {rep}, execution {i + 1}"))

            with rundir.open_run("perf", build=t.build, workload=req.workload,
                                 mode=req.mode, base=parent, run_id=f"r{rep:02d}",
                                 scale=req.scale, query=sql, query_name=qname,
                                 reps=req.executions, executions=req.executions,
                                 arm=t.label, rep=rep, order=order, block=t.block,
                                 flamediff_run=rd.run_id) as prun:
                try:
                    rec, _ = perf_mod.record_pid(t.backend_pid, go, run=prun, freq=req.freq,
                                                 call_graph="fp", stat=False,
                                                 binary=t.build.postgres)
                except perf_mod.PerfError as e:
                    if isinstance(e.__cause__, harness.ExecFailed):
                        raise FlameDiffError(
                            session.failure(e.__cause__, f"recording {rep}")[1]
                            + f" (what perf recorded is kept in {prun.path})") from None
                    raise
                prun.update(client_ms=[m.client_ms for m in timed],
                            cpu_ms=[m.cpu_ms for m in timed])
            runs[t.label].append(prun)
            row = {"arm": t.label, "preset": t.arm.preset, "rep": rep, "block": t.block,
                   "order": order, "run_id": prun.run_id, "executions": req.executions,
                   "freq": req.freq, "client_ms": sum(m.client_ms for m in timed),
                   "cpu_ms": sum(m.cpu_ms for m in timed), "backend_pid": t.backend_pid}
            rows.append(row)
            say(f"recording {order + 1} of {2 * req.recordings}: {t.label} r{rep}, "
                f"{rec.samples if rec.samples is not None else '?'} samples")

        session.prepare = prepare
        group = harness.Group("record", [req.mode], req.order_seed, run=record, warm=warm)
        session.run(req.recordings, [group])
        table = pd.DataFrame(rows, columns=list(RECORDING_COLUMNS))
        table.to_csv(rd.file("recordings.csv"), index=False)
        rd.add_artifact("recordings.csv", "one row per recording: arm, repetition, order, "
                                          "its perf run, executions, times")
        say(f"folding {len(rows)} recordings")
        for arm_runs in runs.values():
            for prun in arm_runs:
                perf_mod.fold_run(prun, binary=built[str(prun.provenance['arm'])].postgres)
        res = diff_from_dirs(rd.path / RECORDINGS_DIR / a_arm.label,
                             rd.path / RECORDINGS_DIR / b_arm.label, align=req.align,
                             n_boot=n_boot, seed=boot_seed)
        res.run, res.request, res.recordings, res.perf_runs = rd, req, table, runs
        write_table(res.diff, rd.file(TABLE_FILE))
        rd.add_artifact(TABLE_FILE, "every frame's change B − A with its bootstrap interval "
                                    "(path/function × self/total)")
        hits, n = res.diff.flag_rate("path", "self")
        rd.update(bootstrap={"n_boot": n_boot, "seed": boot_seed,
                             "confidence": res.diff.confidence, "method": res.diff.method,
                             "unit": res.diff.unit},
                  flagged_path_self=[hits, n])
        svg = draw(res, rd.file("flamegraph-diff.svg"),
                   title=title or f"{a_arm.label} → {b_arm.label}: {req.workload} {qname} "
                                  f"(perf, {req.recordings} recordings each)")
        rd.add_artifact("flamegraph-diff.svg", "the differential (repeated recordings)")
        res.svg = write_svg(svg.read_text(), flamegraph) if flamegraph is not None else svg
    return res


def write_table(diff: FD.FlameDiff, path: Path) -> Path:
    diff.table.to_csv(path, index=False, float_format="%.6g")
    return path


def draw(res: DiffRun, path: str | Path, *, title: str, basis: str = "self",
         extra: dict[str, str] | None = None) -> Path:
    """The SVG of a repeated-recordings differential (widths: B's mean profile)."""
    facts: dict[str, Any] = {}
    first = res.perf_runs.get(res.labels[1]) or []
    if first:
        facts.update(first[0].subtitle_facts())
        for k in ("run", "build", "patches", "date"):
            facts.pop(k, None)
    facts["run"] = res.run.run_id
    facts["before (A)"] = f"{res.labels[0]}: {len(res.a)} recordings"
    facts["after (B)"] = f"{res.labels[1]}: {len(res.b)} recordings"
    if res.run.provenance.get("align"):
        facts["aligned"] = ("wrapper frames " + "/".join(sorted(EXECUTOR_WRAPPERS))
                            + " removed inside stacks")
    facts.update(extra or {})
    svg = render(FD.union_profile(res.a, res.b), title=title, provenance=facts,
                 significance=res.diff, diff_basis=basis,  # type: ignore[arg-type]
                 count_name=("ms per execution" if res.diff.unit == "ms per execution"
                             else "samples per recording"))
    return write_svg(svg, path)


# --------------------------------------------------------------------------- reading back

def read_recordings(folder: str | Path, *, align: bool = False
                    ) -> tuple[list[FD.Recording], list[rundir.RunDir]]:
    """The recordings in *folder*: the perf runs directly under it (folded; their
    provenance gives executions and frequency: ms per execution), else its ``*.folded``
    files (samples per recording: each file one recording of the same length)."""
    d = Path(folder)
    if not d.is_dir():
        raise FlameDiffError(f"{d}: not a folder of recordings (give the folder holding one "
                             "perf run per recording, e.g. <run>/recordings/<build>, or "
                             "a folder of .folded files)")
    subs = sorted(p for p in d.iterdir() if p.is_dir() and (p / rundir.PROVENANCE_FILE).exists())
    recs: list[FD.Recording] = []
    prs: list[rundir.RunDir] = []
    if subs:
        for p in subs:
            pr = rundir.load_run(p)
            folded = pr.file(perf_mod.FOLDED)
            if not folded.exists():
                pr = perf_mod.fold_run(pr).run
            execs = int(pr.provenance.get("executions") or pr.provenance.get("reps") or 1)
            freq = pr.get("perf.freq")
            if not freq:
                raise FlameDiffError(f"{p}: its provenance has no perf frequency (perf.freq); "
                                     "only perf runs recorded by profkit can be read as time")
            counts = read_folded(folded, strict=True)
            recs.append(FD.Recording(drop_frames(counts) if align else counts, execs,
                                     1000.0 / float(freq), label=f"{d.name}/{p.name}"))
            prs.append(pr)
        queries = {str(pr.provenance.get("query") or "") for pr in prs}
        if len(queries) > 1:
            raise FlameDiffError(f"{d}: the recordings ran different queries; a comparison "
                                 "per execution needs the same query in every recording")
        return recs, prs
    files = sorted(d.glob("*.folded"))
    if not files:
        raise FlameDiffError(f"{d}: no perf runs and no .folded files in it")
    for f in files:
        counts = read_folded(f)
        recs.append(FD.Recording(drop_frames(counts) if align else counts, label=f.name))
    return recs, prs


def diff_from_dirs(a_dir: str | Path, b_dir: str | Path, *, align: bool = False,
                   n_boot: int = FD.DEFAULT_N_BOOT, seed: int = FD.DEFAULT_SEED
                   ) -> DiffRun:
    """Two folders of recordings (:func:`read_recordings`) and their bootstrap."""
    a, pa = read_recordings(a_dir, align=align)
    b, pb = read_recordings(b_dir, align=align)
    if bool(pa) != bool(pb):
        raise FlameDiffError("one folder holds perf runs, the other bare .folded files: "
                             "compare like with like")
    if pa and pb:
        qa = pa[0].provenance.get("query")
        qb = pb[0].provenance.get("query")
        if qa != qb:
            raise FlameDiffError(f"A ran {qa!r} and B ran {qb!r}: a comparison per "
                                 "execution needs the same query on both builds")
    diff = FD.bootstrap_diff(a, b, n_boot=n_boot, seed=seed)
    # a folder of recordings (not a run): a stand-in RunDir names it in the graph
    parent = Path(a_dir).resolve().parent
    run: rundir.RunDir | None = None
    with contextlib.suppress(rundir.RunDirError):
        run = rundir.load_run(parent.parent) if (parent.parent / rundir.PROVENANCE_FILE
                                                 ).exists() else None
    la, lb = Path(a_dir).name, Path(b_dir).name
    if la == lb:
        la, lb = f"A-{la}", f"B-{lb}"
    if run is None or run.kind != "flamediff":
        run = rundir.RunDir(parent.name, parent, {"arms": [la, lb], "align": align})
    return DiffRun(run, None, a, b, diff, perf_runs={la: pa, lb: pb})


def aligned(counts: dict[str, float]) -> dict[str, float]:
    """*counts* with the executor's wrapper frames dropped inside stacks
    (:func:`profkit.analyze.stacks.drop_frames`): what ``--align`` does to either kind of
    differential."""
    return drop_frames(counts)


def draw_folders(a_dir: str | Path, b_dir: str | Path, out: Path, *, title: str | None = None,
                 subtitle: str | None = None, facts: dict[str, Any] | None = None,
                 width: float = 1200, min_width_px: float = 0.1, basis: str = "self",
                 align: bool = False, n_boot: int = FD.DEFAULT_N_BOOT,
                 seed: int = FD.DEFAULT_SEED) -> tuple[DiffRun, Path, str]:
    """``profkit flamegraph --diff A_DIR B_DIR``: the bootstrap of two folders of
    recordings, the coloured SVG at *out* and the text the command prints."""
    import datetime as _dt

    res = diff_from_dirs(a_dir, b_dir, align=align, n_boot=n_boot, seed=seed)
    a, b = res.labels
    prov: dict[str, Any] = {"before (A)": f"{a_dir} ({len(res.a)} recordings)",
                            "after (B)": f"{b_dir} ({len(res.b)} recordings)"}
    if align:
        prov["aligned"] = "executor wrapper frames removed inside stacks"
    prov.update(facts or {})
    prov.setdefault("rendered", _dt.datetime.now().strftime("%Y-%m-%d %H:%M"))
    svg = render(FD.union_profile(res.a, res.b), significance=res.diff,
                 title=title or f"{a}-vs-{b}",
                 subtitle=subtitle, provenance=prov, width=width, min_width_px=min_width_px,
                 diff_basis=basis, count_name=res.diff.unit)  # type: ignore[arg-type]
    path = write_svg(svg, out)
    d = res.diff
    lines = [d.describe()]
    for key, bs in (("function", "self"), ("function", "total"), ("path", basis)):
        hits, n = d.flag_rate(key, bs)  # type: ignore[arg-type]
        lines.append(f"by {key}, {bs}: {hits} of {n} frames flagged (interval excludes 0)")
        if key == "function":
            rows = d.flagged(key, bs).head(10)  # type: ignore[arg-type]
            if len(rows):
                lines.append(flagged_text(rows, d.unit))
    lines.append(str(path))
    return res, path, "\n".join(lines)


__all__ = ["DEFAULT_RECORDINGS", "DiffRequest", "DiffRun", "FlameDiffError", "check_request",
           "aligned", "diff_from_dirs", "draw", "draw_folders", "read_recordings",
           "record_diff"]
