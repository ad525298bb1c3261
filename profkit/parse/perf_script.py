"""``perf script`` text → folded stacks, streaming.

Producer: ``perf record -g ...`` then ``perf script -i perf.data`` (default fields, or
any ``-F`` set that includes ``comm`` and ``pid``/``tid`` or ``time``). Example::

    postgres 28954   525.733319:    1001001 cpu-clock:ppp:
    \t            b46 __vdso_clock_gettime+0x56 ([vdso])
    \t          cf439 clock_gettime@@GLIBC_2.17+0x19 (/usr/lib/x86_64-linux-gnu/libc.so.6)
    \t         2f1b0c InstrStartNode+0x2c (/usr/local/pgsql/bin/postgres)

becomes the folded line (stackcollapse-perf.pl's default format: the process name as
root frame, frames root→leaf, one line per distinct stack, the sample count)::

    postgres;InstrStartNode;clock_gettime@@GLIBC_2.17;__vdso_clock_gettime 1

Frame names: the symbol without its ``+0x..`` offset (``;`` becomes ``:``); a frame perf
could not symbolise, ``[unknown] (/path/to/libfoo.so)``, is named after its module,
``[libfoo.so]``; ``[unknown] ([unknown])`` stays ``[unknown]``. The module of every name
is kept for the ``functions`` table.

**vDSO frames.** clock_gettime's fast path runs in the vDSO, an ELF image the kernel maps
into every process. ``perf script`` names its symbols only if it finds the image:
``perf record`` copies it into the build-id cache (``~/.debug/[vdso]/<build-id>/vdso``),
so on the recording machine, as the recording user, perf prints
``__vdso_clock_gettime+0x56 ([vdso])`` (seen on this machine, perf 6.1, kernel 6.18).
Elsewhere — another user, another machine, a cleared cache — it prints
``b46 [unknown] ([vdso])``. Such frames are resolved here when a vDSO image is given
(``vdso=`` a path to the image, or a :class:`VdsoSymbols`): the address perf prints in a
callchain line is relative to the mapping, the image is linked at 0, so the address is
looked up directly among the image's ELF symbols (pyelftools; ``__vdso_``-prefixed
aliases preferred, as perf does). :func:`dump_vdso` saves the running kernel's image
(read from ``/proc/self/mem`` at the ``[vdso]`` range of ``/proc/self/maps``) so a
collector can keep it beside ``perf.data``; :meth:`VdsoSymbols.from_running_kernel` uses
it directly (valid only for text recorded under the same kernel). Without an image, or
for an address outside it (samples printed without a callchain carry absolute
addresses), the frame is named ``[vdso]``, which the instrumentation family includes.

Speed: lines are read as bytes and each distinct frame line is parsed once (a dict from
the raw line to its name); a sample is counted under the tuple of its frame names, and
the ``;``-joined strings are built only for distinct stacks at the end. Memory is
bounded by the number of distinct frame lines and stacks, not by the input size.
"""
from __future__ import annotations

import io
import os
import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd

from profkit.errors import ParseError
from profkit.parse.folded import (
    Source,
    format_folded,
    functions_table,
    open_lines,
    stacks_table,
    write_folded,
)

# comm (may contain spaces) pid[/tid] [cpu] time: period event: [ip sym (dso)]
_HEADER_PID = re.compile(
    rb"^\s*(?P<comm>\S.*?)\s+(?P<pid>\d+)(?:/(?P<tid>\d+))?(?=\s|$)"
    rb"(?:\s+\[(?P<cpu>\d+)\])?"
    rb"(?:\s+(?P<time>\d+\.\d+):)?"
    rb"(?:\s+(?P<period>\d+))?"
    rb"(?:\s+(?P<event>[^\s\d][^\s]*?):(?=\s|$))?"
    rb"(?P<rest>.*?)\s*$"
)
# comm [cpu] time: ...   (``-F`` without pid and tid)
_HEADER_TIME = re.compile(
    rb"^\s*(?P<comm>\S.*?)(?:\s+\[(?P<cpu>\d+)\])?\s+(?P<time>\d+\.\d+):"
    rb"(?:\s+(?P<period>\d+))?"
    rb"(?:\s+(?P<event>[^\s\d][^\s]*?):(?=\s|$))?"
    rb"(?P<rest>.*?)\s*$"
)
_HEX = frozenset("0123456789abcdefABCDEF")
_VDSO = "[vdso]"


# --------------------------------------------------------------------------- vDSO

