"""Folded stacks → speedscope's JSON file format (jlfwong/speedscope,
src/lib/file-format-spec.ts): one ``sampled`` profile per build/mode, frames shared.

Each distinct stack is one sample (frame indices root first) whose weight is the
stack's weight: speedscope's flamegraph ("Left Heavy") and sandwich views sum them.
``unit`` is ``none`` for counts (samples, instructions): speedscope has no count unit,
and a count shown as time would be a claim the recording did not make;
``nanoseconds`` where the weights are CPU nanoseconds (perf's clock-event periods).
"""
from __future__ import annotations

import json
from collections.abc import Sequence

from profkit.export.model import ExportError, StackProfile, describe_frame
from profkit.export.pprof import CLOCK_EVENTS

SCHEMA = "https://www.speedscope.app/file-format-schema.json"
#: the file format version written (speedscope's own exporter writes its package version;
#: the format has been unchanged since the "name"/"activeProfileIndex" fields of 0.6.0)
FORMAT_VERSION = "0.6.0"


def _unit(p: StackProfile) -> str:
    f = p.facts
    if f.unit in ("ns", "nanoseconds") or (f.unit == "period" and f.event in CLOCK_EVENTS):
        return "nanoseconds"
    return "none"


def to_speedscope(profiles: Sequence[StackProfile], *, name: str = "",
                  exporter: str = "profkit") -> bytes:
    """The speedscope file (UTF-8 JSON) of *profiles*."""
    if not profiles:
        raise ExportError("nothing to export: no profile given")
    frames: list[dict[str, object]] = []
    index: dict[str, int] = {}
    out_profiles = []
    for p in profiles:
        samples: list[list[int]] = []
        weights: list[float] = []
        for stack, w in sorted(p.counts().items()):
            ids = []
            for i, fname in enumerate(stack.split(";")):
                fi = index.get(fname)
                if fi is None:
                    fr = describe_frame(fname, p.facts, is_root=i == 0)
                    entry: dict[str, object] = {"name": fname}
                    if fr.file:
                        entry["file"] = fr.file
                        if fr.line:
                            entry["line"] = fr.line
                    fi = index[fname] = len(frames)
                    frames.append(entry)
                ids.append(fi)
            samples.append(ids)
            weights.append(int(w) if float(w).is_integer() else float(w))
        out_profiles.append({
            "type": "sampled", "name": p.facts.title, "unit": _unit(p),
            "startValue": 0, "endValue": sum(weights),
            "samples": samples, "weights": weights,
        })
    doc = {
        "$schema": SCHEMA, "version": FORMAT_VERSION, "exporter": exporter,
        "name": name or profiles[0].facts.name or profiles[0].facts.title,
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": out_profiles,
    }
    return (json.dumps(doc, ensure_ascii=False, separators=(",", ":"),
                       allow_nan=False) + "\n").encode("utf-8", "backslashreplace")
