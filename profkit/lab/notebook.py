"""Small helpers the notebooks (and the ``%%profkit`` magic) share.

- :class:`Run` — one directory under ``profiles/`` read back (provenance and
  tables), with ``_repr_html_``; :func:`list_runs` / :func:`latest_run` find
  earlier runs so a notebook can start from disk instead of re-collecting.
- :func:`available_builds` — the builds a notebook asked for, split into the
  ones that are cached (or cheap: vanilla) and the ones skipped, with the reason.
- :class:`Progress` — :class:`profkit.progress.Progress`, re-exported.
- :class:`Comparison` — build-to-build comparisons with ``_repr_html_``.
- :func:`plan_tree` — a plan_nodes table drawn as an indented tree table.
- :func:`show` — display several rich objects (flamegraphs are iframes, so
  several in one notebook do not clash).

Nothing here collects: collection lives in :mod:`profkit.collect` and
:mod:`profkit.experiments`; this module only finds, loads and shows.
"""
from __future__ import annotations

import contextlib
import html
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from profkit import rundir, tables
from profkit.analyze import stats
from profkit.errors import ProfkitError
from profkit.pg.build import find_build, get_build, presets
from profkit.progress import Progress, in_notebook
from profkit.render.bench_report import differs_text

__all__ = ["Progress", "in_notebook"]  # re-exported: the one progress facility


class NotebookError(ProfkitError):
    pass


# ---------------------------------------------------------------------------
# Where am I running?