@dataclass(frozen=True)
class VdsoSymbols:
    """Function symbols of one vDSO image: sorted ``starts``, parallel ``ends``/``names``."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    names: tuple[str, ...]
    size: int
    build_id: str = ""

    @classmethod
    def from_image(cls, image: bytes | str | os.PathLike[str]) -> VdsoSymbols:
        """Read the symbols of a vDSO image (bytes, or a file such as perf's
        ``~/.debug/[vdso]/<build-id>/vdso`` or one written by :func:`dump_vdso`)."""
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile

        if isinstance(image, bytes):
            data = image
        else:
            try:
                data = Path(image).read_bytes()
            except OSError as e:
                raise ParseError(f"cannot read vDSO image {image}: {e.strerror}") from None
        try:
            elf = ELFFile(io.BytesIO(data))
            by_addr: dict[int, tuple[int, str]] = {}
            for sec in elf.iter_sections():
                if sec.header["sh_type"] not in ("SHT_DYNSYM", "SHT_SYMTAB"):
                    continue
                for sym in sec.iter_symbols():
                    if sym["st_info"]["type"] != "STT_FUNC" or not sym["st_value"]:
                        continue
                    addr, size, name = sym["st_value"], sym["st_size"], sym.name
                    old = by_addr.get(addr)
                    # aliases share an address (clock_gettime, __vdso_clock_gettime):
                    # keep the __vdso_ one, which is the name perf itself prints
                    if old is None or (name.startswith("__vdso_")
                                       and not old[1].startswith("__vdso_")):
                        by_addr[addr] = (size, name)
            build_id = ""
            for sec in elf.iter_sections():
                if sec.header["sh_type"] == "SHT_NOTE":
                    for note in sec.iter_notes():
                        if note["n_type"] == "NT_GNU_BUILD_ID":
                            build_id = str(note["n_desc"])
        except ELFError as e:
            raise ParseError(f"not a vDSO ELF image: {e}") from None
        if not by_addr:
            raise ParseError("the vDSO image has no function symbols")
        starts = sorted(by_addr)
        return cls(starts=tuple(starts),
                   ends=tuple(s + max(by_addr[s][0], 1) for s in starts),
                   names=tuple(by_addr[s][1] for s in starts),
                   size=len(data), build_id=build_id)

    @classmethod
    def from_running_kernel(cls) -> VdsoSymbols:
        """The symbols of this process's vDSO (the running kernel's)."""
        return cls.from_image(read_vdso_image())

    def lookup(self, addr: int) -> str | None:
        """The function containing *addr* (relative to the image), or None."""
        i = bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.ends[i]:
            return self.names[i]
        return None


def read_vdso_image() -> bytes:
    """The bytes of this process's vDSO mapping (``[vdso]`` in /proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="ascii") as f:
            for line in f:
                if line.rstrip().endswith("[vdso]"):
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    break
            else:
                raise ParseError("this process has no [vdso] mapping (not Linux?)")
        with open("/proc/self/mem", "rb") as mem:
            mem.seek(lo)
            return mem.read(hi - lo)
    except OSError as e:
        raise ParseError(f"cannot read this process's vDSO: {e.strerror}") from None


def dump_vdso(dest: str | os.PathLike[str]) -> Path:
    """Write the running kernel's vDSO image to *dest* (for :class:`VdsoSymbols`)."""
    path = Path(dest)
    path.write_bytes(read_vdso_image())
    return path


# --------------------------------------------------------------------------- result

@dataclass(frozen=True)
class PerfFolding:
    """Folded stacks of one ``perf script`` text.

    ``counts``: folded stack → samples (or summed period with ``weight="period"``);
    ``modules``: frame name → DSO path as perf printed it; ``samples``: samples counted;
    ``skipped``: samples of other events (``event=`` filter); ``events``: event names
    seen; ``lines``/``bytes``: input size read.
    """

    counts: dict[str, float]
    modules: Mapping[str, str]
    samples: int
    skipped: int = 0
    events: tuple[str, ...] = ()
    lines: int = 0
    bytes: int = 0
    unit: str = "samples"
    meta: Mapping[str, str] = field(default_factory=dict)

    def folded_text(self) -> str:
        return format_folded(self.counts)

    def write_folded(self, dest: str | os.PathLike[str] | io.TextIOBase) -> None:
        write_folded(self.counts, dest)  # type: ignore[arg-type]

    def stacks_df(self, *, run_id: str = "", build: str = "", tool: str = "perf"
                  ) -> pd.DataFrame:
        return stacks_table(self.counts, run_id=run_id, build=build, tool=tool, unit=self.unit)

    def functions_df(self, *, run_id: str = "", build: str = "", tool: str = "perf"
                     ) -> pd.DataFrame:
        return functions_table(self.counts, modules=self.modules, root_is_process=True,
                               run_id=run_id, build=build, tool=tool)


