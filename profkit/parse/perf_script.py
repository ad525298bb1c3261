"""``perf script`` text → folded stacks, streaming: a drop-in for FlameGraph's
``stackcollapse-perf.pl``.

Producer: ``perf record -g ...`` then ``perf script -i perf.data``. Example::

    postgres 28954   525.733319:    1001001 cpu-clock:ppp:
    \t            b46 __vdso_clock_gettime+0x56 ([vdso])
    \t          cf439 clock_gettime@@GLIBC_2.17+0x19 (/usr/lib/x86_64-linux-gnu/libc.so.6)
    \t         2f1b0c InstrStartNode+0x2c (/usr/local/pgsql/bin/postgres)

becomes (the process name as root frame, frames root→leaf, one line per distinct stack,
its weight)::

    postgres;InstrStartNode;clock_gettime@@GLIBC_2.17;__vdso_clock_gettime 1001001

**Default: exactly what stackcollapse-perf.pl prints** (FlameGraph, checked against its
own regression suite and run as an oracle on PostgreSQL captures, tests/test_perf_compat.py).
Its rules, which the default follows to the byte:

- a sample weighs its *period* when the header ends ``PERIOD EVENT:``, else 1;
- only samples of the first event seen count (``event_filter=`` picks another);
- a frame's name is its symbol without ``+0x..``, cut at the first ``(`` (except
  ``(anonymous namespace)`` and Go's ``pkg.(*T).M``), quotes dropped, ``;`` → ``:``; an
  unsymbolised frame is named after its module, ``[unknown] ([vdso])`` → ``[[vdso]]``,
  ``[unknown] (/lib/libc.so.6)`` → ``[libc.so.6]``, ``[unknown] ([unknown])`` →
  ``[unknown]``; ``a->b`` (perf's inline chains) become two frames, the second ``_[i]``;
  Java frames lose their leading ``L`` when the process name starts with ``java`` (not
  with ``--pid``/``--tid``: there FlameGraph's recorded results keep it, while the
  script at the suite's commit strips it and fails its own test.sh on those 8 cases);
- a sample is counted when its blank line is read: a last sample without one (a text
  cut short) is dropped; lines it does not recognise are skipped (and counted in
  ``PerfFolding.unrecognized``, where the Perl script warns);
- output sorted bytewise, counts summed as Perl does (integers; past 2**64, a float
  printed ``%.15g``).

stackcollapse-perf.pl's options, same meaning: ``pid``, ``tid``, ``kernel`` (``_[k]``),
``jit`` (``_[j]``), ``all``, ``addrs`` (``[module <addr>]``), ``event_filter`` and
``inline`` (with ``context``): un-inline through ``addr2line``, one ``addr2line`` process
per module fed every address at once (the Perl script starts one per frame; either way
it costs seconds to minutes on a large profile, and the binaries must be the recorded
ones); ``srcline``: the text is ``perf script -F+srcline`` output, and the line after
each frame (``  file.c:12``) is added to its name (``leaf:file.c:12``) as the Perl script
reads it: one line per name of the frame, none from an ``[unknown] ([unknown])`` on,
``[...]`` parts dropped (``inline`` and ``srcline`` run in the Python implementation).

**profkit's options** (used by its own collectors, :mod:`profkit.collect.perf`):

- ``weight="samples"``: every sample counts 1 (``unit`` ``samples``), not its period;
- ``vdso=`` an image (or ``vdso_names=True``): clock_gettime's fast path runs in the
  vDSO; ``perf script`` names its symbols only if it finds the image (its build-id
  cache). Elsewhere it prints ``b46 [unknown] ([vdso])``. With the image saved at record
  time (:func:`dump_vdso`) the address is looked up among its ELF symbols
  (``__vdso_clock_gettime``); unresolved vDSO frames are called ``[vdso]``, which the
  instrumentation family includes;
- ``strict=True``: a text cut short (no final newline, a last sample without its blank
  line), a line that is neither header nor frame, two frame lines joined into one, a
  header without a numeric pid, a frame outside a sample, a missing blank line between
  samples all raise :class:`~profkit.errors.ParseError` naming the line, where the Perl
  script guesses.

Whatever the options, a line longer than 1 MB, or a perf.data file given instead of its
text, raises :class:`~profkit.errors.ParseError` (the Perl script would print garbage).

**Speed.** The folding runs in a C extension (``profkit/_fold.c``, built by pip from
source), streaming 1 MB chunks: a frame line seen before is looked up, not parsed again,
and a sample made of such lines is counted by their ids, so no Python object is made per
line or per sample, only per distinct stack at the end. ``profkit-stackcollapse-perf``
(:mod:`profkit.stackcollapse`) drives it without importing this module. This module's
pure-Python :class:`_PyFolder` is the reference implementation (no regular expressions:
the Perl patterns are emulated with linear scans, including their backtracking's
choices), tested to agree with the C core byte for byte (tests/test_perf_compat.py).
``implementation="python"`` forces it; ``inline=True`` always uses it. Memory is bounded
by the distinct stacks, not the input size. Symbol bytes stay bytes (names are decoded
with ``surrogateescape`` and written back unchanged), so non-UTF-8 names never merge.
"""
from __future__ import annotations

import io
import os
import re
import sys
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from profkit.errors import ParseError
from profkit.parse.folded import (
    Source,
    format_folded,
    functions_table,
    stacks_table,
    write_folded,
)

if TYPE_CHECKING:
    import pandas as pd

try:  # the compiled core (see _fold.c); the pure-Python reference below is the fallback
    from profkit import _fold  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - a checkout without `pip install -e .`
    _fold = None

MAX_LINE = 1 << 20          # bytes; a longer line is not perf script output
CHUNK = 1 << 20
UV_MAX = (1 << 64) - 1      # Perl's largest unsigned integer; sums beyond become floats
_VDSO = "[vdso]"