def show(*objs: Any) -> None:
    """Display each object with its richest representation (print outside IPython)."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover
        get_ipython = None  # type: ignore[assignment]
    if get_ipython is not None and get_ipython() is not None:
        for o in objs:
            display(o)
        return
    for o in objs:
        print(o)


# ---------------------------------------------------------------------------
# Builds


@dataclass
class BuildChoice:
    """The builds a notebook will use and the ones it skipped (with why)."""

    builds: dict[str, Any] = field(default_factory=dict)   # name -> profkit.pg.build.Build
    skipped: dict[str, str] = field(default_factory=dict)  # name -> reason

    @property
    def names(self) -> list[str]:
        return list(self.builds)

    def report(self) -> str:
        lines = [f"using builds: {', '.join(self.builds) or 'none'}"]
        for name, why in self.skipped.items():
            lines.append(f"SKIPPED build {name}: {why}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(n)}</td><td>used</td>"
            f"<td>{html.escape(str(getattr(b, 'key', ''))[:12])}</td></tr>"
            for n, b in self.builds.items())
        rows += "".join(
            f"<tr><td>{html.escape(n)}</td><td style='color:#b00'>skipped</td>"
            f"<td>{html.escape(why)}</td></tr>" for n, why in self.skipped.items())
        return f"<table><tr><th>build</th><th>status</th><th>key / reason</th></tr>{rows}</table>"


# Builds a notebook may build on the spot when missing: vanilla is what the test
# suite's fixtures build anyway; everything else must come from the cache.
ALWAYS_BUILD = ("vanilla",)


def available_builds(wanted: Sequence[str], *, build_missing: Iterable[str] = ALWAYS_BUILD,
                     progress: Callable[[str], None] | None = None) -> BuildChoice:
    """Split *wanted* into cached builds and skipped ones (never silently).

    Names in *build_missing* are built when not cached (vanilla by default);
    the others are used only if :func:`profkit.pg.build.find_build` finds them.
    An unknown preset name is skipped with the list of known presets.
    """

    known = presets()
    allowed = set(build_missing)
    out = BuildChoice()
    for name in wanted:
        if name in out.builds or name in out.skipped:
            continue
        if name not in known:
            out.skipped[name] = f"unknown preset (known: {', '.join(sorted(known))})"
            continue
        try:
            b = find_build(name)
            if b is None and name in allowed:
                b = get_build(name, progress=progress)
        except ProfkitError as e:
            out.skipped[name] = f"{type(e).__name__}: {e}"
            continue
        if b is None:
            out.skipped[name] = (f"not built yet (build it with `profkit build {name}`, "
                                 "then re-run this notebook)")
        else:
            out.builds[name] = b
    return out


# ---------------------------------------------------------------------------
# Runs under profiles/


_TABLE_SUFFIXES = (".parquet", ".csv")


@dataclass
class Run:
    """One run directory under ``profiles/``: provenance.json and its tables."""

    path: Path
    provenance: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path_or_id: str | Path, root: Path | None = None) -> Run:
        """Any run profkit wrote, through the one loader (:func:`profkit.rundir.load_run`)."""
        try:
            rd = rundir.load_run(path_or_id, root=root)
        except rundir.RunDirError as e:
            raise NotebookError(str(e)) from None
        return cls(rd.path, rd.provenance)

    @property
    def run_id(self) -> str:
        return str(self.provenance.get("run_id") or self.path.name)

    @property
    def created(self) -> float:
        try:
            return (self.path / "provenance.json").stat().st_mtime
        except OSError:
            return self.path.stat().st_mtime

    def _prov(self, *keys: str) -> Any:
        for k in keys:
            if k in self.provenance and self.provenance[k] not in (None, ""):
                return self.provenance[k]
        params = self.provenance.get("params") or self.provenance.get("settings") or {}
        for k in keys:
            if isinstance(params, Mapping) and k in params:
                return params[k]
        return None

    @property
    def builds(self) -> list[str]:
        b = self._prov("builds")
        if b is None and self._prov("build_name"):
            return [str(self._prov("build_name"))]  # a collector's run (one build)
        if isinstance(b, Mapping):
            return list(b)
        if isinstance(b, list):
            return [x if isinstance(x, str) else str(x.get("build", x.get("name", x)))
                    for x in b]
        if self.has("timings"):
            return [str(x) for x in self.table("timings")["build"].unique()]
        return []

    @property
    def workload(self) -> str | None:
        w = self._prov("workload")
        return None if w is None else str(w)

    @property
    def scale(self) -> float | None:
        s = self._prov("scale")
        try:
            return None if s is None else float(s)
        except (TypeError, ValueError):
            return None

    @property
    def kind(self) -> str:
        return str(self._prov("kind", "tool") or "bench")

    def files(self) -> list[str]:
        return sorted(p.name for p in self.path.iterdir())

    def has(self, table: str) -> bool:
        return any((self.path / f"{table}{s}").exists() for s in _TABLE_SUFFIXES)

    def table(self, name: str) -> pd.DataFrame:
        """``<name>.parquet`` (preferred, keeps dtypes) or ``<name>.csv``."""
        pq = self.path / f"{name}.parquet"
        if pq.exists():
            return pd.read_parquet(pq)
        csv = self.path / f"{name}.csv"
        if csv.exists():
            return pd.read_csv(csv)
        raise NotebookError(f"run {self.run_id} has no table {name!r} "
                            f"(files: {', '.join(self.files())})")

    def timings(self) -> pd.DataFrame:

        return tables.validate(self.table("timings"), "timings")

    def summary(self) -> pd.DataFrame:
        return self.table("summary")

    def __repr__(self) -> str:
        return (f"<Run {self.run_id} builds={self.builds} workload={self.workload} "
                f"scale={self.scale} at {self.path}>")

    def _repr_html_(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.created))
        rows = [("run", self.run_id), ("kind", self.kind), ("written", when),
                ("builds", ", ".join(self.builds) or "-"), ("workload", self.workload or "-"),
                ("scale", "-" if self.scale is None else f"{self.scale:g}"),
                ("directory", str(self.path)), ("files", ", ".join(self.files()))]
        for k in ("pg_version", "kernel", "cpu_model", "clocksource", "reps"):
            v = self._prov(k)
            if v is not None:
                rows.append((k, str(v)))
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
                       for k, v in rows)
        return f"<table>{body}</table>"


def list_runs(root: str | Path | None = None) -> list[Run]:
    """Every run under *root* (default profiles/) as :func:`profkit.rundir.list_runs`
    finds them, oldest written first."""
    return sorted((Run(rd.path, rd.provenance) for rd in rundir.list_runs(root)),
                  key=lambda r: r.created)


def latest_run(*, need: Sequence[str] = ("timings",), builds: Sequence[str] | None = None,
               workload: str | None = None, scale: float | None = None,
               kind: str | None = None, root: str | Path | None = None) -> Run | None:
    """The newest run that has the tables in *need* and covers *builds*/*workload*/*scale*."""
    for run in reversed(list_runs(root)):
        if any(not run.has(t) for t in need):
            continue
        if kind is not None and run.kind != kind:
            continue
        if workload is not None and run.workload not in (None, workload):
            continue
        if scale is not None and run.scale is not None and not math.isclose(run.scale, scale):
            continue
        if builds is not None and not set(builds) <= set(run.builds):
            continue
        return run
    return None


def resolve_run(run_dir: str | Path | None, **criteria: Any) -> Run | None:
    """A notebook's RUN_DIR parameter: that run if given, else the newest matching one."""
    if run_dir:
        return Run.load(run_dir)
    return latest_run(**criteria)


def open_run(kind: str, *, root: str | Path | None = None, path: str | Path | None = None,
             **facts: Any) -> contextlib.AbstractContextManager[rundir.RunDir]:
    """A notebook's own collection as a run: :func:`profkit.rundir.open_run` (the one
    lifecycle: provenance.json at once, status ``running``, then complete / failed /
    interrupted), under *root* (default profiles/) or exactly at *path*.

    ``with nb.open_run("callgrind-vanilla") as rd: collect(..., rd.path)``
    """
    return rundir.open_run(kind, base=root, path=path, **facts)


