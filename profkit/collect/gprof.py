"""gprof on one PostgreSQL backend: exact call counts of a query from a ``-pg`` build.

A build configured with ``--enable-profiling`` (the ``gprof`` preset, or
``<patch preset>+gprof``) is compiled with ``-pg``: every function counts its calls
(``mcount``) and the process samples its program counter every 10 ms. PostgreSQL has
each backend write its own ``$PGDATA/gprof/<pid>/gmon.out`` when it **exits**
(``proc_exit`` changes into that directory first so backends do not overwrite each
other's file). So :func:`collect_gprof`:

1. opens a *fresh* connection (its backend has counted nothing else) and takes the
   backend's pid from libpq (``conn.info.backend_pid``: a ``SELECT pg_backend_pid()``
   would itself be executed — and, with pg_stat_statements tracking top-level
   statements, instrumented — in the backend being counted);
2. runs the query ``reps`` times, closes the connection and waits for the backend to
   exit and for its gmon.out to appear and stop growing;
3. copies gmon.out into the run it is given (``profiles/<run_id>/``) and checks it belongs to the binary
   (:func:`check_gmon`: glibc writes the histogram's range, ``__executable_start`` ..
   ``etext`` of the program that wrote it; another program's range does not match);
4. runs ``gprof -b BINARY gmon.out`` → ``gprof.txt`` (flat profile + call graph, without
   the explanations), parsed by :mod:`profkit.parse.gprof` into ``functions.parquet``
   and ``call_edges.parquet``.

gprof's call counts are exact; its times come from 10 ms samples and are coarse.

Bad input: a build without ``-pg`` raises :class:`GprofError` naming the preset to use;
a backend that never writes gmon.out (killed with SIGKILL: no exit handlers run) raises
with the directory that was watched; a gmon.out that does not belong to the binary
(another program, another build) raises before gprof is trusted, and an all-empty gprof
report for a non-empty gmon.out raises too. The gmon.out copy is kept in every case.
"""
from __future__ import annotations

import os
import shutil
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from profkit.collect.artifacts import server_settings
from profkit.rundir import RunDir, load_run
from profkit.collect.perf import QueryResult, format_rows, pid_alive, run_query
from profkit.errors import CommandFailed, ProbeError, ToolNotFound
from profkit.parse.gprof import GprofProfile, parse_gprof
from profkit.processes import format_argv, install_hint, which
from profkit.processes import run as run_argv

if TYPE_CHECKING:
    import psycopg

    from profkit.pg.build import Build
    from profkit.pg.cluster import Cluster

GMON = "gmon.out"
REPORT = "gprof.txt"
REPORT_ERR = "gprof.err"
FUNCTIONS_PARQUET = "functions.parquet"
EDGES_PARQUET = "call_edges.parquet"
QUERY_OUTPUT = "query-output.txt"

# glibc rounds the histogram's high end up to a multiple of HISTFRACTION *
# sizeof(HISTCOUNTER) (4 bytes); allow a little more.
_ETEXT_SLACK = 64


class GprofError(ProbeError):
    """gprof could not profile; the message says why, what was kept and what to do."""


def gprof_path(gprof: str = "gprof") -> str:
    try:
        return which(gprof)
    except ToolNotFound:
        raise ToolNotFound(f"gprof not found ({gprof!r}); {install_hint('gprof')}") from None


def profiling_build_name(name: str) -> str:
    """The ``-pg`` preset for a build name: vanilla → gprof, step3 → step3+gprof."""
    if name in ("gprof",) or name.endswith("+gprof"):
        return name
    return "gprof" if name == "vanilla" else f"{name}+gprof"


# --------------------------------------------------------------------------- gmon.out

@dataclass(frozen=True)
class GmonHeader:
    """What a GNU gmon.out (version 1) says about the program that wrote it."""

    low_pc: int
    high_pc: int
    hist_bins: int
    prof_rate: int
    arcs: int
    calls: int
    arcs_in_text: int     # arcs whose callee lies in the histogram's range


