"""The ``clock-calls`` and ``probe`` runs: a target (a profkit cluster, a DSN, a backend's
pid) → a run directory → the tables, with the text and JSON that show them.

The measurements are :mod:`profkit.experiments.probe`'s (a profkit cluster) and
:mod:`profkit.experiments.attach`'s (a server profkit did not start); this module picks
the target, names the run and writes what the command shows, so the command only parses
its options and prints a :class:`ProbeRun`.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from profkit import rundir
from profkit.collect import bpf
from profkit.errors import ProbeError
from profkit.experiments.attach import binary_report, check_backend, probe_attached
from profkit.experiments.probe import (
    check_query,
    clock_calls,
    ltrace_counts,
    probe_nodes,
    select_sql,
    write_parquet,
)
from profkit.pg.cluster import connect_detached, connect_dsn, redact_dsn

Say = Callable[[str], None]

#: the per-node columns ``profkit probe`` shows
NODE_COLUMNS = ["node_id", "node_type", "parent_id", "rows", "loops", "exec_calls_predicted",
                "exec_calls_measured", "clock_calls_predicted", "clock_calls_measured", "exact"]


def _fmt(v: float) -> str:
    return f"{v:.1f}"


@dataclass
class ProbeRun:
    """A clock-calls or probe run: its tables (shown in order), the lines after them, and
    the JSON document of ``--json``."""

    run_id: str
    run_dir: Path
    tables: list[pd.DataFrame]
    doc: dict[str, Any]
    lines: list[str] = field(default_factory=list)
    before: list[str] = field(default_factory=list)  # lines shown before the tables
    float_format: Callable[[float], str] | None = None

    def console(self) -> str:
        """The run as text: lines, tables, notes and where it was written."""
        out = list(self.before)
        out += [t.to_string(index=False, float_format=self.float_format, na_rep="-")
                for t in self.tables]
        return "\n".join([*out, *self.lines, f"written to {self.run_dir}"])

    def _repr_html_(self) -> str:
        return "".join(t.to_html(index=False) for t in self.tables) + \
            f"<p>written to {self.run_dir}</p>"


def _target_facts(pid: int, exe: Path, say: Say) -> dict[str, Any]:
    rep = binary_report(exe)
    say(f"binary: {rep.describe()}")
    return {"pid": pid, "binary": str(rep.path), "binary_level": rep.level,
            "binary_report": rep.describe(), "version": rep.version}


def clock_calls_run(workload: str | None, sql: str | None, query: str | None, *,
                    cluster: str | None = None, dsn: str | None = None,
                    modes: Sequence[str] = ("analyze_timing",),
                    methods: Sequence[str] = ("ltrace", "bcc"), force: bool = False,
                    out: str | None = None, progress: Say | None = None) -> ProbeRun:
    """clock_gettime calls of a query on a profkit cluster (*cluster*) or on any server
    (*dsn*: the query runs on that connection, its backend is traced), per mode and
    method, beside the prediction (:func:`profkit.experiments.probe.clock_calls`)."""
    say = progress or (lambda _m: None)
    name, select = select_sql(workload, sql, query)
    target: dict[str, Any] = {}
    if dsn is not None:
        conn = connect_dsn(dsn)
        pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        target = {"target": _target_facts(pid, check_backend(pid), say)}
    else:
        assert cluster is not None
        conn = connect_detached(cluster)
    with conn:
        check_query(conn, select)
        with rundir.open_run("clock-calls", path=out, workload=name, sql=select,
                             tools=("ltrace", "bpftrace"), **target) as rd:
            run_id, d = rd.run_id, rd.path
            df = clock_calls(conn, select, modes=modes, methods=methods, force=force,
                             out_dir=d, run_id=run_id)
    shown = df.drop(columns=["run_id"])
    return ProbeRun(run_id, d, [shown],
                    {"run_dir": str(d), "run_id": run_id, "query": name, "sql": select,
                     "clock_calls": shown},
                    ["ltrace cannot see calls from extension modules (pg_stat_statements: 2 "
                     "per EXPLAIN); the predictions account for it."], float_format=_fmt)


def clock_calls_pid_run(pid: int, seconds: float, methods: Sequence[str],
                        out: str | None = None, progress: Say | None = None) -> ProbeRun:
    """Each method counts backend *pid*'s clock_gettime calls for *seconds* (one window
    after the other: the counts describe different moments). No query of ours, no
    prediction."""
    say = progress or (lambda _m: None)
    if seconds <= 0:
        raise ProbeError(f"--seconds must be > 0, got {seconds:g}")
    facts = _target_facts(pid, check_backend(pid), say)

    def wait() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and Path(f"/proc/{pid}").exists():
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    with rundir.open_run("clock-calls", path=out, workload=f"pid {pid}", tools=("ltrace",),
                         target={"pid": pid, "binary": facts["binary"],
                                 "binary_level": facts["binary_level"],
                                 "seconds": seconds}) as rd:
        run_id, d = rd.run_id, rd.path
        rows = []
        for method in methods:
            if method == "ltrace":
                say("ltrace: each traced call costs ~100 µs in the backend while attached")
                df, lrun = ltrace_counts(None, None, pid=pid, runner=wait,
                                         out_dir=d / "ltrace", run_id=run_id)
                calls = int(df.set_index("function")["calls"].get("clock_gettime", 0))
                ms = lrun.query_ms
            else:
                res = bpf.probe_query(None, pid=pid, runner=wait, functions=["clock_gettime"],
                                      per_node=False, tool=method, out_dir=d / method)
                calls, ms = res.calls("clock_gettime") or 0, res.query_ms
            rows.append({"run_id": run_id, "pid": pid, "method": method, "measured": calls,
                         "seconds": round(ms / 1000, 3),
                         "per_second": calls / max(ms / 1000, 1e-9)})
        table = pd.DataFrame(rows)
        write_parquet(table, d / "clock_calls.parquet")
    shown = table.drop(columns=["run_id"])
    return ProbeRun(run_id, d, [shown],
                    {"run_dir": str(d), "run_id": run_id, "pid": pid,
                     "binary_level": facts["binary_level"], "clock_calls": shown},
                    float_format=_fmt)


def probe_run(workload: str | None, sql: str | None, query: str | None, *,
              cluster: str | None = None, dsn: str | None = None, pid: int | None = None,
              seconds: float = 10.0, mode: str = "analyze_timing", tool: str = "auto",
              force: bool = False, out: str | None = None,
              progress: Say | None = None) -> ProbeRun:
    """Per plan node, measured ExecProcNode calls and clock reads beside the prediction:
    on a profkit *cluster* (:func:`profkit.experiments.probe.probe_nodes`), or on a server
    profkit did not start, by *dsn* or *pid* (:func:`profkit.experiments.attach.probe_attached`)."""
    say = progress or (lambda _m: None)
    if cluster is None:
        return _probe_attached_run(workload, sql, query, dsn, pid, seconds, mode, tool, force,
                                   out, say)
    name, select = select_sql(workload, sql, query)
    with connect_detached(cluster) as conn:
        check_query(conn, select)
        with rundir.open_run("probe", path=out, workload=name, sql=select, mode=mode,
                             tools=("bpftrace",)) as rd:
            run_id, d = rd.run_id, rd.path
            table, res = probe_nodes(conn, select, mode=mode, tool=tool, force=force,
                                     out_dir=d, run_id=run_id, query=name)
    if res.fallback_reason:
        say(res.fallback_reason)
    nodes = table[[c for c in NODE_COLUMNS if c in table]]
    functions = res.functions[["function", "calls"]]
    return ProbeRun(run_id, d, [nodes, functions],
                    {"run_dir": str(d), "run_id": run_id, "query": name, "sql": select,
                     "mode": mode, "tool": res.tool, "query_ms": res.query_ms,
                     "outside_clock_reads": res.outside_clock_reads,
                     "fallback_reason": res.fallback_reason,
                     "nodes": nodes, "functions": functions},
                    [f"clock reads outside any node: {res.outside_clock_reads}; tool "
                     f"{res.tool}; probed query {res.query_ms:.1f} ms"])


def _probe_attached_run(workload: str | None, sql: str | None, query: str | None,
                        dsn: str | None, pid: int | None, seconds: float, mode: str, tool: str,
                        force: bool, out: str | None, say: Say) -> ProbeRun:
    if pid is not None:
        name, select = f"pid {pid}", None
    else:
        name, select = select_sql(workload, sql, query)
    # a DSN that does not connect or a pid that is no backend: one line, no run directory
    if dsn is not None:
        connect_dsn(dsn).close()
    else:
        assert pid is not None
        check_backend(pid)
    with rundir.open_run("probe", path=out, workload=name, sql=select, mode=mode,
                         tools=("bpftrace",),
                         target={"pid": pid, "dsn": redact_dsn(dsn) if dsn else None}) as rd:
        run_id, d = rd.run_id, rd.path
        res = probe_attached(dsn=dsn, sql=select, pid=pid, seconds=seconds, mode=mode,
                             tool=tool, force=force, out_dir=d, run_id=run_id, query=name,
                             progress=say)
        if len(res.nodes):
            write_parquet(res.nodes, d / "plan_nodes.parquet")
        write_parquet(res.functions, d / "functions.parquet")
        (d / "attached.json").write_text(json.dumps(
            {"pid": res.pid, "level": res.level, "allowed": res.allowed, "notes": res.notes,
             "tool": res.tool, "query_ms": res.query_ms, "plan": res.plan}, indent=1,
            default=str))
    nodes = res.nodes[[c for c in NODE_COLUMNS if c in res.nodes]] if len(res.nodes) \
        else res.nodes
    return ProbeRun(run_id, d, [nodes, res.functions] if len(nodes) else [res.functions],
                    {"run_dir": str(d), "run_id": run_id, "query": name, "sql": select,
                     "mode": res.mode, "pid": res.pid, "binary_level": res.level,
                     "allowed": res.allowed, "notes": res.notes, "tool": res.tool,
                     "query_ms": res.query_ms, "nodes": nodes, "functions": res.functions},
                    before=[f"backend {res.pid}: {res.allowed}",
                            *(f"note: {n}" for n in res.notes)])