# --------------------------------------------------------------------------- parsing

def _frame(text: str, lineno: int, vdso: VdsoSymbols | None) -> tuple[str, str]:
    """Parse ``ADDR SYMBOL[+0xOFF] [(DSO)]`` into (name, module)."""
    addr_s, _, rest = text.strip().partition(" ")
    if not addr_s or not _HEX.issuperset(addr_s):
        raise ParseError(f"perf script, line {lineno}: expected a callchain frame "
                         f"'ADDRESS SYMBOL (DSO)', got {text.strip()[:120]!r}")
    rest = rest.strip()
    dso = ""
    if rest.endswith(")"):
        i = rest.rfind(" (")
        if i >= 0:
            dso = rest[i + 2:-1]
            rest = rest[:i].rstrip()
        elif rest.startswith("("):  # no symbol printed, only "(dso)"
            dso, rest = rest[1:-1], ""
    sym = rest
    i = sym.rfind("+0x")
    if i > 0 and _HEX.issuperset(sym[i + 3:]):
        sym = sym[:i]
    if not sym or sym == "[unknown]":
        if dso == _VDSO:
            name = (vdso.lookup(int(addr_s, 16)) if vdso is not None else None) or _VDSO
        elif dso and dso != "[unknown]":
            base = os.path.basename(dso.rstrip("/")) or dso
            name = base if (base.startswith("[") and base.endswith("]")) else f"[{base}]"
        else:
            name = "[unknown]"
    else:
        name = sym.replace(";", ":")
    return name, dso


