"""What an export reads: a run directory (or its id) or a stacks file, with its facts.

``latest`` is the newest run that holds stacks (``profiles/latest`` may name a
benchmark, which has none).

A run is found and read by :mod:`profkit.rundir` (``load_run``: a path, a run id under
profiles/, or ``latest``); its stacks are ``stacks.folded`` (perf and py-spy runs), its
unit the ``stacks.parquet`` table's, its modules the ``functions.parquet`` table's, and
the rest of the facts come from ``provenance.json`` exactly as written (nothing filled
in from this machine). A path to a file is read as folded stacks, or as ``perf script``
text (:func:`profkit.parse.load_stacks` tells them apart).
"""
from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profkit import paths
from profkit.errors import NoStackCounts
from profkit.export.model import ExportError, ProfileFacts
from profkit.parse import detect_stack_format
from profkit.parse.folded import read_folded
from profkit.parse.perf_script import fold_perf_script
from profkit.rundir import LATEST, load_run, resolve

STACKS_FILE = "stacks.folded"
STACKS_TABLE = "stacks.parquet"
FUNCTIONS_TABLE = "functions.parquet"


@dataclass(frozen=True)
class ExportSource:
    """Stacks to export and their facts; ``folded_bytes``: the run's own stacks.folded."""

    counts: dict[str, float]
    facts: ProfileFacts
    origin: str
    folded_bytes: bytes | None = None
    comments: tuple[str, ...] = field(default_factory=tuple)

    def require_stacks(self) -> ExportSource:
        """*self*, or :class:`NoStackCounts` when no stack has a count above 0: what the
        front doors (``profkit export``, ``%profkit_export``) refuse before writing, where
        an empty profile would be written with success and nothing said."""
        NoStackCounts.unless_any(self.counts, self.origin, "export")
        return self


def _ns(iso: Any) -> int | None:
    """UTC nanoseconds since the epoch of an ISO-8601 time with offset (None if absent
    or without an offset: a local time of an unknown zone is no instant)."""
    if not iso:
        return None
    try:
        t = _dt.datetime.fromisoformat(str(iso))
    except ValueError:
        return None
    if t.tzinfo is None:
        return None
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f > 0 else None


def load_source(source: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
                ) -> ExportSource:
    """A run (directory, id under profiles/ or ``latest``) or a stacks file, with facts."""
    p = Path(source)
    if p.is_file() or (p.suffix in (".folded", ".txt", ".gz") and not p.is_dir()):
        return _from_file(p)

    if str(source) == LATEST and not p.exists():
        return _from_run(load_run(newest_with_stacks(root)))
    where = resolve(source, root)
    if not where.is_dir():
        raise ExportError(f"{source}: no such file or run: give a folded-stacks file, a run "
                          f"directory, a run id under {where.parent} or 'latest'")
    return _from_run(load_run(source, root=root))


def newest_with_stacks(root: str | os.PathLike[str] | None = None) -> Path:
    """The newest run under profiles/ (or *root*) that holds stacks: run ids start with
    their start time, so the greatest name is the newest. ``profiles/latest`` itself
    may point at a run without stacks (a benchmark)."""

    base = Path(root) if root is not None else paths.profiles_dir()
    runs = sorted((d for d in base.iterdir() if d.is_dir() and not d.is_symlink()
                   and (d / STACKS_FILE).is_file()), key=lambda d: d.name) \
        if base.is_dir() else []
    if not runs:
        raise ExportError(f"no run with stacks under {base}: record one (profkit perf, "
                          "profkit import, profkit py-spy) or give a run directory or a "
                          "folded-stacks file")
    return runs[-1]


def _from_file(p: Path) -> ExportSource:

    if not p.exists():
        raise ExportError(f"{p}: no such file: give a folded-stacks file, a run directory "
                          "or a run id under profiles/")
    if detect_stack_format(p) == "folded":
        counts = read_folded(p)
        facts = ProfileFacts(name=p.name, root_is_process=True)
    else:
        # profkit's own reading of perf script text, as its collectors fold it: one per
        # sample, vDSO frames named, each frame's module as perf printed it

        fold = fold_perf_script(p, weight="samples", vdso_names=True)
        counts = dict(fold.counts)
        facts = ProfileFacts(name=p.name, tool="perf", unit=fold.unit,
                             modules=dict(fold.modules), root_is_process=True)
    return ExportSource(counts, facts, str(p),
                        comments=(f"profkit export of {p.name}",))


def _from_run(rd: Any) -> ExportSource:
    f = rd.file(STACKS_FILE)
    if not f.is_file():
        kind = rd.kind or "unknown kind"
        raise ExportError(
            f"run {rd.run_id} ({kind}) holds no stacks ({STACKS_FILE} is missing): export "
            "a perf or py-spy run (profkit perf, profkit import, profkit py-spy), or a "
            "folded-stacks file")

    data = f.read_bytes()
    counts = read_folded(f)
    prov = rd.provenance
    tool = str(prov.get("tool") or prov.get("kind") or "")
    unit = "samples"
    if rd.file(STACKS_TABLE).is_file():
        import pandas as pd

        units = pd.read_parquet(rd.file(STACKS_TABLE), columns=["unit"])["unit"]
        found = {str(u) for u in units.dropna().unique()}
        if len(found) == 1:
            unit = found.pop()
    modules: dict[str, str] = {}
    if rd.file(FUNCTIONS_TABLE).is_file():
        import pandas as pd

        fn = pd.read_parquet(rd.file(FUNCTIONS_TABLE))
        name_col = "frame" if "frame" in fn.columns else "function"
        if "module" in fn.columns:
            modules = {str(n): str(m) for n, m in zip(fn[name_col], fn["module"], strict=True)
                       if isinstance(m, str) and m}
    freq = _num(rd.get("perf.freq")) or _num(rd.get("capture.freq"))
    started = _ns(rd.get("capture.started_at")) or _ns(prov.get("started_at"))
    seconds = _num(prov.get("recording_seconds"))
    duration = round(seconds * 1e9) if seconds else None
    if duration is None:
        a, b = _ns(rd.get("capture.started_at")), _ns(rd.get("capture.ended_at"))
        duration = b - a if a and b and b > a else None
    build = str(prov.get("build_name") or rd.get("build.build") or "")
    binary = str(rd.get("perf.binary") or rd.get("build.postgres") or "")
    facts = ProfileFacts(
        build=build, mode=str(prov.get("mode") or ""), tool=tool, unit=unit,
        freq_hz=freq, started_ns=started, duration_ns=duration, binary=binary,
        modules=modules, root_is_process=tool != "py-spy", name=rd.run_id)
    what = " ".join(str(x) for x in (prov.get("workload"), prov.get("query_name"))
                    if x)
    comments = (f"profkit run {rd.run_id}" + (f": {what}" if what else ""),
                *((f"recorded with {prov['tool_summary']}",) if prov.get("tool_summary")
                  else ()))
    return ExportSource(counts, facts, str(rd.path), folded_bytes=data, comments=comments)