def read_gmon(path: str | os.PathLike[str]) -> GmonHeader:
    """Read a gmon.out's histogram range and call arcs (glibc's format, 64-bit)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise GprofError(f"cannot read {path}: {e.strerror}") from None
    if len(data) < 20 or data[:4] != b"gmon":
        raise GprofError(f"{path} is not a gmon.out file (no 'gmon' magic; {len(data)} bytes)")
    (version,) = struct.unpack_from("<I", data, 4)
    if version != 1:
        raise GprofError(f"{path}: gmon.out version {version} is not supported (expected 1)")
    off = 20
    lo = hi = bins = rate = 0
    arcs = calls = 0
    pcs: list[int] = []   # callee addresses of the arcs
    try:
        while off < len(data):
            tag = data[off]
            off += 1
            if tag == 0:      # GMON_TAG_TIME_HIST
                lo, hi, bins, rate = struct.unpack_from("<QQII", data, off)
                off += 24 + 16 + 2 * bins
            elif tag == 1:    # GMON_TAG_CG_ARC
                _frm, self_pc, count = struct.unpack_from("<QQI", data, off)
                off += 20
                arcs += 1
                calls += count
                pcs.append(self_pc)
            elif tag == 2:    # GMON_TAG_BB_COUNT
                (n,) = struct.unpack_from("<I", data, off)
                off += 4 + 16 * n
            else:
                raise GprofError(f"{path}: unknown gmon record tag {tag} at byte {off - 1} "
                                 "(damaged or truncated file)")
    except struct.error:
        raise GprofError(f"{path} is truncated at byte {off} of {len(data)}") from None
    if off > len(data):
        raise GprofError(f"{path} is truncated ({len(data)} bytes, records need {off})")
    inside = sum(1 for pc in pcs if lo <= pc < hi)
    return GmonHeader(lo, hi, bins, rate, arcs, calls, inside)


def _text_range(binary: str | os.PathLike[str]) -> tuple[int, int]:
    """(``__executable_start``, ``etext``) of *binary* from its symbol table."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    want = {"__executable_start": None, "etext": None, "_etext": None}
    try:
        with open(binary, "rb") as f:
            elf = ELFFile(f)
            for sec in elf.iter_sections():
                if not isinstance(sec, SymbolTableSection):
                    continue
                for name in list(want):
                    if want[name] is None:
                        syms = sec.get_symbol_by_name(name)
                        if syms:
                            want[name] = syms[0]["st_value"]
    except (OSError, ELFError) as e:
        raise GprofError(f"cannot read the symbols of {binary}: {e}") from None
    start = want["__executable_start"]
    etext = want["etext"] if want["etext"] is not None else want["_etext"]
    if start is None or etext is None:
        raise GprofError(f"{binary} has no __executable_start/etext symbols (stripped?): "
                         "gprof needs an unstripped binary")
    return int(start), int(etext)


def check_gmon(gmon: str | os.PathLike[str], binary: str | os.PathLike[str]) -> GmonHeader:
    """Raise :class:`GprofError` unless *gmon* was written by *binary*.

    glibc's ``monstartup`` profiles ``__executable_start .. etext`` of the running
    program; a gmon.out whose histogram covers another range, or whose call arcs mostly
    land outside it, comes from another program (or another build of it). (Some arcs
    may point outside: a -pg loadable module such as pg_stat_statements.so records its
    own functions as callees at their mapped addresses.)
    """
    h = read_gmon(gmon)
    start, etext = _text_range(binary)
    fits = h.low_pc == start and 0 <= h.high_pc - etext <= _ETEXT_SLACK
    arcs_fit = h.arcs == 0 or h.arcs_in_text * 2 > h.arcs
    if not (fits and arcs_fit):
        raise GprofError(
            f"{gmon} does not match {binary}: it profiles addresses {h.low_pc:#x}..{h.high_pc:#x}"
            f" but the binary's text is {start:#x}..{etext:#x} — the gmon.out was written by "
            "another program or another build (was PostgreSQL rebuilt since?). Run gprof "
            "with the binary that wrote it, or profile again.")
    if h.arcs == 0:
        raise GprofError(f"{gmon} has no call arcs: the program was not compiled with -pg "
                         "(use the gprof build preset)")
    return h


def gprof_ignores(name: str) -> bool:
    """True for a symbol gprof (binutils ``core_sym_class``) drops from its symbol table.

    gprof keeps ``name``, ``name.NNN`` (nested subprograms) and ``.clone.N`` /
    ``.constprop.N`` clones, and drops anything else after a dot — gcc's partial-inlining
    parts (``foo.part.0``), ``.isra.N`` clones and ``.cold`` blocks — and names with ``$``.
    """
    if "$" in name:
        return True
    i = name.find(".")
    if i < 0:
        return False
    rest, pos = name[i:], 0
    while pos < len(rest) and rest[pos] == ".":
        for keep in (".clone.", ".constprop."):
            if rest.startswith(keep, pos) and len(rest) - pos > len(keep):
                pos += len(keep) - 1
                break
        pos += 1
        digit = False
        while pos < len(rest) and not (digit and rest[pos] == "."):
            if not rest[pos].isdigit():
                return True
            digit = True
            pos += 1
    return False