def fold_perf_script(
    source: Source,
    *,
    vdso: VdsoSymbols | str | os.PathLike[str] | bytes | None = None,
    event: str | None = None,
    weight: Literal["samples", "period"] = "samples",
    include_pid: bool = False,
    include_tid: bool = False,
    strict: bool = True,
) -> PerfFolding:
    """Fold a ``perf script`` text (path, binary/text file object, or lines) streaming.

    ``vdso``: a vDSO image to name ``[unknown] ([vdso])`` frames (see the module doc).
    ``event``: count only samples of this event (``cpu-clock``; a ``:ppp`` modifier is
    ignored), the others are counted in ``skipped``. ``weight="period"``: add each
    sample's period instead of 1 (needs the period field). ``include_pid``/``include_tid``:
    root frame ``comm-pid`` / ``comm-pid/tid`` like perf's stackcollapse options.
    ``strict``: a text that ends mid-line or inside a sample (no closing blank line) is
    truncated and raises :class:`ParseError`; with ``strict=False`` the incomplete last
    sample is dropped instead. Garbled lines always raise, naming the line number.
    An empty input gives an empty folding.
    """
    vsyms: VdsoSymbols | None
    if vdso is None or isinstance(vdso, VdsoSymbols):
        vsyms = vdso
    else:
        vsyms = VdsoSymbols.from_image(vdso)
    want_event = event.split(":")[0] if event else None
    by_period = weight == "period"
    if weight not in ("samples", "period"):
        raise ParseError(f"weight must be 'samples' or 'period', not {weight!r}")

    lines, to_close = open_lines(source)
    names: dict[bytes | str, str] = {}       # raw frame line -> frame name
    modules: dict[str, str] = {}
    counts: dict[tuple[str, ...], float] = {}
    events: dict[str, None] = {}
    frames: list[str] = []
    in_sample = False        # after a callchain header, until the blank line
    keep = True              # this sample passes the event filter
    w = 1.0
    comm = ""
    samples = skipped = 0
    nbytes = 0
    # Line numbers without counting in the hot loop: lines that took the slow path
    # (headers, blank lines, new frame lines of the current sample are in `frames`) plus
    # the frame lines of finished samples.
    slow = hot = 0
    sample_line = 0
    line: bytes | str = b"\n"

    def orphan(name: str) -> None:
        # stands in for frames.append between samples: a known frame line, no header
        raise ParseError(f"perf script, line {slow + hot + 1}: a callchain frame outside a "
                         "sample (expected a sample header line before it)")

    get = names.get
    app = orphan
    try:
        for line in lines:
            # hot path: a frame line seen before (most lines of a real profile)
            name = get(line)
            if name is not None:
                app(name)
                continue
            lineno = slow + hot + len(frames) + 1
            if in_sample:
                if line[:1] in (b"\t", b" ", "\t", " ") and line.strip():
                    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
                    name, dso = _frame(text, lineno, vsyms)
                    names[line] = name
                    modules.setdefault(name, dso)
                    frames.append(name)
                    continue
                # the blank line (or, leniently, the next header) ends the sample
                in_sample = False
                app = orphan
                hot += len(frames)
                if keep:
                    frames.append(comm)
                    key = tuple(frames)
                    counts[key] = counts.get(key, 0.0) + w
                    samples += 1
                else:
                    skipped += 1
                frames = []
            slow += 1
            if not line.strip():
                continue
            bline = line if isinstance(line, bytes) else line.encode("utf-8", "surrogateescape")
            if bline[:1] == b"#":  # perf script --header
                continue
            m = _HEADER_PID.match(bline) or _HEADER_TIME.match(bline)
            if m is None:
                if bline.startswith(b"PERFILE"):
                    raise ParseError("this is a perf.data file, not `perf script` text: run "
                                     "`perf script -i FILE > FILE.txt` and parse the text")
                raise ParseError(
                    f"perf script, line {lineno}: expected a sample header 'COMM PID[/TID] "
                    f"[CPU] TIME: [PERIOD] EVENT:' or a callchain frame, got "
                    f"{bline.strip()[:120].decode('utf-8', 'replace')!r} (is this `perf "
                    f"script` output? custom -F fields must include comm and pid/tid or time)")
            rest = m["rest"].strip()
            if rest.startswith(b"PERF_RECORD_"):  # --show-*-events side-band lines
                continue
            ev = (m["event"] or b"").decode("utf-8", "replace")
            if ev and ev not in events:
                events[ev] = None
            keep = want_event is None or ev.split(":")[0] == want_event
            if by_period:
                if m["period"] is None:
                    raise ParseError(f"perf script, line {lineno}: weight='period' needs the "
                                     "period field (perf script -F +period)")
                w = float(m["period"])
            comm = m["comm"].decode("utf-8", "replace").replace(" ", "_").replace(";", ":")
            if include_pid and m["pid"]:
                comm += "-" + m["pid"].decode()
                if include_tid and m["tid"]:
                    comm += "/" + m["tid"].decode()
            if rest:
                # a sample printed without callchain: its one frame is on the header line
                name, dso = _frame(rest.decode("utf-8", "replace"), lineno, vsyms)
                modules.setdefault(name, dso)
                if keep:
                    key = (name, comm)
                    counts[key] = counts.get(key, 0.0) + w
                    samples += 1
                else:
                    skipped += 1
            else:
                in_sample = True
                sample_line = lineno
                app = frames.append
        if to_close is not None:
            try:
                nbytes = to_close.tell()
            except (OSError, ValueError):  # pipes, text-mode iteration
                nbytes = 0
    finally:
        if to_close is not None:
            to_close.close()

    lineno = slow + hot + len(frames)
    ends_mid_line = lineno > 0 and not (line.endswith(b"\n") if isinstance(line, bytes)
                                        else line.endswith("\n"))
    if in_sample or ends_mid_line:
        if strict:
            where = (f"line {lineno} ends without a newline" if ends_mid_line else
                     f"the sample starting at line {sample_line} has no closing blank line")
            raise ParseError(
                f"perf script text is truncated: {where} (each sample's callchain ends with "
                f"an empty line). Regenerate it with `perf script -i perf.data`, or pass "
                f"strict=False to drop the incomplete sample.")
        if in_sample:
            skipped += 1
    folded: dict[str, float] = {}
    for key, c in counts.items():
        s = ";".join(reversed(key))
        folded[s] = folded.get(s, 0.0) + c
    return PerfFolding(counts=folded, modules=modules, samples=samples, skipped=skipped,
                       events=tuple(events), lines=lineno, bytes=nbytes,
                       unit="period" if by_period else "samples")


def parse_perf_script(source: Source, *, run_id: str = "", build: str = "",
                      **kwargs: object) -> pd.DataFrame:
    """``perf script`` text → the ``stacks`` table (see :func:`fold_perf_script`)."""
    fold = fold_perf_script(source, **kwargs)  # type: ignore[arg-type]
    return fold.stacks_df(run_id=run_id, build=build)


def iter_lines(text: str | bytes) -> Iterable[bytes]:
    """Lines of an in-memory perf script text, as bytes (tests, notebooks)."""
    data = text.encode() if isinstance(text, str) else text
    return io.BytesIO(data)
