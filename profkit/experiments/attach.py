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
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import psycopg

from profkit.analyze import predict
from profkit.collect import bpf
from profkit.collect.artifacts import server_settings
from profkit.collect.perf import (
    QUERY_OUTPUT,
    fold_run,
    format_rows,
    perf_path,
    record_pid,
    run_query,
)
from profkit.errors import ProbeError, ProfkitError
from profkit.experiments.probe import EXPLAIN, _baseline, _sql_failed, check_query, probe_nodes
from profkit.experiments.profile import (
    ProfileRun,
    flamegraph_dir,
    flamegraph_for,
    shortfall_lines,
    top_functions,
)
from profkit.pg.cluster import connect_dsn, redact_dsn
from profkit.pg.workloads import EXPLAIN_PREFIX, get_workload, workload_spec
from profkit.rundir import load_run, open_run
from profkit.processes import run


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


def check_backend(pid: int) -> Path:
    """The binary of backend *pid* (ProbeError when it is not a backend)."""
    try:
        return bpf.backend_info(pid).exe
    except ProbeError as e:
        raise AttachError(str(e)) from None


def perf_attached(*, pid: int | None = None, dsn: str | None = None, sql: str | None = None,
                  seconds: float = 10.0, reps: int = 1, freq: int = 999,
                  call_graph: str = "fp", stat: bool = True, workload: str | None = None,
                  mode: str | None = None, base: str | Path | None = None,
                  progress: Callable[[str], None] | None = None) -> tuple[Any, BinaryReport]:
    """perf on a backend profkit did not start: by *pid* for *seconds*, or on a new
    connection to *dsn* while it runs *sql* (``reps`` times). Returns (PerfProfile, report)."""
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
        with open_run("perf", workload=workload, mode=mode, base=base,
                      target={"pid": pid, "dsn": redact_dsn(dsn) if dsn else None,
                              "binary": str(exe), "binary_level": rep.level,
                              "binary_report": rep.describe(), "version": rep.version},
                      query_name=(mode or "query") if conn is not None else f"pid {pid}"
                      ) as rd:
            if conn is not None:
                assert sql is not None
                rd.update(query=sql, reps=reps, settings=server_settings(conn))
                say(f"recording backend {pid} while it runs the query (perf, {freq} Hz)")
                _rec, res = record_pid(pid, lambda: run_query(conn, sql, reps), run=rd,
                                       freq=freq, call_graph=call_graph,  # type: ignore[arg-type]
                                       stat=stat, binary=exe)
                rd.file(QUERY_OUTPUT).write_text(format_rows(res.rows))
                rd.add_artifact(QUERY_OUTPUT, "the query's output (last repetition)")
                rd.update(query_seconds=[round(x, 6) for x in res.seconds])
            else:
                say(f"recording backend {pid} for {seconds:g} s (perf, {freq} Hz)")
                record_pid(pid, lambda: time.sleep(seconds), run=rd, freq=freq,
                           call_graph=call_graph, stat=stat,  # type: ignore[arg-type]
                           binary=exe)
            if conn is not None:
                conn.close()
                conn = None
            prof = fold_run(load_run(rd.path), binary=exe, check=False)
    finally:
        if conn is not None:
            conn.close()
    return prof, rep


def perf_attached_run(*, pid: int | None = None, dsn: str | None = None,
                      sql: str | None = None, workload: str = "nested_loop",
                      query: str | None = None, mode: str = "analyze_timing",
                      seconds: float = 10.0, reps: int = 1, freq: int = 999,
                      call_graph: str = "fp", stat: bool = True, top: int = 10,
                      out: str | Path | None = None,
                      progress: Callable[[str], None] | None = None) -> ProfileRun:
    """``profkit perf --pid|--dsn``: :func:`perf_attached` (with --dsn: *sql*, else the
    workload's query, in *mode*), its flamegraph and top functions."""
    spec = None
    if dsn is not None and not sql:
        spec = workload_spec(workload, query)
        sql = get_workload(spec).select_sql
    full = EXPLAIN_PREFIX[mode] + sql.strip().rstrip(";") if sql else None
    prof, rep = perf_attached(pid=pid, dsn=dsn, sql=full, seconds=seconds, reps=reps,
                              freq=freq, call_graph=call_graph, stat=stat, workload=spec,
                              mode=mode if dsn else None, progress=progress)
    target = f"pid{prof.run.get('target.pid')}"
    svg = flamegraph_for(prof.counts, prof.run,
                         flamegraph_dir(out) / f"perf-{target}-{prof.run.run_id}.svg",
                         title=f"{rep.version or 'PostgreSQL'}: backend "
                               f"{prof.run.get('target.pid')} (perf)")
    return ProfileRun(prof, svg, [f"binary: {rep.describe()}",
                                  f"run {prof.run.run_id}: {prof.folding.samples} samples"],
                      [(f"top {top} functions by self samples:", top_functions(prof, top))],
                      warnings=shortfall_lines(prof, "--freq", "--reps" if dsn is not None
                                               else "--dsn DSN --reps N"))