# Perl's \s and \w on byte strings (no locale, no utf8): ASCII only
_WS = frozenset(b" \t\n\x0b\x0c\r")
_WORD = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_DIGIT = frozenset(b"0123456789")
_HEXCH = frozenset(b"0123456789abcdefABCDEF")
_LOWHEX = frozenset(b"0123456789abcdef")


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

    ``counts``: folded stack → weight (period sum, or samples with ``weight="samples"``;
    ``int``, a ``float`` only past 2**64 as in Perl); ``modules``: frame name → DSO as
    perf printed it; ``samples``: samples counted; ``skipped``: samples of other events;
    ``events``: event names seen, first first; ``lines``/``bytes``: input read;
    ``unrecognized``: lines neither header nor frame (skipped, as the Perl script does),
    ``first_unrecognized``: (line number, text) of the first of them.
    """

    counts: dict[str, int | float]
    modules: Mapping[str, str]
    samples: int
    skipped: int = 0
    events: tuple[str, ...] = ()
    lines: int = 0
    bytes: int = 0
    unit: str = "samples"
    unrecognized: int = 0
    first_unrecognized: tuple[int, str] | None = None
    meta: Mapping[str, str] = field(default_factory=dict)

    def folded_text(self) -> str:
        """The folded text, sorted bytewise like stackcollapse-perf.pl's ``sort``."""
        return format_folded(self.counts)

    def folded_bytes(self) -> bytes:
        """:meth:`folded_text` as the bytes the Perl script prints (names undecoded)."""
        return self.folded_text().encode("utf-8", "surrogateescape")

    def write_folded(self, dest: str | os.PathLike[str] | io.TextIOBase) -> None:
        write_folded(self.counts, dest)  # type: ignore[arg-type]

    def stacks_df(self, *, run_id: str = "", build: str = "", tool: str = "perf"
                  ) -> pd.DataFrame:
        return stacks_table(self.counts, run_id=run_id, build=build, tool=tool, unit=self.unit)

    def functions_df(self, *, run_id: str = "", build: str = "", tool: str = "perf"
                     ) -> pd.DataFrame:
        return functions_table(self.counts, modules=self.modules, root_is_process=True,
                               run_id=run_id, build=build, tool=tool)


@dataclass(frozen=True)
class FoldOptions:
    """What :func:`fold_perf_script` does; see the module docstring."""

    pid: bool = False
    tid: bool = False
    kernel: bool = False
    jit: bool = False
    addrs: bool = False
    event_filter: str | None = None
    inline: bool = False
    context: bool = False
    weight: Literal["period", "samples"] = "period"
    vdso_names: bool = False
    strict: bool = False
    srcline: bool = False


# --------------------------------------------------------------------------- errors

_EXPECT = {
    "long_line": "a line of at most 1 MB (perf script lines are short: is this a binary or a "
                 "minified file?)",
    "perf_data": "`perf script` text, got a perf.data file: run `perf script -i FILE > "
                 "FILE.txt` and fold the text",
    "unrecognized": "a sample header 'COMM PID[/TID] [CPU] TIME: [PERIOD] EVENT:', a "
                    "callchain frame '\\tADDRESS SYMBOL (DSO)' or a blank line",
    "header": "a sample header 'COMM PID[/TID] [CPU] [TIME:] [PERIOD] [EVENT:]' with a numeric "
              "PID and nothing after the event (samples need callchains: perf record -g)",
    "frame": "one callchain frame 'ADDRESS SYMBOL (DSO)': a hex address, and nothing after "
             "the DSO's ')' (two frame lines joined into one?)",
    "frame_outside": "a sample header before this callchain frame",
    "no_blank": "a blank line ending the previous sample before this header",
    "midline": "a newline at the end of the last line (the text is truncated)",
    "open_sample": "a blank line closing the last sample (the text is truncated)",
}


def _error(kind: str, lineno: int, text: bytes, name: str) -> ParseError:
    got = text[:120].decode("utf-8", "backslashreplace")
    what = _EXPECT.get(kind, kind)
    msg = f"{name}, line {lineno}: expected {what}"
    if kind not in ("long_line", "perf_data", "midline", "open_sample"):
        msg += f", got {got!r}"
    if kind in ("midline", "open_sample"):
        msg += ("; regenerate it with `perf script -i perf.data`, or fold it without "
                "strict=True (--strict) to drop the incomplete sample as "
                "stackcollapse-perf.pl does")
    if kind == "unrecognized" and _SRCLINE_LIKE.fullmatch(text):
        msg += ("; this looks like a source line of `perf script -F+srcline`: fold with "
                "srcline=True (--srcline)")
    return ParseError(msg)


# what perf script -F+srcline prints under a frame: "  file.c:12", "  libc.so.6[2724a]"
_SRCLINE_LIKE = re.compile(rb"\s+\S+(?::\d+|\[[0-9a-fx]+\])(?: \(discriminator \d+\))?\s*")


class _FoldError(Exception):
    def __init__(self, kind: str, lineno: int, text: bytes) -> None:
        super().__init__(kind)
        self.kind, self.lineno, self.text = kind, lineno, text


# --------------------------------------------------------------------------- Perl patterns