def merged_into(binary: str | os.PathLike[str], function: str) -> list[str]:
    """Functions gprof silently counts as *function*.

    gprof drops some symbols (:func:`gprof_ignores`) and attributes their addresses —
    their mcount arcs, so their calls — to the symbol before them. This lists the
    dropped function symbols that directly follow *function* in *binary*; e.g. gcc puts
    ``ExecShutdownNode_walker.part.0`` right after ``ExecProcNodeInstr`` in
    execProcnode.o, so gprof's ExecProcNodeInstr count includes one call per plan node
    that ExecShutdownNode visits.
    """
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    funcs: list[tuple[int, str]] = []
    try:
        with open(binary, "rb") as f:
            for sec in ELFFile(f).iter_sections():
                if isinstance(sec, SymbolTableSection):
                    funcs += [(sym["st_value"], sym.name) for sym in sec.iter_symbols()
                              if sym["st_info"]["type"] == "STT_FUNC" and sym["st_value"]]
    except (OSError, ELFError) as e:
        raise GprofError(f"cannot read the symbols of {binary}: {e}") from None
    funcs = sorted(set(funcs))
    out: list[str] = []
    for k, (_addr, name) in enumerate(funcs):
        if name != function:
            continue
        for _a, nxt in funcs[k + 1:]:
            if not gprof_ignores(nxt):
                break
            out.append(nxt)
    return out


# --------------------------------------------------------------------------- collection

@dataclass(frozen=True)
class GprofRun:
    """What one profiled backend left behind (paths inside ``run_dir``)."""

    run_id: str
    run_dir: str
    pid: int
    gmon: str
    binary: str
    query_seconds: tuple[float, ...]
    wait_seconds: float