# ---------------------------------------------------------------------------------------
# probe --dsn / --pid: EXPLAIN's per-node table always, uprobe counts where allowed

# what each function-level count is predicted from (profkit.analyze.predict's totals)
_PREDICTED_TOTAL = {"InstrStartNode": "instr_start_node", "InstrStopNode": "instr_stop_node",
                    "ExecProcNodeInstr": "exec_proc_node_instr", "clock_gettime": "clock_reads"}


@dataclass
class AttachedProbe:
    """What ``profkit probe --dsn`` / ``--pid`` found (see :func:`probe_attached`)."""

    pid: int
    mode: str | None
    #: plan_nodes: the EXPLAIN (ANALYZE, FORMAT JSON) nodes with the prediction; measured
    #: per-node columns only when the binary has DWARF. Empty for --pid.
    nodes: pd.DataFrame
    #: function, calls (measured; None: not visible in this binary), predicted, difference
    functions: pd.DataFrame
    level: str  # "dwarf" | "dynsym" | "addresses" | "none" (no uprobes were attached)
    allowed: str  # one line: what the binary and the privileges allowed
    notes: list[str]
    tool: str = ""
    query_ms: float = float("nan")
    plan: Any = None
    outside_clock_reads: int | None = None


def _can_probe(pid: int) -> tuple[BinaryReport | None, str]:
    """(report, "") when uprobes can attach to *pid*'s binary, else (report or None, why not)."""
    if os.geteuid() != 0:
        return None, ("uprobe counts need root (or CAP_BPF + CAP_PERFMON): run profkit as root; "
                      "the EXPLAIN table needs nothing beyond the connecting role")
    try:
        exe = check_backend(pid)
    except AttachError as e:
        return None, (f"no uprobe counts: {e} (a server on another machine cannot be probed "
                      "from here; run profkit there)")
    rep = binary_report(exe)
    if rep.level == "addresses":
        return rep, f"no uprobe counts: {rep.describe()}"
    return rep, ""


def _settings_note(conn: Any) -> str | None:
    row = conn.execute("SELECT count(*) FROM pg_settings WHERE name = "
                       "'shared_preload_libraries'").fetchone()
    if row and int(row[0]) == 0:
        return ("shared_preload_libraries is not readable by this role (superuser or "
                "pg_read_all_settings can read it): the predictions assume no "
                "pg_stat_statements")
    return None


