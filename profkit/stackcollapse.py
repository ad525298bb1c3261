"""``profkit-stackcollapse-perf``: FlameGraph's stackcollapse-perf.pl as a drop-in command.

Same command line (``[--pid] [--tid] [--kernel] [--jit] [--all] [--addrs]
[--event-filter=EVENT] [--inline] [--context] [--srcline] [FILE...]``, files read one
after the other, stdin without files or for ``-``), same output to the byte, same notes
on stderr; plus profkit's ``--strict``. This module imports only the compiled core
(``profkit._fold``) so that start-up stays a small part of folding a big capture
(tests/test_perf_compat.py checks its output against the Perl script;
benchmarks/bench_folding.py times it); ``--inline``, ``--context``, ``--srcline``,
``--help`` and anything else it does not know go to the full implementation,
:func:`profkit.parse.perf_script.main`.
"""
from __future__ import annotations

import os
import sys

from profkit.errors import (
    ParseError,
    ProfkitError,
    StdoutFailed,
    os_error_message,
    silence_stdout,
)

_FLAGS = {"--pid": "pid", "--tid": "tid", "--kernel": "kernel", "--jit": "jit",
          "--all": "all", "--addrs": "addrs", "--strict": "strict"}
_CHUNK = 1 << 20


_MAP_STEP = 8 << 20


def _mapped(f):  # noqa: ANN001, ANN202 - a file -> an mmap of it, or None
    """The file mapped read-only (page cache pages, populated up front), or None for
    what cannot be mapped (pipes, empty files)."""
    import mmap

    try:
        size = os.fstat(f.fileno()).st_size
        if size <= 0:
            return None
        return mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ, flags=mmap.MAP_SHARED)
    except (OSError, ValueError):
        return None


def _advise(m, what: str, start: int, length: int) -> None:  # noqa: ANN001
    import mmap

    flag = getattr(mmap, what, None)
    if flag is not None:
        try:
            m.madvise(flag, start, length)
        except (OSError, ValueError):
            pass


def _number(v: int | float) -> bytes:
    # Perl prints its integers as such and its doubles %.15g
    return str(v).encode() if isinstance(v, int) else b"%.15g" % v


class ReadFailed(Exception):
    """Reading or folding the file *name* (``-``: stdin) failed; *cause* is the OSError or
    the compiled core's FoldError (kind, line number, line)."""

    def __init__(self, name: str, cause: BaseException) -> None:
        super().__init__(name, cause)
        self.name = name
        self.cause = cause

    @property
    def what(self) -> str:
        return "perf script text on stdin" if self.name == "-" else f"perf script text {self.name}"

    def error(self) -> ParseError:
        """The one error the commands show: the file unreadable, or where it is garbled."""
        if isinstance(self.cause, OSError):
            return ParseError(f"cannot read {self.name}: {self.cause.strerror}")
        from profkit.parse.perf_script import _error  # the full parser: only on errors

        return _error(*self.cause.args, self.what)


def fold_files(files: list[str], *, pid: bool = False, tid: bool = False, kernel: bool = False,
               jit: bool = False, addrs: bool = False, event_filter: str = "",
               strict: bool = False, stdin=None  # noqa: ANN001 - a binary file
               ) -> tuple[dict[bytes, int | float], dict]:
    """Fold *files* (read one after the other as Perl's ``<>`` does; ``-`` or none: stdin)
    with the compiled core, in stackcollapse-perf.pl's default weighting (the period).

    Returns (collapsed stack bytes -> weight, the core's stats). Raises :class:`ReadFailed`.
    """
    from profkit import _fold

    folder = _fold.Folder(pid=pid, tid=tid, kernel=kernel, jit=jit, addrs=addrs,
                          event_filter=os.fsencode(event_filter), strict=strict)
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    name = "-"
    try:
        last = 10
        for k, name in enumerate(files or ["-"]):
            if k and last != 10:
                folder.feed(b"\n")       # Perl's <>: a file's last line ends with the file
            f = (stdin or sys.stdin.buffer) if name == "-" else open(name, "rb", buffering=0)  # noqa: SIM115
            try:
                mapped = _mapped(f) if name != "-" else None
                if mapped is not None:           # a regular file: no copy at all
                    with mapped as m:
                        with memoryview(m) as mv:
                            size = len(mv)
                            for i in range(0, size, _MAP_STEP):
                                step = min(_MAP_STEP, size - i)
                                _advise(m, "MADV_WILLNEED", i, step)
                                with mv[i:i + step] as part:
                                    folder.feed(part)
                                # folded: unmap those pages (they stay in the page cache),
                                # so resident memory stays one step, not the file
                                _advise(m, "MADV_DONTNEED", i, step)
                            last = mv[-1]
                    continue
                while True:
                    n = f.readinto(buf)
                    if not n:
                        break
                    folder.feed(view[:n])
                    last = buf[n - 1]
            finally:
                if name != "-":
                    f.close()
        folder.finish()
    except (OSError, _fold.FoldError) as e:
        raise ReadFailed(name, e) from None
    collapsed, _modules, stats = folder.result()
    return collapsed, stats


def notes(stats: dict) -> list[str]:
    """What stackcollapse-perf.pl says on stderr about a folding (the event it leaves out),
    and profkit's note on the lines it skipped."""
    out = []
    if stats["filter_warning"] is not None:
        # (sic: the Perl script names the event it leaves out)
        out.append("Filtering for events of type: "
                   + stats["filter_warning"].decode("utf-8", "surrogateescape"))
    if stats["unrecognized"]:
        ln, text = stats["first_unrecognized"]
        out.append(f"{stats['unrecognized']} unrecognized line(s) skipped, as "
                   f"stackcollapse-perf.pl does (first: line {ln}: "
                   f"{text[:100].decode('utf-8', 'backslashreplace')!r})")
    return out


