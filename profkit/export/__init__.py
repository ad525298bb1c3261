"""Exports the profiling ecosystem reads: pprof, speedscope, collapsed (folded) stacks.

The library's front door is :func:`export_stacks`, a pure function — folded stacks in,
the file's bytes out::

    from profkit.export import ProfileFacts, export_stacks
    data = export_stacks(stacks_df, "pprof", ProfileFacts(freq_hz=999, binary=postgres))

:func:`export_run` does the same for a run directory, a run id under profiles/ or a
folded-stacks file, taking the facts (build, mode, frequency, start, binary, modules)
from the run's provenance and tables (:mod:`profkit.export.source`). The ``profkit
export`` command and the ``%profkit_export`` magic call it.

- ``pprof``: gzipped profile.proto (:mod:`profkit.export.pprof`), read by ``go tool
  pprof``, Grafana Pyroscope and Parca;
- ``speedscope``: speedscope's JSON file format (:mod:`profkit.export.speedscope`);
- ``collapsed``: FlameGraph's folded text, byte for byte what profkit writes as
  ``stacks.folded`` (:func:`profkit.parse.folded.format_folded`).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

from profkit.export.pprof import to_pprof
from profkit.export.source import ExportSource, load_source
from profkit.export.speedscope import to_speedscope
from profkit.parse.folded import format_folded
from profkit.export.model import (
    EXECUTOR_NODES,
    ExportError,
    ProfileFacts,
    StackProfile,
    StacksInput,
    plan_node_of,
    profiles_of,
)

Format = Literal["pprof", "speedscope", "collapsed"]
FORMATS: tuple[str, ...] = ("pprof", "speedscope", "collapsed")
#: the file name suffix of each format
SUFFIXES: dict[str, str] = {"pprof": ".pb.gz", "speedscope": ".speedscope.json",
                            "collapsed": ".folded"}

__all__ = ["EXECUTOR_NODES", "FORMATS", "SUFFIXES", "ExportError", "ProfileFacts",
           "StackProfile", "export_run", "export_stacks", "plan_node_of", "profiles_of",
           "to_collapsed"]


def to_collapsed(profiles: Sequence[StackProfile]) -> bytes:
    """Folded text, sorted bytewise, as profkit writes ``stacks.folded`` (one profile:
    the format has no room for a second one's labels)."""

    if len(profiles) != 1:
        names = ", ".join(p.facts.title for p in profiles) or "none"
        raise ExportError(f"collapsed stacks hold one profile; these stacks hold "
                          f"{len(profiles)} ({names}): select one build/mode, or export "
                          "pprof or speedscope, which label each")
    return format_folded(profiles[0].counts()).encode("utf-8", "surrogateescape")


def export_stacks(stacks: StacksInput, fmt: str, facts: ProfileFacts | None = None, *,
                  comments: Sequence[str] = ()) -> bytes:
    """Folded stacks → the bytes of a *fmt* file (``pprof``, ``speedscope``, ``collapsed``).

    *stacks*: a ``stacks`` table (one profile per build/tool/unit[/mode]; optional
    ``mode`` and ``plan_node`` columns), a ``{stack: weight}`` mapping, or
    :class:`StackProfile` objects. *facts*: what the table does not say (frequency,
    start, binary, module map...). Pure: reads and writes no file.
    """
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}")
    profiles = profiles_of(stacks, facts, plan_nodes=fmt == "pprof")
    if fmt == "collapsed":
        return to_collapsed(profiles)
    if fmt == "speedscope":

        return to_speedscope(profiles)

    return to_pprof(profiles, comments=comments)


def export_run(source: str | os.PathLike[str] | ExportSource
               | Sequence[str | os.PathLike[str] | ExportSource], fmt: str, *,
               unit: str | None = None, freq_hz: float | None = None,
               binary: str | None = None) -> bytes:
    """Export a run directory, a run id under profiles/, ``latest``, or a folded-stacks
    (or ``perf script``) file — or several: one pprof file whose samples are labelled
    with each run's build and mode, or one speedscope file with a profile per run.
    *unit*, *freq_hz*, *binary* override what the runs say (a bare folded file says none
    of them)."""

    many = not isinstance(source, str | os.PathLike | ExportSource)
    given = list(source) if many else [source]  # type: ignore[list-item, arg-type]
    if not given:
        raise ExportError("nothing to export: give at least one run or stacks file")
    srcs = [s if isinstance(s, ExportSource) else load_source(s) for s in given]
    if fmt == "collapsed" and len(srcs) == 1 and srcs[0].folded_bytes is not None:
        return srcs[0].folded_bytes  # the run's own stacks.folded, byte for byte
    profiles = [StackProfile(s.facts.with_overrides(unit=unit, freq_hz=freq_hz, binary=binary),
                             {(k, ""): float(v) for k, v in s.counts.items()}) for s in srcs]
    comments = [c for s in srcs for c in s.comments]
    return export_stacks(profiles, fmt, comments=comments)