def _wait_gmon(path: Path, pid: int, timeout: float) -> float:
    """Wait until *pid* is gone and *path* exists with a stable size; seconds waited."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            raise GprofError(f"backend {pid} did not exit within {timeout:.0f} s after its "
                             "connection was closed; its gmon.out is written at exit")
        time.sleep(0.02)
    last = -1
    while time.monotonic() < deadline:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = -1
        if size > 0 and size == last:
            return time.monotonic() - t0
        last = size
        time.sleep(0.1)
    raise GprofError(f"backend {pid} exited but wrote no {path} within {timeout:.0f} s (a "
                     "backend killed with SIGKILL or crashed runs no exit handlers, so gprof "
                     "data is lost; is the build configured with --enable-profiling?)")


def check_collectable(b: Build) -> None:
    """Refuse a build whose backends write no gmon.out, or a machine without gprof,
    before anything runs or is created."""
    if not getattr(b, "profiling", False):
        raise GprofError(f"build {b.name!r} is not compiled with -pg (--enable-profiling), so "
                         f"its backends write no gmon.out: use "
                         f"get_build({profiling_build_name(b.name)!r})")
    gprof_path()  # fail before running anything when gprof is missing


def collect_gprof(cl: Cluster, sql: str, *, run: RunDir, reps: int = 1,
                  scale: float | None = None, query_name: str | None = None,
                  setup: Callable[[psycopg.Connection], Any] | None = None,
                  timeout: float = 120.0) -> tuple[GprofRun, QueryResult]:
    """Run *sql* in a fresh backend of *cl* (a ``-pg`` build), collect its gmon.out.

    *run*: the run it writes into, opened by the caller with
    :func:`profkit.rundir.open_run` (:func:`profkit.experiments.profile.gprof_on_cluster`
    checks the build with :func:`check_collectable`, opens the run and parses it).
    *setup*, if given, runs on the fresh connection before the query (its calls are
    counted too). Returns the run and the last repetition's rows.
    """
    b = cl.build
    check_collectable(b)
    with cl.connect() as other:
        settings = server_settings(other)
    run.update(query=sql, reps=reps, scale=scale, query_name=query_name, settings=settings,
               tool_command=f"gprof -b {b.postgres} gmon.out",
               tool_summary="gprof -b (backend built with -pg)")
    conn = cl.connect()
    pid = int(conn.info.backend_pid)
    run.update(backend_pid=pid)
    try:
        if setup is not None:
            setup(conn)
        res = run_query(conn, sql, reps)
    except Exception as e:
        run.finish(status="failed", error=str(e))
        raise GprofError(f"the query failed in backend {pid}: {e}") from e
    finally:
        conn.close()
    src = cl.datadir / "gprof" / str(pid) / GMON
    waited = _wait_gmon(src, pid, timeout)
    dst = run.file(GMON)
    shutil.copyfile(src, dst)
    run.add_artifact(GMON, f"backend {pid}'s gmon.out (copied from {src})")
    run.file(QUERY_OUTPUT).write_text(format_rows(res.rows))
    run.add_artifact(QUERY_OUTPUT, "the query's output (last repetition)")
    run.update(query_seconds=[round(s, 6) for s in res.seconds], gmon_source=str(src),
               gprof_binary=str(b.postgres))
    return (GprofRun(run.run_id, str(run.path), pid, str(dst), str(b.postgres), res.seconds,
                     waited), res)


# --------------------------------------------------------------------------- report

def report(run: RunDir, binary: str | os.PathLike[str] | None = None, *,
           gprof: str = "gprof", check: bool = True, timeout: float = 600) -> Path:
    """``gprof -b BINARY gmon.out`` → gprof.txt in the run directory."""
    exe = gprof_path(gprof)
    gmon = run.file(GMON)
    if not gmon.exists():
        raise GprofError(f"no {GMON} in {run.path}: collect first (collect_gprof)")
    binary = binary or run.get("gprof_binary") or run.get("build.postgres")
    if not binary:
        raise GprofError("which binary wrote this gmon.out? pass binary=")
    if check:
        check_gmon(gmon, binary)
    out = run.file(REPORT)
    out.unlink(missing_ok=True)
    argv = [exe, "-b", str(binary), GMON]
    try:
        cp = run_argv(argv, cwd=run.path, timeout=timeout, stdout_path=out, what="gprof")
    except CommandFailed as e:
        raise GprofError(f"gprof failed on {gmon}: {e.output_tail[-800:]} (command: "
                         f"{format_argv(argv)})") from None
    if cp.stderr and cp.stderr.strip():
        run.file(REPORT_ERR).write_text(cp.stderr)
        run.add_artifact(REPORT_ERR, "gprof's warnings")
    run.add_artifact(REPORT, "gprof -b flat profile and call graph")
    return out


@dataclass(frozen=True)
class GprofResult:
    run: RunDir
    profile: GprofProfile

    @property
    def functions(self) -> pd.DataFrame:
        return self.profile.functions

    @property
    def call_edges(self) -> pd.DataFrame:
        return self.profile.call_edges

    def calls(self, function: str) -> int | None:
        """gprof's exact call count of *function* (None when it is not in the report)."""
        df = self.functions
        rows = df.loc[df["function"] == function, "calls"]
        if rows.empty or pd.isna(rows.iloc[0]):
            return None
        return int(rows.iloc[0])

    def top(self, n: int = 10) -> pd.DataFrame:
        df = self.functions
        flat = df[df["in_flat"]] if "in_flat" in df else df
        cols = ["function", "calls", "self_seconds", "cumulative_seconds", "percent_time"]
        return flat[cols].head(n).reset_index(drop=True)


def parse_run(run: RunDir | str | os.PathLike[str], *, binary: str | None = None,
              gprof: str = "gprof", check: bool = True) -> GprofResult:
    """gprof.txt (made now if missing) → functions/call_edges tables (+ parquet)."""
    rd = run if isinstance(run, RunDir) else load_run(run)
    if not rd.file(REPORT).exists():
        report(rd, binary, gprof=gprof, check=check)
    build = str(rd.provenance.get("build_name") or "")
    prof = parse_gprof(rd.file(REPORT), run_id=rd.run_id, build=build, module="postgres")
    header = read_gmon(rd.file(GMON)) if rd.file(GMON).exists() else None
    if check and header is not None and header.calls > 0 and (
            prof.functions["calls"].fillna(0).sum() == 0):
        raise GprofError(f"gprof attributed none of the {header.calls:,} calls in "
                         f"{rd.file(GMON)} to a function of the binary: the gmon.out and the "
                         "binary do not belong together (report kept in "
                         f"{rd.file(REPORT)})")
    prof.functions.to_parquet(rd.file(FUNCTIONS_PARQUET), index=False)
    prof.call_edges.to_parquet(rd.file(EDGES_PARQUET), index=False)
    rd.add_artifact(FUNCTIONS_PARQUET, "functions table (calls, self seconds)")
    rd.add_artifact(EDGES_PARQUET, "call_edges table (caller -> callee calls)")
    rd.finish(status="complete", functions=len(prof.functions),
              sample_seconds=prof.sample_seconds)
    return GprofResult(rd, prof)