def probe_attached(*, dsn: str | None = None, sql: str | None = None, pid: int | None = None,
                   seconds: float = 10.0, mode: str = "analyze_timing", tool: str = "auto",
                   force: bool = False, out_dir: Path | None = None, run_id: str = "",
                   query: str = "", progress: Callable[[str], None] | None = None
                   ) -> AttachedProbe:
    """Per-node EXPLAIN table and uprobe counts on a backend profkit did not start.

    ``dsn`` + ``sql``: connect, take ``pg_backend_pid()``, run ``EXPLAIN (ANALYZE, TIMING
    on/off, FORMAT JSON)`` of *sql* there — the per-node table (rows, loops, predicted
    InstrStartNode/clock reads per node) needs nothing beyond the connecting role. Where
    the binary and the privileges allow, uprobes count during that same EXPLAIN: per node
    with DWARF (:func:`profkit.experiments.probe.probe_nodes`), per function with dynamic
    symbols only (InstrStartNode/InstrStopNode/InstrEndLoop/MultiExecProcNode and libc's
    clock_gettime, filtered to the backend's pid). ``pid``: function-level counts of
    whatever that backend runs for *seconds* (or until it exits); no EXPLAIN. Nothing on
    the server is changed (no SET, no extension).
    """
    say = progress or (lambda _m: None)
    if (pid is None) == (dsn is None):
        raise AttachError("give --pid PID or --dsn DSN (one of them)")
    if dsn is not None and not sql:
        raise AttachError("with --dsn, give the query: --sql SELECT... or --workload FILE "
                          "--query NAME")
    if pid is not None and sql:
        raise AttachError("--pid counts what the backend runs for --seconds; to run a query "
                          "use --dsn")
    if mode not in ("analyze_timing", "analyze_notiming"):
        raise AttachError("probe runs EXPLAIN ANALYZE: --mode analyze_timing or "
                          "analyze_notiming")
    notes: list[str] = []
    if pid is not None:
        if seconds <= 0:
            raise AttachError(f"--seconds must be > 0, got {seconds:g}")
        check_backend(pid)  # not a backend: one clear error before anything else
        rep, why = _can_probe(pid)
        if why:
            raise AttachError(why)
        assert rep is not None
        fns = _visible_functions(rep)
        say(rep.describe())

        def wait() -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end and Path(f"/proc/{pid}").exists():
                time.sleep(min(0.1, max(0.0, end - time.monotonic())))

        res = bpf.probe_query(None, pid=pid, runner=wait, functions=fns, per_node=False,
                              tool=tool, out_dir=out_dir)
        functions = pd.DataFrame({"function": fns,
                                  "calls": pd.array([res.calls(f) for f in fns], dtype="Int64")})
        return AttachedProbe(pid, None, pd.DataFrame(), functions, rep.level,
                             _allowed(rep, per_node=False), notes, res.tool, res.query_ms)

    assert dsn is not None and sql is not None
    conn = connect_dsn(dsn)
    with conn:
        check_query(conn, sql)
        pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        note = _settings_note(conn)
        if note:
            notes.append(note)
        ctx = predict.context_from_conn(conn, mode)
        rep, why = _can_probe(pid)
        if rep is not None:
            say(rep.describe())
        if why:
            notes.append(why)
            say(why)
            try:
                plan = conn.execute(EXPLAIN[mode] + sql).fetchone()[0]
            except psycopg.Error as e:
                raise _sql_failed(e, sql) from None
            # the server's own figure (repetitions are timed only by the harness)
            query_ms = float(plan[0].get("Execution Time") or float("nan"))
            pr = predict.predict(plan, ctx)
            table = predict.plan_nodes_table(pr, run_id=run_id, query=query or sql)
            functions = _function_table({}, pr.totals, ())
            return AttachedProbe(pid, mode, table, functions, rep.level if rep else "none",
                                 why, notes, "", query_ms, plan)
        assert rep is not None
        if rep.level == "dwarf":
            table, res = probe_nodes(conn, sql, mode=mode, tool=tool, force=force,
                                     out_dir=out_dir, run_id=run_id, query=query)
            plan = res.query_result[0][0]
            pr = predict.predict(plan, ctx)
            counts = {f: res.calls(f) for f in res.attached}
            return AttachedProbe(pid, mode, table, _function_table(counts, pr.totals,
                                                                   res.attached),
                                 rep.level, _allowed(rep, per_node=True), notes, res.tool,
                                 res.query_ms, plan, res.outside_clock_reads)
        fns = _visible_functions(rep)
        plan0, base_ms = _baseline(conn, sql)
        pr0 = predict.predict(plan0, ctx)
        bpf.guard(bpf.estimate_probe_hits(pr0.nodes, fns, per_node=False), base_ms, force=force)
        say(f"probing backend {pid}: {', '.join(fns)}")
        res = bpf.probe_query(conn, EXPLAIN[mode] + sql, functions=fns, per_node=False,
                              tool=tool, out_dir=out_dir)
        plan = res.query_result[0][0]
        pr = predict.predict(plan, ctx)
        table = predict.plan_nodes_table(pr, run_id=run_id, query=query or sql)
        counts = {f: res.calls(f) for f in res.attached}
        functions = _function_table(counts, pr.totals, res.attached)
        if res.fallback_reason:
            notes.append(res.fallback_reason)
        return AttachedProbe(pid, mode, table, functions, rep.level,
                             _allowed(rep, per_node=False), notes, res.tool, res.query_ms, plan)


def _visible_functions(rep: BinaryReport) -> list[str]:
    """The probe functions the binary defines (all of them with DWARF/.symtab; the exported
    ones of a stripped binary), then libc's clock_gettime."""
    syms = bpf.binary_symbols(rep.path, list(bpf.BINARY_FUNCTIONS))
    return [f for f in bpf.BINARY_FUNCTIONS if f in syms] + list(bpf.LIBC_FUNCTIONS)


def _allowed(rep: BinaryReport, *, per_node: bool) -> str:
    have = _visible_functions(rep)
    hidden = [f for f in bpf.BINARY_FUNCTIONS if f not in have]
    what = "per-node and per-function counts" if per_node else "per-function counts"
    s = f"{rep.level}: {what} ({', '.join(have)})"
    if hidden:
        s += f"; not visible: {', '.join(hidden)} (static, stripped)"
    if not per_node:
        s += ("; per-node counts need DWARF (a -dbgsym package of this version, or a profkit "
              "build of it)")
    return s


def _function_table(counts: dict[str, int | None], totals: dict[str, Any],
                    attached: Any) -> pd.DataFrame:
    rows = []
    for fn in (*bpf.BINARY_FUNCTIONS, *bpf.LIBC_FUNCTIONS):
        pred = totals.get(_PREDICTED_TOTAL.get(fn, ""))
        got = counts.get(fn) if fn in attached else None
        rows.append({"function": fn, "calls": got,
                     "predicted": int(pred) if pred is not None else None,
                     "difference": (got - int(pred)) if got is not None and pred is not None
                     else None})
    df = pd.DataFrame(rows)
    for c in ("calls", "predicted", "difference"):
        df[c] = pd.array(df[c], dtype="Int64")
    return df
