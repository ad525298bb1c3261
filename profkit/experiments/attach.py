"""A backend profkit did not start: ``--pid PID`` or ``--dsn DSN``.

profkit never changes a setting of such a server and asks for nothing beyond what the
connecting role has: it runs ``SELECT pg_backend_pid()``, the query (and an EXPLAIN of
it) on that connection, and looks at the backend from outside (perf, uprobes) as root.
The binary is the one the backend runs (``/proc/PID/exe``); what it allows is said before
anything is recorded (:func:`binary_report`):

- full DWARF (a profkit build, or a ``-dbgsym`` package installed) → per-node counts;
- dynamic symbols only (Debian's stripped ``postgres`` exports ~9,500 functions, among
  them ``InstrStartNode``/``InstrStopNode``/``ExecProcNode*``) → function-level counts:
  perf names exported functions (static ones fold into their caller's neighbour or stay
  ``[unknown]``), the clock probes count calls but cannot attribute them to plan nodes;
- stripped of both → perf addresses only.
"""
from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from profkit.errors import ProbeError, ProfkitError


class AttachError(ProfkitError):
    pass


@dataclass(frozen=True)
class BinaryReport:
    path: Path
    level: str  # "dwarf" | "dynsym" | "addresses"
    symtab: bool
    dynsym_functions: int
    instr_exported: bool
    debug_file: str | None
    version: str

    def describe(self) -> str:
        if self.level == "dwarf":
            where = f" (from {self.debug_file})" if self.debug_file else ""
            return (f"{self.path}: full DWARF{where} → per-node counts, named frames "
                    "(static functions too)")
        if self.level == "dynsym":
            instr = ("InstrStartNode/InstrStopNode exported" if self.instr_exported
                     else "no Instr* function exported")
            return (f"{self.path}: stripped, dynamic symbols only ({self.dynsym_functions:,} "
                    f"functions; {instr}) → function-level counts, no per-node counts; static "
                    "functions stay unnamed in perf. For more: install the "
                    "-dbgsym package of this exact version (debuginfod / the debug archive), "
                    f"or `profkit build` the same version "
                    f"({self.version.replace('postgres (PostgreSQL) ', '') or '?'}) and profile "
                    "a cluster of it")
        return (f"{self.path}: no symbols at all → perf addresses only; install the "
                "-dbgsym package or build the same version with profkit")


def _debug_file(elf: Any) -> str | None:
    """The separate debug file of a stripped binary, if installed (/usr/lib/debug)."""
    for sec in elf.iter_sections():
        if sec.header["sh_type"] == "SHT_NOTE":
            for note in sec.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID":
                    bid = str(note["n_desc"])
                    p = Path("/usr/lib/debug/.build-id") / bid[:2] / f"{bid[2:]}.debug"
                    if p.exists():
                        return str(p)
    return None