def _header(s: bytes) -> tuple[int, bytes, bytes | None] | None:
    """``/^(\\S.+?)\\s+(\\d+)\\/*(\\d+)*\\s+/``: (end of comm, pid digits, tid digits or None).

    The lazy comm is the shortest prefix (2 chars at least) followed by whitespace, a
    number, optional ``/`` and number, whitespace. One pass: a whitespace run that fails
    fails for each of its positions, so it is skipped whole."""
    n = len(s)
    if n < 2 or s[0] in _WS:
        return None
    k = 2 if s[1] not in _WS else 1
    while k < n:
        if s[k] not in _WS:
            k += 1
            continue
        start = k
        while k < n and s[k] in _WS:
            k += 1
        if start < 2:            # the run began at index 1: the comm still ends at >= 2
            start = 2
            if start >= k:       # pragma: no cover - k > start always here
                continue
        p = k
        while p < n and s[p] in _DIGIT:
            p += 1
        if p == k:
            continue
        q = p
        while q < n and s[q] == 0x2F:  # '/'
            q += 1
        r = q
        while r < n and s[r] in _DIGIT:
            r += 1
        if r < n and s[r] in _WS:
            return start, s[k:p], (s[q:r] if r > q else None)
        k = p if p > k else k + 1
    return None


def _event(s: bytes) -> tuple[bytes | None, bytes] | None:
    """``/:\\s*(\\d+)*\\s+(\\S+):\\s*$/``: (period digits or None, event) or None."""
    end = len(s)
    while end > 0 and s[end - 1] in _WS:
        end -= 1
    if end < 2 or s[end - 1] != 0x3A:  # ':'
        return None
    t = end - 1
    while t > 0 and s[t - 1] not in _WS:
        t -= 1
    if t == 0 or end - 1 - t < 1:
        return None
    w1 = t
    while w1 > 0 and s[w1 - 1] in _WS:
        w1 -= 1
    d = w1
    while d > 0 and s[d - 1] in _DIGIT:
        d -= 1
    w0 = d
    while w0 > 0 and s[w0 - 1] in _WS:
        w0 -= 1
    if d < w1:   # a digit run between two whitespace runs (the first may be empty)
        if w0 == 0 or s[w0 - 1] != 0x3A:
            return None
        return s[d:w1], s[t:end - 1]
    # no digits: the colon ends the whitespace run before the event
    if w1 == 0 or s[w1 - 1] != 0x3A:
        return None
    return None, s[t:end - 1]


def _frame_parts(s: bytes) -> tuple[bytes, bytes, bytes, int, int, int] | None:
    """``/^\\s*(\\w+)\\s*(.+) \\((.*)\\)/``: (pc, rawfunc, mod, end of \\w+ run, start of
    rawfunc, position of the last ')')."""
    n = len(s)
    i0 = 0
    while i0 < n and s[i0] in _WS:
        i0 += 1
    j = i0
    while j < n and s[j] in _WORD:
        j += 1
    if j == i0:
        return None
    k = j
    while k < n and s[k] in _WS:
        k += 1
    close = s.rfind(b")")
    if close < 0:
        return None
    e = s.rfind(b" (", 0, close)
    if e < 0:
        return None
    t = min(k, e - 1)
    if t < i0 + 1:
        return None
    return s[i0:min(t, j)], s[t:e], s[e + 2:close], j, t, close


def _perl_split_arrow(s: bytes) -> list[bytes]:
    """``split /->/, $s``: trailing empty fields dropped (so "" → [])."""
    parts = s.split(b"->")
    while parts and not parts[-1]:
        parts.pop()
    return parts


_BRACKETED = re.compile(rb"\[.*?\]")
_PERL_SPACE = b" \t\n\r\x0b\x0c"


def _is_go_method(f: bytes) -> bool:
    """``m/\\.\\(.*\\)\\./``."""
    a = f.find(b".(")
    return a >= 0 and f.rfind(b").") >= a + 2


def _cut_paren(f: bytes) -> bytes:
    """``s/\\((?!anonymous namespace\\)).*//``."""
    p = f.find(b"(")
    while p >= 0:
        if not f.startswith(b"anonymous namespace)", p + 1):
            return f[:p]
        p = f.find(b"(", p + 1)
    return f


def _is_jit_map(mod: bytes) -> bool:
    """``m:/tmp/perf-\\d+\\.map:``."""
    p = mod.find(b"/tmp/perf-")
    while p >= 0:
        q = p + 10
        r = q
        while r < len(mod) and mod[r] in _DIGIT:
            r += 1
        if r > q and mod.startswith(b".map", r):
            return True
        p = mod.find(b"/tmp/perf-", p + 1)
    return False


def _inline_candidate(mod: bytes) -> bool:
    r"""``$mod !~ m/(perf-\d+.map|kernel\.|\[[^\]]+\])/``."""
    if b"kernel." in mod:
        return False
    p = mod.find(b"[")
    while p >= 0:
        if mod.find(b"]", p + 1) > p + 1:
            return False
        p = mod.find(b"[", p + 1)
    p = mod.find(b"perf-")
    while p >= 0:
        q = r = p + 5
        while r < len(mod) and mod[r] in _DIGIT:
            r += 1
        # \d+ then any character then "map": the any-character is the last digit or
        # the one after the digits
        if r > q and ((r - q >= 2 and mod.startswith(b"map", r))
                      or (r < len(mod) and mod.startswith(b"map", r + 1))):
            return False
        p = mod.find(b"perf-", p + 1)
    return True


def _period_value(d: bytes | None) -> int | float:
    """``$period = $1; $period = 1 if not $period`` — Perl's numification of digits."""
    if d is None or d == b"" or d == b"0":
        return 1
    v = int(d)
    return v if v <= UV_MAX else float(v)


def _perl_add(a: int | float, b: int | float) -> int | float:
    # Perl's pp_add: unsigned integers while the sum fits, else doubles added
    if isinstance(a, int) and isinstance(b, int) and a + b <= UV_MAX:
        return a + b
    return float(a) + float(b)


# --------------------------------------------------------------------------- reference