def save_run(kind: str, tables: Mapping[str, pd.DataFrame], *,
             root: str | Path | None = None, path: str | Path | None = None,
             **facts: Any) -> Run:
    """A notebook's own tables (parquet + csv) as a complete run of *kind* (*facts*: its
    provenance beside what :func:`open_run` records); return the Run."""
    with open_run(kind, root=root, path=path, **facts) as rd:
        for name, df in tables.items():
            df.to_csv(rd.file(f"{name}.csv"), index=False)
            try:
                df.to_parquet(rd.file(f"{name}.parquet"), index=False)
            except (ValueError, TypeError, ImportError):
                pass  # object columns (histograms) that pyarrow cannot store: csv only
    return Run.load(rd.path)


# ---------------------------------------------------------------------------
# Comparisons


@dataclass
class Comparison:
    """Build-to-build comparisons (rows of :func:`profkit.analyze.stats.compare_chain`)."""

    table: pd.DataFrame
    mode: str = ""

    @classmethod
    def chain(cls, timings: pd.DataFrame, builds: Sequence[str] | None = None,
              mode: str = "analyze_notiming", metric: str | None = None,
              **kwargs: Any) -> Comparison:
        """The report's step table (:func:`profkit.analyze.stats.compare_chain_metric`):
        by *metric*, default the run's own (``cpu_kept_ms`` when it calibrated)."""
        return cls(stats.compare_chain_metric(timings, builds, mode, metric, **kwargs), mode)

    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        return f"<Comparison {self.mode}: {len(self.table)} pair(s)>\n{self.table}"

    def _repr_html_(self) -> str:
        if self.table.empty:
            return f"<i>no comparison ({html.escape(self.mode)}): fewer than two builds</i>"
        rows = []
        for _, r in self.table.iterrows():
            differs = bool(r.get("overhead_differs", False))
            colour = "#060" if differs and r["overhead_diff_pct"] < 0 else (
                "#b00" if differs else "#555")
            verdict = ("lower" if r["overhead_diff_pct"] < 0 else "higher") if differs else \
                "no difference beyond noise"
            text = differs_text(r)
            if text.startswith("no ("):  # the interval excludes 0, the rank test does not
                verdict += text[2:]
            if text.startswith("too few"):
                colour, verdict = "#555", text.replace("too few", "too few repetitions to tell")
            rows.append(
                f"<tr><td>{html.escape(str(r['a']))} → {html.escape(str(r['b']))}</td>"
                f"<td>{r['median_a_ms']:.3f} → {r['median_b_ms']:.3f}</td>"
                f"<td>{r['overhead_a_pct']:.1f} % → {r['overhead_b_pct']:.1f} %</td>"
                f"<td>{r['overhead_diff_pct']:+.1f} pp [{r['diff_ci_low_pct']:+.1f}, "
                f"{r['diff_ci_high_pct']:+.1f}]</td>"
                f"<td style='color:{colour}'>{verdict}</td></tr>")
        head = ("<tr><th>builds</th><th>median ms</th><th>overhead</th>"
                "<th>Δ overhead (95 % CI)</th><th>verdict</th></tr>")
        return (f"<b>Comparison, mode {html.escape(self.mode)}</b>"
                f"<table>{head}{''.join(rows)}</table>")


# ---------------------------------------------------------------------------
# Plans


def plan_tree(nodes: pd.DataFrame, columns: Sequence[str] = ()) -> pd.DataFrame:
    """A plan_nodes-like table (node_id, parent_id, node_type) as an indented tree.

    Rows come out in depth-first order with a ``node`` column holding the node
    type indented by depth ("→" marks children), followed by *columns*.
    """
    need = {"node_id", "parent_id", "node_type"}
    if not need <= set(nodes.columns):
        raise NotebookError(f"plan_tree needs columns {sorted(need)}; got {list(nodes.columns)}")
    if nodes.empty:
        return pd.DataFrame(columns=["node_id", "node", *columns])
    children: dict[Any, list[Any]] = {}
    by_id = {}
    for _, r in nodes.iterrows():
        nid = int(r["node_id"])
        by_id[nid] = r
        parent = None if pd.isna(r["parent_id"]) else int(r["parent_id"])
        children.setdefault(parent, []).append(nid)
    roots = [n for n in children.get(None, [])] or [min(by_id)]
    # parents missing from the table (filtered rows) make their children roots too
    roots += [n for p, kids in children.items() if p is not None and p not in by_id
              for n in kids]
    out = []
    seen: set[int] = set()

    def walk(nid: int, depth: int) -> None:
        if nid in seen:
            return
        seen.add(nid)
        r = by_id[nid]
        label = ("    " * (depth - 1) + "  → " if depth else "") + str(r["node_type"])
        out.append({"node_id": nid, "node": label, **{c: r[c] for c in columns}})
        for k in sorted(children.get(nid, [])):
            walk(k, depth + 1)

    for r in sorted(roots):
        walk(r, 0)
    return pd.DataFrame(out)


def styled_tree(tree: pd.DataFrame) -> Any:
    """The tree table with the node column left-aligned and whitespace kept (for display)."""
    return (tree.style.hide(axis="index")
            .set_properties(subset=["node"], **{"text-align": "left", "white-space": "pre",
                                                "font-family": "monospace"}))
