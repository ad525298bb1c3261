"""Folded stacks → pprof: a gzipped ``perftools.profiles.Profile`` (google/pprof's
proto/profile.proto), which ``go tool pprof``, Grafana Pyroscope and Parca read.

What is written:

- ``sample_type``: the weight's unit — ``samples/count`` for sampled stacks, plus
  ``cpu/nanoseconds`` (= samples × 10⁹ / frequency) when the sampling frequency is known,
  as Go's CPU profiles do; ``instructions/count`` for callgrind's; ``<event>/count`` (or
  ``cpu/nanoseconds`` for the clock events) for perf's summed periods; ``<unit>/count``
  otherwise. ``period_type``/``period``: ``cpu/nanoseconds`` and 10⁹/frequency where
  the frequency is known;
- one ``Function`` per distinct frame (``name``: the frame as the flamegraph shows it;
  ``system_name``: the symbol without stackcollapse's ``_[k]``-style annotation;
  ``filename``/``start_line`` for py-spy frames), one ``Location`` per frame with one
  ``Line``, and one ``Mapping`` per module (the profiler's module of each frame, a
  ``[postgres]``-style annotation, else the build's binary; mapping 1 is the binary);
- one ``Sample`` per distinct stack (and plan node), leaf first, labelled ``build``,
  ``mode``, ``tool``, ``run`` (the run id or file name) and ``plan_node`` where known;
- ``time_nanos``/``duration_nanos`` where the run recorded them, and comments saying
  where the profile came from and how CPU time was derived.

pprof's values are 64-bit integers: stacks with fractional weights are refused rather
than rounded. All profiles passed share one ``sample_type`` (their units must agree);
their samples differ by label.
"""
from __future__ import annotations

import gzip
from collections.abc import Sequence

from profkit.export.model import ExportError, Frame, StackProfile, describe_frame
from profkit.export.protobuf import Message

# perf events whose periods are nanoseconds of CPU time
CLOCK_EVENTS = frozenset({"cpu-clock", "task-clock"})
_I64 = (1 << 63) - 1


class _Strings:
    def __init__(self) -> None:
        self.index: dict[str, int] = {"": 0}
        self.table: list[str] = [""]

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.table)
            self.table.append(s)
        return i


def sample_types(p: StackProfile) -> tuple[list[tuple[str, str]], int | None]:
    """``[(type, unit)...]`` and the period in nanoseconds (None: no CPU-time column)."""
    f = p.facts
    unit = f.unit or "samples"
    if unit == "samples":
        if f.freq_hz and f.freq_hz > 0:
            return [("samples", "count"), ("cpu", "nanoseconds")], round(1e9 / f.freq_hz)
        return [("samples", "count")], None
    if unit == "instructions":
        return [("instructions", "count")], None
    if unit == "period":
        if f.event in CLOCK_EVENTS:
            return [("cpu", "nanoseconds")], None
        return [(f.event or "period", "count")], None
    if unit in ("ns", "nanoseconds"):
        return [("cpu", "nanoseconds")], None
    return [(unit, "count")], None


def _integer(w: float, stack: str) -> int:
    if w != int(w) or w > _I64:
        raise ExportError(
            f"pprof holds integer values: stack {stack[:80]!r} weighs {w!r}. Export the "
            "stacks unscaled (sample counts, periods or instructions), or use --format "
            "speedscope, which keeps fractions")
    return int(w)


