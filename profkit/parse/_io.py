"""Reading parser input safely: one way to open a file, bound its lines and decode them.

Every parser reads through :func:`open_text`, so every parser fails the same way on what
real life feeds it — a directory, ``/proc/self/mem``, random bytes named ``.gz``, a cut
``.gz``, ``/dev/zero`` (one endless line), bytes that are not UTF-8 — with one
:class:`~profkit.errors.ParseError` that names the input and the line, never an
``OSError``, ``EOFError`` (which click would print as "Aborted!") or ``MemoryError``.

Usage::

    for lineno, line in open_text(path_or_file_or_lines):   # line keeps its "\\n"
        ...
        raise parse_error(path_or_file_or_lines, lineno, "expected ..., got ...")

Decoding: a file that starts with a UTF-16 byte-order mark (Windows PowerShell's ``>``)
is read as UTF-16, a UTF-8 byte-order mark is dropped; otherwise each line is UTF-8; a
line that is not valid UTF-8 is decoded as Latin-1
instead (every byte one character), so distinct byte strings stay distinct names
(``f\\xe9`` and ``f\\xe8`` do not both become ``f\\ufffd``) and the result is still a
valid ``str`` that CSV, JSON and Parquet writers accept.
"""
from __future__ import annotations

import codecs
import gzip
import io
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from profkit.errors import ParseError

#: The longest line any parser accepts (bytes, or characters for text input).
MAX_LINE = 1 << 20

Source = str | os.PathLike[str] | IO[bytes] | IO[str] | Iterable[bytes] | Iterable[str]

_GZIP_MAGIC = b"\x1f\x8b"


def describe(source: object) -> str:
    """How an input is named in messages: its path, ``<stdin>`` or ``<input>``."""
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    name = getattr(source, "name", None)
    if isinstance(name, str) and name:
        return "<stdin>" if name == "<stdin>" else name
    if isinstance(name, int):  # a file opened from a descriptor
        return "<stdin>" if name == 0 else f"<fd {name}>"
    return "<input>"


def parse_error(source: object, lineno: int | None, message: str) -> ParseError:
    """A :class:`ParseError` worded ``FILE, line N: message`` (``FILE: message`` without N)."""
    where = describe(source) if not isinstance(source, str) or source else "<input>"
    prefix = f"{where}, line {lineno}" if lineno else where
    err = ParseError(f"{prefix}: {message}")
    err.source = where  # type: ignore[attr-defined]
    err.lineno = lineno  # type: ignore[attr-defined]
    return err


def decode_line(raw: bytes | str) -> str:
    """UTF-8, or Latin-1 when the line is not valid UTF-8 (see the module docstring)."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _open_path(path: Path) -> IO[bytes]:
    try:
        f: IO[bytes] = open(path, "rb", buffering=1 << 20)  # noqa: SIM115 - caller closes
    except OSError as e:
        raise parse_error(path, None, f"cannot read it: {e.strerror or e}") from None
    try:
        head = f.peek(4)[:4] if hasattr(f, "peek") else b""
    except OSError as e:
        f.close()
        raise parse_error(path, None, f"cannot read it: {e.strerror or e}") from None
    if head[:2] == _GZIP_MAGIC or path.suffix == ".gz":
        f = gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[assignment]
        try:  # a byte-order mark inside the compressed text counts as well
            head = f.peek(4)[:4]
        except (OSError, EOFError, zlib.error):
            return f  # a broken stream: the first read says so, naming the line
    if head[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) and head != codecs.BOM_UTF32_LE:
        # Windows PowerShell's `gprof prog.exe gmon.out > report.txt` writes UTF-16 with a
        # byte-order mark: decoded as such (lines keep their "\r\n")
        return io.TextIOWrapper(f, encoding="utf-16", errors="replace",  # type: ignore[return-value]
                                newline="")
    if head[:3] == codecs.BOM_UTF8:
        f.read(3)  # a UTF-8 byte-order mark is not part of the first line
    return f


def _read_error(source: object, lineno: int, e: BaseException) -> ParseError:
    if isinstance(e, gzip.BadGzipFile | zlib.error):
        return parse_error(source, lineno, f"not a valid gzip file ({e}); pass the "
                           "uncompressed text or re-compress it with gzip")
    if isinstance(e, EOFError):
        return parse_error(source, lineno, "the gzip file is truncated (it ends before its "
                           "end-of-stream marker); re-copy or re-compress it")
    if isinstance(e, OSError):
        return parse_error(source, lineno, f"cannot read it: {e.strerror or e}")
    return parse_error(source, lineno, str(e))


def _too_long(source: object, lineno: int, max_line: int) -> ParseError:
    return parse_error(source, lineno, f"line is longer than {max_line:,} bytes — this is "
                       "not a text profile (binary data, /dev/zero, or a file without "
                       "newlines?)")


def open_text(source: Source, *, max_line: int = MAX_LINE) -> Iterator[tuple[int, str]]:
    """Yield ``(lineno, line)`` (1-based; the line keeps its ``\\n``) from *source*.

    *source*: a path (gzip-compressed when it starts with gzip's magic or ends in
    ``.gz``), a binary or text file object (``sys.stdin.buffer``), or an iterable of
    lines (bytes or str). Raises :class:`ParseError` (naming the input and the line)
    when the input cannot be read, is a broken gzip stream or has a line longer than
    *max_line*. A path is closed when the iteration ends; file objects are left open.
    """
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if path.is_dir():
            raise parse_error(path, None, "is a directory; pass a file")
        f = _open_path(path)
        try:
            yield from _lines_of(f, path, max_line)
        finally:
            try:
                f.close()
            except OSError:  # pragma: no cover - close of a read-only file
                pass
        return
    if hasattr(source, "readline"):
        yield from _lines_of(source, source, max_line)  # type: ignore[arg-type]
        return
    lineno = 0
    for raw in source:
        lineno += 1
        if len(raw) > max_line + 1:
            raise _too_long(source, lineno, max_line)
        yield lineno, decode_line(raw)


def _lines_of(f: IO[bytes] | IO[str], source: object, max_line: int) -> Iterator[tuple[int, str]]:
    lineno = 0
    while True:
        lineno += 1
        try:
            raw = f.readline(max_line + 1)
        except (OSError, EOFError, zlib.error) as e:
            raise _read_error(source, lineno, e) from None
        except UnicodeDecodeError:  # a text-mode file object that is not UTF-8
            raise parse_error(source, lineno, "not UTF-8 text; pass the file's path or "
                              "open it in binary mode") from None
        if not raw:
            return
        if len(raw) > max_line and not raw.endswith("\n" if isinstance(raw, str) else b"\n"):
            raise _too_long(source, lineno, max_line)
        yield lineno, decode_line(raw)


def read_text(source: Source, *, max_line: int = MAX_LINE) -> str:
    """The whole text of *source* through :func:`open_text` (for parsers that need it)."""
    buf = io.StringIO()
    for _, line in open_text(source, max_line=max_line):
        buf.write(line)
    return buf.getvalue()