def binary_report(exe: str | Path) -> BinaryReport:
    """What the binary allows: DWARF, dynamic symbols only, or nothing (see module doc)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    from profkit.run import run

    p = Path(exe)
    try:
        with open(p, "rb") as f:
            elf = ELFFile(f)
            names = {s.name for s in elf.iter_sections()}
            dbg = _debug_file(elf)
            dyn = elf.get_section_by_name(".dynsym")
            funcs = 0
            instr = False
            if dyn is not None:
                for sym in dyn.iter_symbols():
                    if sym["st_info"]["type"] == "STT_FUNC" and sym["st_shndx"] != "SHN_UNDEF":
                        funcs += 1
                        if sym.name in ("InstrStartNode", "InstrStopNode"):
                            instr = True
    except (OSError, ELFError) as e:
        raise AttachError(f"cannot read the backend's binary {p}: {e}") from None
    version = ""
    with contextlib.suppress(Exception):
        version = run([str(p), "--version"], timeout=30, check=False).stdout.strip()
    if ".debug_info" in names or dbg:
        level = "dwarf"
    elif funcs:
        level = "dynsym"
    else:
        level = "addresses"
    return BinaryReport(p, level, ".symtab" in names, funcs, instr, dbg, version)


def _redact(dsn: str) -> str:
    return re.sub(r"(password\s*=\s*)\S+|(://[^:/@]+:)[^@]+@", lambda m: (
        (m.group(1) + "***") if m.group(1) else (m.group(2) + "***@")), dsn)


def connect_dsn(dsn: str) -> Any:
    """A connection to a server profkit did not start (autocommit, nothing changed)."""
    import psycopg

    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.Error as e:
        first = (str(e).strip().splitlines() or ["?"])[-1].strip()
        raise AttachError(f"cannot connect to {_redact(dsn)!r}: {first} (check host, port, "
                          "user and dbname; a socket directory is host=/path)") from None


def check_backend(pid: int) -> Path:
    """The binary of backend *pid* (ProbeError when it is not a backend)."""
    from profkit.collect.bpf import backend_info

    try:
        return backend_info(pid).exe
    except ProbeError as e:
        raise AttachError(str(e)) from None


def perf_attached(*, pid: int | None = None, dsn: str | None = None, sql: str | None = None,
                  seconds: float = 10.0, reps: int = 1, freq: int = 999,
                  call_graph: str = "fp", stat: bool = True, workload: str | None = None,
                  mode: str | None = None, base: str | Path | None = None,
                  progress: Callable[[str], None] | None = None) -> tuple[Any, BinaryReport]:
    """perf on a backend profkit did not start: by *pid* for *seconds*, or on a new
    connection to *dsn* while it runs *sql* (``reps`` times). Returns (PerfProfile, report)."""
    from profkit.collect.artifacts import server_settings
    from profkit.collect.perf import QUERY_OUTPUT, fold_run, format_rows, perf_path, record_pid
    from profkit.collect.perf import run_query
    from profkit.rundir import load_run, new_run

    say = progress or (lambda _m: None)
    if (pid is None) == (dsn is None):
        raise AttachError("give --pid PID or --dsn DSN (one of them)")
    if dsn is not None and not sql:
        raise AttachError("with --dsn, give the query: --sql SELECT... or --workload")
    if pid is not None and sql:
        raise AttachError("--pid records the backend as it is for --seconds; to run a query "
                          "use --dsn")
    perf_path()
    conn = connect_dsn(dsn) if dsn is not None else None
    try:
        if conn is not None:
            pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        assert pid is not None
        exe = check_backend(pid)
        rep = binary_report(exe)
        say(rep.describe())
        rd = new_run("perf", workload=workload, mode=mode, base=base,
                     target={"pid": pid, "dsn": _redact(dsn) if dsn else None,
                             "binary": str(exe), "binary_level": rep.level,
                             "binary_report": rep.describe(), "version": rep.version},
                     query_name=(mode or "query") if conn is not None else f"pid {pid}")
        if conn is not None:
            assert sql is not None
            rd.update(query=sql, reps=reps, settings=server_settings(conn))
            say(f"recording backend {pid} while it runs the query (perf, {freq} Hz)")
            _rec, res = record_pid(pid, lambda: run_query(conn, sql, reps), run=rd, freq=freq,
                                   call_graph=call_graph, stat=stat,  # type: ignore[arg-type]
                                   binary=exe)
            rd.file(QUERY_OUTPUT).write_text(format_rows(res.rows))
            rd.add_artifact(QUERY_OUTPUT, "the query's output (last repetition)")
        else:
            say(f"recording backend {pid} for {seconds:g} s (perf, {freq} Hz)")
            record_pid(pid, lambda: time.sleep(seconds), run=rd, freq=freq,
                       call_graph=call_graph, stat=stat, binary=exe)  # type: ignore[arg-type]
    finally:
        if conn is not None:
            conn.close()
    prof = fold_run(load_run(rd.path), binary=exe, check=False)
    rd.finish(status="complete")
    return prof, rep