def to_pprof(profiles: Sequence[StackProfile], *, comments: Sequence[str] = (),
             compress: bool = True) -> bytes:
    """The pprof file of *profiles* (gzipped profile.proto; ``compress=False``: the raw
    message). Empty profiles give a valid profile without samples."""
    if not profiles:
        raise ExportError("nothing to export: no profile given")
    types, period = sample_types(profiles[0])
    for p in profiles[1:]:
        t2, per2 = sample_types(p)
        if t2 != types or per2 != period:
            raise ExportError(
                f"one pprof file holds one kind of value: {profiles[0].facts.title} counts "
                f"{types}, {p.facts.title} counts {t2}: export them separately")
    st = _Strings()
    prof = Message()
    for t, u in types:
        prof.message(1, Message().int_(1, st(t)).int_(2, st(u)))

    mappings: dict[str, int] = {}
    binary = profiles[0].facts.binary
    if binary:
        mappings[binary] = 1
    functions: dict[tuple[str, str, str, int], int] = {}
    locations: dict[tuple[str, str], int] = {}
    loc_msgs: list[Message] = []
    fn_msgs: list[Message] = []

    def location(fr: Frame) -> int:
        key = (fr.name, fr.module)
        lid = locations.get(key)
        if lid is not None:
            return lid
        fkey = (fr.name, fr.system_name, fr.file, fr.line)
        fid = functions.get(fkey)
        if fid is None:
            fid = functions[fkey] = len(functions) + 1
            fn_msgs.append(Message().int_(1, fid).int_(2, st(fr.name))
                           .int_(3, st(fr.system_name)).int_(4, st(fr.file))
                           .int_(5, fr.line))
        mid = 0
        if fr.module:
            mid = mappings.setdefault(fr.module, len(mappings) + 1)
        lid = locations[key] = len(locations) + 1
        loc_msgs.append(Message().int_(1, lid).int_(2, mid)
                        .message(4, Message().int_(1, fid).int_(2, fr.line)))
        return lid

    samples: list[Message] = []
    for p in profiles:
        f = p.facts
        frame_cache: dict[tuple[str, bool], int] = {}
        base_labels = [(k, v) for k, v in (("build", f.build), ("mode", f.mode),
                                           ("tool", f.tool), ("run", f.name)) if v]
        for (stack, node), w in sorted(p.weights.items()):
            n = _integer(w, stack)
            frames = stack.split(";")
            ids = []
            for i, name in enumerate(frames):
                ck = (name, i == 0)
                lid = frame_cache.get(ck)
                if lid is None:
                    lid = frame_cache[ck] = location(describe_frame(name, f, is_root=i == 0))
                ids.append(lid)
            ids.reverse()  # leaf first
            values = [n] if period is None else [n, n * period]
            if any(v > _I64 for v in values):
                raise ExportError(f"stack {stack[:80]!r}: {values[-1]} overflows pprof's "
                                  "64-bit values")
            s = Message().packed(1, ids).packed(2, values)
            for k, v in [*base_labels, *((("plan_node", node),) if node else ())]:
                s.message(3, Message().int_(1, st(k)).int_(2, st(v)))
            samples.append(s)
    prof.messages(2, samples)
    for path, mid in sorted(mappings.items(), key=lambda kv: kv[1]):
        prof.message(3, Message().int_(1, mid).int_(5, st(path)).bool_(7, True))
    prof.messages(4, loc_msgs)
    prof.messages(5, fn_msgs)

    f0 = profiles[0].facts
    notes = list(comments)
    if period is not None:
        notes.append(f"cpu nanoseconds = samples x {period} ns (sampled at "
                     f"{f0.freq_hz:g} Hz)")
    note_ids = [st(c) for c in notes]
    # the string table is complete once every index above is taken; the profile's own
    # fields below only reuse strings or add the period type's
    ptype = Message().int_(1, st("cpu")).int_(2, st("nanoseconds")) if period else None
    default = st(types[-1][0]) if len(types) > 1 else 0
    prof.repeated_string(6, st.table)
    starts = [p.facts.started_ns for p in profiles if p.facts.started_ns]
    prof.int_(9, min(starts) if starts else 0)
    if len(profiles) == 1:  # several recordings have no one duration
        prof.int_(10, f0.duration_ns or 0)
    if ptype is not None:
        prof.message(11, ptype)
        prof.int_(12, period or 0)
    prof.packed(13, note_ids)
    prof.int_(14, default)
    raw = prof.bytes()
    return gzip.compress(raw, mtime=0) if compress else raw