class _PyFolder:
    """stackcollapse-perf.pl's main loop, line by line (the pure-Python reference)."""

    def __init__(self, opts: FoldOptions, vdso: VdsoSymbols | None,
                 inline: Callable[[bytes, bytes, bytes], bytes] | None = None,
                 want_modules: bool = True) -> None:
        self.o = opts
        self.vdso = vdso
        self.inline = inline
        self.want_modules = want_modules
        self.collapsed: dict[bytes, int | float] = {}
        self.modules: dict[bytes, bytes] = {}
        self.events: dict[bytes, None] = {}
        self.event_filter = opts.event_filter.encode("utf-8", "surrogateescape") \
            if opts.event_filter else b""
        self.defaulted = False
        self.filter_warning: bytes | None = None
        self.stack: list[bytes] = []
        self.pname: bytes | None = None
        self.period: int | float = 1
        self.samples = self.skipped = 0
        self.lineno = 0
        self.unrecognized = 0
        self.first_unrecognized: tuple[int, bytes] | None = None
        self.in_sample = False          # strict: header seen, blank line not yet
        self.sample_line = 0
        self.last_newline = True
        self.nbytes = 0
        self.names: dict[tuple[bytes, bool], tuple[list[bytes], bytes, int] | None] = {}
        # --srcline: a frame's names waiting for their source lines, how many take one,
        # its module; and how many have had theirs
        self.pending: tuple[list[bytes], int, bytes] | None = None
        self.pending_done = 0

    # -- one line (with its "\n", except maybe the last)
    def line(self, raw: bytes) -> None:
        self.lineno += 1
        self.nbytes += len(raw)
        strict = self.o.strict
        if raw.endswith(b"\n"):
            s = raw[:-1]
            self.last_newline = True
        else:
            s = raw
            self.last_newline = False
        if self.pending is not None:
            self._srcline(s)
            return
        if self.lineno == 1 and s.startswith(b"PERFILE"):
            raise _FoldError("perf_data", 1, s[:16])
        if len(s) > MAX_LINE:
            raise _FoldError("long_line", self.lineno, s[:120])
        if strict and not self.last_newline:
            raise _FoldError("midline", self.lineno, b"")
        if s[:1] == b"#":
            return
        if not s:
            self.in_sample = False
            if self.pname is None:
                return
            self.stack.insert(0, self.pname)
            key = b";".join(self.stack)
            w = self.period if self.o.weight == "period" else 1
            old = self.collapsed.get(key)
            self.collapsed[key] = w if old is None else _perl_add(old, w)
            self.samples += 1
            self.stack = []
            self.pname = None
            return
        h = _header(s)
        if h is not None:
            if strict:
                if self.in_sample:
                    raise _FoldError("no_blank", self.lineno, s)
                self._check_header(s, h)
                self.in_sample = True
                self.sample_line = self.lineno
            comm_end, pid_d, tid_d = h
            comm = s[:comm_end]
            if tid_d is None:
                tid, pid = pid_d, b"?"
            else:
                tid, pid = tid_d, pid_d
            ev = _event(s)
            period_d: bytes | None = None
            if ev is not None:
                period_d, event = ev
                if event not in self.events:
                    self.events[event] = None
                if self.event_filter == b"":
                    self.event_filter = event
                    self.defaulted = True
                elif event != self.event_filter:
                    if self.defaulted and self.filter_warning is None:
                        self.filter_warning = event
                    self.skipped += 1
                    return
            self.period = _period_value(period_d)
            if self.o.tid:
                pname = comm + b"-" + pid + b"/" + tid
            elif self.o.pid:
                pname = comm + b"-" + pid
            else:
                pname = comm
            self.pname = pname.replace(b" ", b"_")
            return
        parts = _frame_parts(s)
        if parts is not None:
            if strict:
                if not self.in_sample:
                    raise _FoldError("frame_outside", self.lineno, s)
                pc, rawfunc, _mod, j, t, close = parts
                if (t < j or not _HEXCH.issuperset(pc) or b"\t" in rawfunc
                        or s[close + 1:].strip(b" \t\x0b\x0c\r")):
                    raise _FoldError("frame", self.lineno, s)
            if self.pname is None:
                return
            # Java frames lose their "L" for a process named java* -- but not under --pid /
            # --tid, where FlameGraph's recorded results keep it (the script once tested
            # `$pname eq "java"`, which "java-PID" never equals; see tests/test_perf_compat)
            java = self.pname.startswith(b"java") and not (self.o.pid or self.o.tid)
            key = (s, java)
            got = self.names.get(key)
            if got is None and key not in self.names:
                got = self._frame(parts[0], parts[1], parts[2], java)
                if len(self.names) < 200_000:
                    self.names[key] = got
            if got is None:
                return
            names, mod, reads = got
            if self.o.srcline and reads:
                # the Perl script reads the line after the frame as each name's source
                # line ("file.c:12"), up to the first unknown one, whatever that line is
                self.pending = (list(names), reads, mod)
                self.pending_done = 0
                return
            self._push(names, mod)
            return
        if strict:
            raise _FoldError("unrecognized", self.lineno, s)
        self.unrecognized += 1
        if self.first_unrecognized is None:
            self.first_unrecognized = (self.lineno, s[:200])

    def _push(self, names: list[bytes], mod: bytes) -> None:
        if self.want_modules:
            for nm in names:
                self.modules.setdefault(nm, mod)
        self.stack[0:0] = names

    def _srcline(self, s: bytes) -> None:
        """--srcline: *s* is the source line of the next pending name: its [...] parts
        dropped, trimmed, appended as ":file.c:12" unless nothing is left."""
        assert self.pending is not None
        names, n, mod = self.pending
        src = _BRACKETED.sub(b"", s).strip(_PERL_SPACE)
        if src:
            names[self.pending_done] += b":" + src
        self.pending_done += 1
        if self.pending_done == n:
            self.pending = None
            self._push(names, mod)

    def _check_header(self, s: bytes, h: tuple[int, bytes, bytes | None]) -> None:
        """strict: COMM PID[/TID] then only [CPU], TIME:, PERIOD, EVENT: in that order."""
        comm_end = h[0]
        comm_last = s[:comm_end].split()[-1] if s[:comm_end].split() else b""
        if _is_time(comm_last) or _is_cpu(comm_last):
            raise _FoldError("header", self.lineno, s)
        p = comm_end
        while p < len(s) and s[p] in _WS:
            p += 1
        while p < len(s) and s[p] not in _WS:   # PID[/TID]
            p += 1
        toks = s[p:].split()
        stage = 0
        for tok in toks:
            if stage <= 0 and _is_cpu(tok):
                stage = 1
            elif stage <= 1 and _is_time(tok):
                stage = 2
            elif stage <= 2 and tok.isdigit():
                stage = 3
            elif stage <= 3 and tok.endswith(b":") and len(tok) > 1 and tok[0] not in _DIGIT:
                stage = 4
            else:
                raise _FoldError("header", self.lineno, s)
        if h[1] and not h[1].isdigit():  # pragma: no cover - the scan only takes digits
            raise _FoldError("header", self.lineno, s)

    def _frame(self, pc: bytes, rawfunc: bytes, mod: bytes, java: bool
               ) -> tuple[list[bytes], bytes, int] | None:
        """The frame's names, its module and how many of the names take a source line
        under --srcline (none after an unknown one, none for addr2line's)."""
        o = self.o
        if self.inline is not None and _inline_candidate(mod):
            res = self.inline(pc, rawfunc, mod)
            if res not in (b"", b"??", b"??:??:0"):
                return [res], mod, 0
        i = rawfunc.rfind(b"+0x")
        if i >= 0 and i + 3 < len(rawfunc) and _LOWHEX.issuperset(rawfunc[i + 3:]):
            rawfunc = rawfunc[:i]
        if rawfunc[:1] == b"(":
            return None
        out: list[bytes] = []
        reads = -1
        for func in _perl_split_arrow(rawfunc):
            if func == b"[unknown]":
                if self.vdso is not None and mod == b"[vdso]":
                    nm = self.vdso.lookup(int(pc, 16)) if _HEXCH.issuperset(pc) else None
                    func = (nm or _VDSO).encode()
                elif o.vdso_names and mod == b"[vdso]":
                    func = b"[vdso]"
                else:
                    if mod != b"[unknown]":
                        func = mod[mod.rfind(b"/") + 1:]
                    else:
                        func = b"unknown"
                        if reads < 0:
                            reads = len(out)
                    func = b"[" + func + b" <" + pc + b">]" if o.addrs else b"[" + func + b"]"
            func = func.replace(b";", b":")
            if not _is_go_method(func):
                func = _cut_paren(func)
            func = func.replace(b'"', b"").replace(b"'", b"")
            if java and func[:1] == b"L" and b"/" in func:
                func = func[1:]
            if out:
                if b"_[i]" not in func:
                    func += b"_[i]"
            elif o.kernel and (mod[:1] == b"[" or mod.endswith(b"vmlinux")) \
                    and b"unknown" not in mod:
                func += b"_[k]"
            elif o.jit and _is_jit_map(mod):
                if b"_[j]" not in func:
                    func += b"_[j]"
            out.append(func)
        return out, mod, len(out) if reads < 0 else reads

    def finish(self) -> None:
        if self.o.strict:
            if self.lineno and not self.last_newline:
                raise _FoldError("midline", self.lineno, b"")
            if self.in_sample and self.pname is not None:
                raise _FoldError("open_sample", self.sample_line, b"")