def folded_bytes(collapsed: dict[bytes, int | float]) -> bytes:
    """The folded text as stackcollapse-perf.pl prints it: sorted bytewise, Perl's numbers."""
    return b"".join(k + b" " + _number(collapsed[k]) + b"\n" for k in sorted(collapsed))


def fold_command(file: str, *, pid: bool = False, tid: bool = False, kernel: bool = False,
                 jit: bool = False, addrs: bool = False, event_filter: str | None = None,
                 strict: bool = False, note=None, emit=None) -> None:  # noqa: ANN001
    """``profkit parse perf-script FILE`` in stackcollapse-perf.pl's weighting: fold *file*
    (``-``: stdin), hand the Perl script's stderr notes to *note* and the folded bytes to
    *emit*. Raises :class:`~profkit.errors.ParseError` (unreadable or, with *strict*,
    garbled input; an *event_filter* the file has no sample of)."""
    try:
        collapsed, stats = fold_files([file], pid=pid, tid=tid, kernel=kernel, jit=jit,
                                      addrs=addrs, event_filter=event_filter or "",
                                      strict=strict)
    except ReadFailed as e:
        raise e.error() from None
    for line in notes(stats):
        if note is not None:
            note(line)
    if event_filter is not None and stats["samples"] == 0 and stats["events"]:
        # the Perl script prints nothing and exits 0 here: say why instead
        events = ", ".join(e.decode("utf-8", "surrogateescape") for e in stats["events"])
        raise ParseError(f"{file}: no sample of event {event_filter!r}; the file has "
                         f"{events}: pass one of those to --event-filter")
    if emit is not None:
        emit(folded_bytes(collapsed))


#: ``profkit parse perf-script``'s options that keep stackcollapse-perf.pl's weighting
#: (the others, --samples --vdso --functions --inline --context, need the full parser):
#: the drop-in's own
_COMMAND_FLAGS = _FLAGS


def command_args(args: list[str]) -> dict | None:
    """The arguments after ``profkit parse perf-script`` as fold_command's keywords (plus
    ``output``), when they are only what the fast path handles: the flags above,
    ``--event-filter EVENT``, ``-o/--output FILE`` and one input file that is not gzipped
    and not a folder. None for anything else (``--help``, another option, a usage error):
    click then parses them and says what is wrong."""
    kw: dict = {"event_filter": None, "output": None}
    files: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in _COMMAND_FLAGS:
            kw[_COMMAND_FLAGS[a]] = True
        elif a.startswith("--event-filter="):
            kw["event_filter"] = a.split("=", 1)[1]
        elif a.startswith("--output="):
            kw["output"] = a.split("=", 1)[1]
        elif a in ("--event-filter", "-o", "--output"):
            if i + 1 >= len(args):
                return None
            i += 1
            kw["event_filter" if a == "--event-filter" else "output"] = args[i]
        elif a.startswith("-") and a != "-":
            return None
        else:
            files.append(a)
        i += 1
    if len(files) != 1 or files[0].endswith(".gz") or os.path.isdir(files[0]):
        return None
    if kw["output"] is not None and (kw["output"] == "" or os.path.isdir(kw["output"])):
        return None
    every = kw.pop("all", False)
    kw["kernel"] = kw.get("kernel", False) or every
    kw["jit"] = kw.get("jit", False) or every
    kw["file"] = files[0]
    return kw


def command_main(args: list[str]) -> int | None:
    """``profkit parse perf-script ARGS`` without click (start-up is most of the time a
    fold of a big capture takes): the exit status, or None when *args* need the full
    command line (:func:`command_args`). Output, notes, errors and exit statuses are the
    click command's (tests/test_perf_compat.py runs both)."""
    kw = command_args(args)
    if kw is None:
        return None
    output = kw.pop("output")

    def emit(data: bytes) -> None:
        if output:
            with open(output, "wb") as f:
                f.write(data)
            return
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except OSError as e:
            silence_stdout()
            raise StdoutFailed(e) from None

    try:
        fold_command(note=lambda m: print(m, file=sys.stderr), emit=emit, **kw)
    except ProfkitError as e:
        print(f"profkit: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"profkit: {os_error_message(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("profkit: interrupted; everything profkit started was stopped", file=sys.stderr)
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    opts: dict[str, bool] = {}
    files: list[str] = []
    event_filter = ""
    i = 0
    while i < len(args):
        a = args[i]
        if a in _FLAGS:
            opts[_FLAGS[a]] = True
        elif a.startswith("--event-filter="):
            event_filter = a.split("=", 1)[1]
        elif a == "--event-filter" and i + 1 < len(args):
            i += 1
            event_filter = args[i]
        elif a.startswith("-") and a != "-":
            from profkit.parse.perf_script import main as full

            return full(args)
        else:
            files.append(a)
        i += 1
    try:
        collapsed, stats = fold_files(
            files, pid=opts.get("pid", False), tid=opts.get("tid", False),
            kernel=opts.get("kernel", False) or opts.get("all", False),
            jit=opts.get("jit", False) or opts.get("all", False),
            addrs=opts.get("addrs", False), event_filter=event_filter,
            strict=opts.get("strict", False))
    except ReadFailed as e:
        print(f"profkit-stackcollapse-perf: {e.error()}", file=sys.stderr)
        return 2
    for line in notes(stats):
        print(line, file=sys.stderr)
    out = sys.stdout.buffer
    out.write(folded_bytes(collapsed))
    out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
