"""``perf script`` text with addresses → one call stack per sample (frames with their
symbol offsets), for attributions that need more than folded stacks: which process a
sample came from and where in a function each frame's return address lies.

Producer: ``perf script -F comm,pid,tid,time,event,ip,sym,symoff,dso --no-inline``::

    postgres 4242/4242  1234.567890: cpu-clock:ppp:
    \t  5581f8a1b2c3 tuplestore_gettupleslot+0x43 (/var/cache/profkit/builds/.../postgres)
    \t  5581f8a0c0de ExecMaterial+0x8e (/var/cache/profkit/builds/.../postgres)

→ ``Sample(pid=4242, tid=4242, comm="postgres", frames=(... root → leaf ...))`` with each
frame's ``name`` (``tuplestore_gettupleslot``), ``offset`` (0x43) and ``module``.
A frame perf could not name is ``[unknown]`` with no offset. Lines that are neither a
header, a frame nor blank raise :class:`~profkit.errors.ParseError` naming the line.
"""
from __future__ import annotations

import gzip
import os
import re
from collections.abc import Iterator
from pathlib import Path

from profkit.errors import ParseError

_HEADER = re.compile(r"^(?P<comm>\S.*?)\s+(?P<pid>-?\d+)/(?P<tid>-?\d+)\s")
_FRAME = re.compile(r"^\s+(?P<ip>[0-9a-fA-F]+)\s+(?P<sym>.*?)\s+\((?P<dso>[^()]*)\)\s*$")
_OFF = re.compile(r"^(?P<name>.*)\+0x(?P<off>[0-9a-fA-F]+)$")

RawFrame = tuple[str, int | None, str, int]          # name, offset, module, ip
RawSample = tuple[int, int, str, list[RawFrame]]     # pid, tid, comm, frames leaf → root


def _open_text(path: str | os.PathLike[str]) -> Iterator[str]:
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", errors="surrogateescape") as f:  # type: ignore[operator]
        yield from f


def iter_callchains(source: str | os.PathLike[str] | list[str]) -> Iterator[RawSample]:
    """Samples of a perf script text (a path, .gz too, or its lines), frames leaf first
    as perf prints them."""
    lines = source if isinstance(source, list) else _open_text(source)
    cur: RawSample | None = None
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        if not line.strip():
            if cur is not None:
                yield cur
                cur = None
            continue
        if line[0] in " \t":
            m = _FRAME.match(line)
            if m is None or cur is None:
                raise ParseError(f"perf script line {lineno}: not a frame line "
                                 f"({line[:120]!r}); record with perf script -F "
                                 "comm,pid,tid,time,event,ip,sym,symoff,dso")
            sym = m.group("sym")
            off: int | None = None
            mo = _OFF.match(sym)
            if mo is not None:
                sym, off = mo.group("name"), int(mo.group("off"), 16)
            cur[3].append((sym, off, m.group("dso"), int(m.group("ip"), 16)))
            continue
        m = _HEADER.match(line)
        if m is None:
            raise ParseError(f"perf script line {lineno}: not a sample header with pid/tid "
                             f"({line[:120]!r}); record with perf script -F "
                             "comm,pid,tid,time,event,ip,sym,symoff,dso")
        if cur is not None:
            yield cur
        cur = (int(m.group("pid")), int(m.group("tid")), m.group("comm").strip(), [])
    if cur is not None:
        yield cur