def _is_time(tok: bytes) -> bool:
    if not tok.endswith(b":"):
        return False
    a, dot, b = tok[:-1].partition(b".")
    return bool(dot) and a.isdigit() and b.isdigit()


def _is_cpu(tok: bytes) -> bool:
    return len(tok) > 2 and tok[:1] == b"[" and tok[-1:] == b"]" and tok[1:-1].isdigit()


# --------------------------------------------------------------------------- --inline

class _Addr2Line:
    """stackcollapse-perf.pl's ``inline()``: ``addr2line -a PC -e MOD -i -f -s -C`` with
    its ``nm`` fallback, but one addr2line process per module for all its addresses
    (collected in a first pass), not one per frame."""

    def __init__(self, context: bool) -> None:
        import shutil

        if shutil.which("addr2line") is None:
            raise ParseError("inline=True needs addr2line (binutils): apt-get install binutils")
        self.context = context
        self.cache: dict[tuple[bytes, bytes], bytes] = {}
        self.first_raw: dict[tuple[bytes, bytes], bytes] = {}
        self.nm: dict[bytes, dict[bytes, int]] = {}

    def want(self, pc: bytes, rawfunc: bytes, mod: bytes) -> None:
        self.first_raw.setdefault((pc, mod), rawfunc)

    def _run(self, mod: bytes, pcs: list[bytes]) -> dict[bytes, list[bytes]]:
        """addr2line's output lines after the address line, per pc."""
        import subprocess

        path = os.fsdecode(mod)
        try:
            cp = subprocess.run(["addr2line", "-a", "-e", path, "-i", "-f", "-s", "-C"],
                                input=b"".join(p + b"\n" for p in pcs), capture_output=True,
                                timeout=3600, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return {}
        out: dict[bytes, list[bytes]] = {}
        lines = cp.stdout.split(b"\n")
        i = 0
        for pc in pcs:
            if i >= len(lines) or not lines[i].startswith(b"0x"):
                break
            i += 1
            block: list[bytes] = []
            while i < len(lines) and not (lines[i].startswith(b"0x") and len(lines[i]) == 18
                                          and _HEXCH.issuperset(lines[i][2:])):
                if lines[i] or i < len(lines) - 1:
                    block.append(lines[i])
                i += 1
            out[pc] = block
        return out

    @staticmethod
    def _unknown(block: list[bytes]) -> bool:
        return any(block[k] == b"??" and block[k + 1].startswith(b"??:0")
                   for k in range(len(block) - 1))

    def _result(self, block: list[bytes]) -> bytes:
        full: list[bytes] = []
        one = b""
        for ln in block:
            i = ln.find(b" (discriminator ")
            if i >= 0:
                j = ln.find(b")", i)
                k = i + len(b" (discriminator ")
                if j > k and not any(c in _WS for c in ln[k:j]):
                    ln = ln[:i] + ln[j + 1:]
            if one == b"":
                one = ln
            else:
                full.insert(0, one + b":" + ln if self.context else one)
                one = b""
        return b";".join(full)

    def resolve(self) -> None:
        by_mod: dict[bytes, list[bytes]] = {}
        for (pc, mod) in self.first_raw:
            by_mod.setdefault(mod, []).append(pc)
        for mod, pcs in by_mod.items():
            blocks = self._run(mod, pcs)
            retry: dict[bytes, bytes] = {}
            for pc in pcs:
                block = blocks.get(pc, [])
                raw = self.first_raw[(pc, mod)]
                if self._unknown(block):
                    i = raw.rfind(b"+0x")
                    if i > 0 and raw[i + 3:] and _LOWHEX.issuperset(raw[i + 3:]):
                        base = self._nm(mod).get(raw[:i])
                        if base is not None:
                            retry[pc] = b"0x%x" % (base + int(raw[i + 3:], 16))
                            continue
                self.cache[(pc, mod)] = self._result(block)
            if retry:
                again = self._run(mod, sorted(set(retry.values())))
                for pc, new in retry.items():
                    self.cache[(pc, mod)] = self._result(again.get(new, []))

    def _nm(self, mod: bytes) -> dict[bytes, int]:
        if mod not in self.nm:
            import subprocess

            table: dict[bytes, int] = {}
            try:
                cp = subprocess.run(["nm", os.fsdecode(mod)], capture_output=True,
                                    timeout=600, check=False)
                for ln in cp.stdout.split(b"\n"):
                    parts = ln.split(b" ", 2)
                    if (len(parts) == 3 and parts[0] and _LOWHEX.issuperset(parts[0])
                            and len(parts[1]) == 1):
                        table.setdefault(parts[2], int(parts[0], 16))
            except (OSError, subprocess.TimeoutExpired):
                pass
            self.nm[mod] = table
        return self.nm[mod]

    def __call__(self, pc: bytes, rawfunc: bytes, mod: bytes) -> bytes:
        return self.cache.get((pc, mod), b"")


# --------------------------------------------------------------------------- driver

def _source_name(source: Any) -> str:
    if isinstance(source, str | os.PathLike):
        return f"perf script text {os.fspath(source)}"
    name = getattr(source, "name", None)
    if isinstance(name, str) and name not in ("<stdin>",) and not name.startswith("<"):
        return f"perf script text {name}"
    if source is getattr(sys.stdin, "buffer", None) or source is sys.stdin:
        return "perf script text on stdin"
    return "perf script text"


def _open(source: Source) -> tuple[Any, Any]:
    """(binary file or None, iterable of lines or None); a path opens binary (.gz too)."""
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        try:
            if path.suffix == ".gz":
                import gzip
                return gzip.open(path, "rb"), None
            return open(path, "rb", buffering=CHUNK), None  # noqa: SIM115 - closed by caller
        except OSError as e:
            raise ParseError(f"cannot read {path}: {e.strerror}") from None
    if isinstance(source, io.TextIOBase):
        buf = getattr(source, "buffer", None)
        return (buf, None) if buf is not None else (None, source)
    if hasattr(source, "readinto") or (hasattr(source, "read") and not isinstance(
            source, Iterable)):
        return source, None
    if hasattr(source, "read") and isinstance(getattr(source, "mode", "b"), str) \
            and "b" in getattr(source, "mode", "b"):
        return source, None
    return None, source


def _chunks(f: Any) -> Iterable[bytes]:
    read = f.read
    while True:
        b = read(CHUNK)
        if not b:
            return
        if isinstance(b, str):
            b = b.encode("utf-8", "surrogateescape")
        yield b


def _lines_of(f: Any, it: Any) -> Iterable[bytes]:
    """Lines (bytes, with their newline) from a file or an iterable, at most MAX_LINE+1
    bytes each (a longer one is cut, and then refused by the folder)."""
    if f is not None:
        readline = f.readline
        while True:
            ln = readline(MAX_LINE + 2)
            if not ln:
                return
            yield ln if isinstance(ln, bytes) else ln.encode("utf-8", "surrogateescape")
    else:
        for ln in it:
            yield ln if isinstance(ln, bytes) else ln.encode("utf-8", "surrogateescape")


def _split_lines(chunks: Iterable[bytes]) -> Iterable[bytes]:
    """Chunks (of any size, e.g. lines from an iterable) → lines."""
    carry = b""
    for c in chunks:
        if carry:
            c = carry + c
            carry = b""
        start = 0
        while True:
            i = c.find(b"\n", start)
            if i < 0:
                break
            yield c[start:i + 1]
            start = i + 1
        carry = c[start:]
        if len(carry) > MAX_LINE + 1:
            yield carry        # the folder refuses it with the line's number
            carry = b""
    if carry:
        yield carry


def _decode(d: dict[bytes, Any]) -> dict[str, Any]:
    return {k.decode("utf-8", "surrogateescape"): v for k, v in d.items()}


def fold_perf_script(
    source: Source,
    *,
    pid: bool = False,
    tid: bool = False,
    kernel: bool = False,
    jit: bool = False,
    all: bool = False,  # noqa: A002 - stackcollapse-perf.pl's --all
    addrs: bool = False,
    event_filter: str | None = None,
    inline: bool = False,
    context: bool = False,
    srcline: bool = False,
    weight: Literal["period", "samples"] = "period",
    vdso: VdsoSymbols | str | os.PathLike[str] | bytes | None = None,
    vdso_names: bool = False,
    strict: bool = False,
    implementation: Literal["auto", "c", "python"] = "auto",
    warn: Callable[[str], None] | None = None,
) -> PerfFolding:
    """Fold ``perf script`` text (a path, ``.gz`` too; a binary or text file object;
    an iterable of lines), streaming. With no options: stackcollapse-perf.pl's output.

    Options named like the Perl script's have its meaning (``all`` = ``kernel`` +
    ``jit``); ``weight``, ``vdso``/``vdso_names`` and ``strict`` are profkit's (module
    docstring). ``implementation``: ``"c"`` (the compiled core; an error if it is not
    built), ``"python"`` (the reference), ``"auto"`` (C when built and ``inline`` and
    ``srcline`` are off). ``srcline``: the text is ``perf script -F+srcline`` output, whose
    line after each frame ("  file.c:12") is appended to the frame's name, as the Perl
    script's ``--srcline`` does.
    ``warn``: called with the Perl script's stderr notes (event filtering, lines skipped).
    An empty input gives an empty folding. Errors: :class:`~profkit.errors.ParseError`
    naming the file, the line and what was expected.
    """
    if weight not in ("period", "samples"):
        raise ParseError(f"weight must be 'period' or 'samples', not {weight!r}")
    if implementation not in ("auto", "c", "python"):
        raise ParseError(f"implementation must be 'auto', 'c' or 'python', not "
                         f"{implementation!r}")
    context = context and inline   # as in the Perl script, --context only adds to --inline
    vsyms: VdsoSymbols | None
    if vdso is None or isinstance(vdso, VdsoSymbols):
        vsyms = vdso
    else:
        vsyms = VdsoSymbols.from_image(vdso)
    opts = FoldOptions(pid=pid, tid=tid, kernel=kernel or all, jit=jit or all, addrs=addrs,
                       event_filter=event_filter or None, inline=inline, context=context,
                       weight=weight, vdso_names=vdso_names or vsyms is not None,
                       strict=strict, srcline=srcline)
    use_c = implementation == "c" or (implementation == "auto" and _fold is not None
                                       and not inline and not srcline)
    if use_c and _fold is None:
        raise ParseError("the compiled folding core (profkit._fold) is not built: "
                         "reinstall profkit with `pip install -e .` (needs a C compiler and "
                         "python3-dev), or pass implementation='python'")
    if use_c and (inline or srcline):
        raise ParseError(f"{'inline' if inline else 'srcline'}=True runs in the Python "
                         f"implementation only")
    name = _source_name(source)
    f, it = _open(source)
    close = f if isinstance(source, str | os.PathLike) else None
    spool = None
    try:
        if inline:
            # two passes: collect every (address, module), resolve them per module, fold
            if f is None or not getattr(f, "seekable", lambda: False)():
                import tempfile

                spool = tempfile.TemporaryFile()
                for ln in _lines_of(f, it):
                    spool.write(ln)
                spool.seek(0)
                f, it = spool, None
            a2l = _Addr2Line(context)
            for ln in _lines_of(f, None):
                s = ln.rstrip(b"\n")
                if len(s) <= MAX_LINE and _header(s) is None:
                    parts = _frame_parts(s)
                    if parts is not None and _inline_candidate(parts[2]):
                        a2l.want(parts[0], parts[1], parts[2])
            a2l.resolve()
            f.seek(0)
            folder = _PyFolder(opts, vsyms, inline=a2l)
            result = _run_py(folder, _lines_of(f, None))
        elif use_c:
            result = _run_c(opts, vsyms, f, it)
        else:
            result = _run_py(_PyFolder(opts, vsyms), _lines_of(f, it) if f is not None
                             else _split_lines(_lines_of(None, it)))
    except _FoldError as e:
        raise _error(e.kind, e.lineno, e.text, name) from None
    finally:
        if close is not None:
            close.close()
        if spool is not None:
            spool.close()
    counts, modules, stats = result
    if warn is not None:
        if stats["filter_warning"] is not None:
            # (sic: the Perl script names the event it filters *out*)
            fw = stats["filter_warning"]
            warn(f"Filtering for events of type: {fw.decode('utf-8', 'surrogateescape')}")
        if stats["unrecognized"]:
            ln, text = stats["first_unrecognized"]
            warn(f"{stats['unrecognized']} unrecognized line(s) skipped, as "
                 f"stackcollapse-perf.pl does (first: line {ln}: "
                 f"{text[:100].decode('utf-8', 'backslashreplace')!r})")
    first = stats["first_unrecognized"]
    return PerfFolding(
        counts=_decode(counts),
        modules={k.decode("utf-8", "surrogateescape"): v.decode("utf-8", "surrogateescape")
                 for k, v in modules.items()}, samples=stats["samples"],
        skipped=stats["skipped"],
        events=tuple(e.decode("utf-8", "surrogateescape") for e in stats["events"]),
        lines=stats["lines"], bytes=stats["bytes"],
        unit="samples" if weight == "samples" else "period",
        unrecognized=stats["unrecognized"],
        first_unrecognized=(first[0], first[1].decode("utf-8", "surrogateescape"))
        if first else None)


def _run_py(folder: _PyFolder, lines: Iterable[bytes]
            ) -> tuple[dict[bytes, Any], dict[bytes, bytes], dict[str, Any]]:
    for ln in lines:
        folder.line(ln)
    folder.finish()
    return folder.collapsed, folder.modules, {
        "samples": folder.samples, "skipped": folder.skipped, "events": list(folder.events),
        "lines": folder.lineno, "bytes": folder.nbytes, "unrecognized": folder.unrecognized,
        "first_unrecognized": folder.first_unrecognized,
        "filter_warning": folder.filter_warning, "event_filter": folder.event_filter
        .decode("utf-8", "surrogateescape")}


def _run_c(opts: FoldOptions, vsyms: VdsoSymbols | None, f: Any, it: Any
           ) -> tuple[dict[bytes, Any], dict[bytes, bytes], dict[str, Any]]:
    assert _fold is not None
    lookup = None
    if vsyms is not None:
        def lookup(pc: bytes) -> bytes | None:
            nm = vsyms.lookup(int(pc, 16)) if _HEXCH.issuperset(pc) and pc else None
            return nm.encode() if nm else None
    folder = _fold.Folder(
        pid=opts.pid, tid=opts.tid, kernel=opts.kernel, jit=opts.jit, addrs=opts.addrs,
        event_filter=(opts.event_filter or "").encode("utf-8", "surrogateescape"),
        samples=opts.weight == "samples", vdso_names=opts.vdso_names, vdso_lookup=lookup,
        strict=opts.strict, max_line=MAX_LINE)
    try:
        feed = folder.feed
        if f is not None:
            readinto = getattr(f, "readinto", None)
            if readinto is not None:
                buf = bytearray(CHUNK)
                mv = memoryview(buf)
                while True:
                    n = readinto(buf)
                    if not n:
                        break
                    feed(mv[:n])
            else:
                for c in _chunks(f):
                    feed(c)
        else:
            for ln in it:
                feed(ln if isinstance(ln, bytes | bytearray | memoryview)
                     else ln.encode("utf-8", "surrogateescape"))
        folder.finish()
    except _fold.FoldError as e:
        kind, lineno, text = e.args
        raise _FoldError(kind, lineno, text) from None
    return folder.result()


def parse_perf_script(source: Source, *, run_id: str = "", build: str = "",
                      **kwargs: Any) -> pd.DataFrame:
    """``perf script`` text → the ``stacks`` table (see :func:`fold_perf_script`)."""
    fold = fold_perf_script(source, **kwargs)
    return fold.stacks_df(run_id=run_id, build=build)


def iter_lines(text: str | bytes) -> Iterable[bytes]:
    """Lines of an in-memory perf script text, as bytes (tests, notebooks)."""
    data = text.encode() if isinstance(text, str) else text
    return io.BytesIO(data)


# --------------------------------------------------------------------------- drop-in command

def main(argv: list[str] | None = None) -> int:
    """``profkit-stackcollapse-perf [options] [FILE...]``: stackcollapse-perf.pl's command
    line (same options, files concatenated, stdin without files or for ``-``), with the
    light start-up of a command that imports only this module."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="profkit-stackcollapse-perf",
        description="Fold `perf script` text exactly as FlameGraph's stackcollapse-perf.pl.")
    for opt, what in (("pid", "include PID with process names"),
                      ("tid", "include TID and PID with process names"),
                      ("inline", "un-inline using addr2line"),
                      ("all", "all annotations (--kernel --jit)"),
                      ("kernel", "annotate kernel functions with a _[k]"),
                      ("jit", "annotate jit functions with a _[j]"),
                      ("context", "adds source context to --inline"),
                      ("srcline", "parses output of 'perf script -F+srcline' and adds "
                                  "source context"),
                      ("addrs", "include raw addresses where symbols can't be found")):
        ap.add_argument(f"--{opt}", action="store_true", help=what)
    ap.add_argument("--event-filter", default="", metavar="EVENT", help="event name filter")
    ap.add_argument("--strict", action="store_true",
                    help="profkit: refuse truncated or garbled input instead of skipping it")
    ap.add_argument("files", nargs="*", metavar="FILE")
    a = ap.parse_args(argv)
    files = a.files or ["-"]
    out = sys.stdout.buffer
    total: dict[str, int | float] = {}

    def warn(msg: str) -> None:
        print(msg, file=sys.stderr)

    try:
        if len(files) == 1:
            src: Any = sys.stdin.buffer if files[0] == "-" else files[0]
            counts = fold_perf_script(src, pid=a.pid, tid=a.tid, kernel=a.kernel, jit=a.jit,
                                      all=a.all, addrs=a.addrs, inline=a.inline,
                                      context=a.context, srcline=a.srcline,
                                      event_filter=a.event_filter or None,
                                      strict=a.strict, warn=warn).counts
        else:
            counts = fold_perf_script(_concat(files), pid=a.pid, tid=a.tid, kernel=a.kernel,
                                      jit=a.jit, all=a.all, addrs=a.addrs, inline=a.inline,
                                      context=a.context, srcline=a.srcline,
                                      event_filter=a.event_filter or None,
                                      strict=a.strict, warn=warn).counts
        total = counts
    except ParseError as e:
        print(f"profkit-stackcollapse-perf: {e}", file=sys.stderr)
        return 2
    out.write(format_folded(total).encode("utf-8", "surrogateescape"))
    out.flush()
    return 0


def _concat(files: list[str]) -> Iterable[bytes]:
    """Perl's ``<>`` over several files: one stream, where a file's last line ends at
    its end even without a newline."""
    last = b"\n"
    for name in files:
        if last[-1:] != b"\n":
            yield b"\n"
        if name == "-":
            for last in sys.stdin.buffer:
                yield last
            continue
        f, _ = _open(name)
        with f:
            while True:
                b = f.read(CHUNK)
                if not b:
                    break
                last = b
                yield b


if __name__ == "__main__":
    raise SystemExit(main())
