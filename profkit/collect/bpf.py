"""eBPF uprobes on a running backend: instrumentation calls and clock reads per plan node.

What is counted, for one query run on one backend (filtered to its pid):

- calls of ``ExecProcNodeInstr``, ``ExecProcNodeFirst``, ``MultiExecProcNode``,
  ``InstrStartNode``, ``InstrStopNode``, ``InstrEndLoop``,
  ``ExecShutdownNode_walker`` in the backend binary (only those present: builds
  with the "inline Instr*" patches have no InstrStartNode symbol any more) and
  of ``clock_gettime`` in the libc the backend has mapped;
- per plan node (``per_node=True``): the probe on ``ExecProcNodeInstr`` reads
  its argument ``PlanState *ps``, then ``ps->plan->plan_node_id`` and the node
  tags ``ps->plan->type`` / ``ps->type`` using member offsets read from the
  binary's DWARF (:mod:`profkit.collect.dwarf`, passed to the BPF C text as
  ``#define``\\ s), and counts calls per ``plan_node_id``.  The same for
  ``ExecProcNodeFirst`` (first call of a node), ``MultiExecProcNode`` (Hash,
  bitmap nodes) and ``ExecShutdownNode_walker``.  Each clock_gettime hit is
  charged to the innermost node executing at that moment: entry probes on
  ExecProcNodeInstr / MultiExecProcNode / ExecShutdownNode_walker push the node
  on a small stack kept in a BPF array (the backend is single-threaded),
  return probes pop it.  A node's own InstrStartNode/InstrStopNode reads happen
  inside its own ExecProcNodeInstr frame, so they land on that node; reads
  outside any node (EXPLAIN's own brackets, pg_stat_statements) land on node -1.

bcc (Debian's python3-bpfcc, made importable from the venv and given kernel
headers by :mod:`profkit.collect.kheaders`) is the first choice.  When it is not
installed or its compile fails, an equivalent bpftrace script is generated (with
``/pid == N/`` filters: ``bpftrace -p`` does not filter uprobes here) and its
JSON map output parsed; the result says which tool ran and why.

Every probe is detached on the way out — normal end, exception, Ctrl-C or
SIGTERM — and a backend that dies mid-query raises :class:`ProbeError` whose
``partial`` attribute holds what was counted until then.

Cost: ~1 µs per hit on a function in the postgres binary, ~6 µs on libc's
clock_gettime (its first instruction is single-stepped), uretprobes cost a hit
each too.  :func:`estimate_probe_hits` and :func:`guard` check the bill against
the query's own time before attaching.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from profkit import tables
from profkit.collect import dwarf, kheaders
from profkit.collect.kheaders import BccUnavailable
from profkit.errors import ProbeError, ProfkitError
from profkit.processes import Background, run, which

# Functions in the backend binary.  Candidates per logical name, first found wins:
# gcc splits ExecShutdownNode_walker into a NULL-check wrapper and a ".part.0"
# body that both ExecShutdownNode and the wrapper jump to, so the body sees
# every non-NULL node.
BINARY_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "ExecProcNodeInstr": ("ExecProcNodeInstr",),
    "ExecProcNodeFirst": ("ExecProcNodeFirst",),
    "MultiExecProcNode": ("MultiExecProcNode",),
    "InstrStartNode": ("InstrStartNode",),
    "InstrStopNode": ("InstrStopNode",),
    "InstrEndLoop": ("InstrEndLoop",),
    "ExecShutdownNode_walker": ("ExecShutdownNode_walker.part.0", "ExecShutdownNode_walker"),
}
LIBC_FUNCTIONS = ("clock_gettime",)
# index of each function in the BPF "fcount" array
FUNC_INDEX: dict[str, int] = {n: i for i, n in enumerate(
    [*BINARY_FUNCTIONS, *LIBC_FUNCTIONS])}
PHASES = {0: "exec", 1: "multiexec", 2: "shutdown", 3: "outside"}
MAX_DEPTH = 128
DEFAULT_COST_NS = {"uprobe": 1000.0, "uretprobe": 1000.0, "uprobe_libc": 6000.0,
                   "ltrace": 100000.0}


# ---------------------------------------------------------------------------
# Is this pid a postgres backend?


@dataclass(frozen=True)
class BackendInfo:
    pid: int
    exe: Path
    cmdline: str
    ppid: int
    libc: Path | None


def _read(p: Path) -> str:
    try:
        return p.read_text(errors="replace")
    except OSError:
        return ""


def libc_path(pid: int) -> Path | None:
    """The libc the process has mapped (from /proc/PID/maps)."""
    for line in _read(Path(f"/proc/{pid}/maps")).splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6:
            path = parts[5].strip()
            name = os.path.basename(path)
            if re.fullmatch(r"libc(\.so\.\d+|-[\d.]+\.so)", name):
                return Path(path)
    return None


def backend_info(pid: int) -> BackendInfo:
    """Check that *pid* is a live PostgreSQL backend; raise ProbeError otherwise."""
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        raise ProbeError(f"pid must be an integer, got {pid!r}") from None
    proc = Path(f"/proc/{pid}")
    if not proc.exists():
        raise ProbeError(f"no process with pid {pid}: the backend has exited (or the pid is "
                         "wrong); get it with SELECT pg_backend_pid() on the connection")
    try:
        exe = Path(os.readlink(proc / "exe"))
    except OSError as e:
        raise ProbeError(f"cannot read /proc/{pid}/exe ({e.strerror}): run as root") from None
    cmdline = _read(proc / "cmdline").replace("\0", " ").strip()
    stat = _read(proc / "stat")
    ppid = int(stat.rsplit(")", 1)[1].split()[1]) if ")" in stat else 0
    if exe.name.replace(" (deleted)", "") != "postgres":
        raise ProbeError(f"pid {pid} is not a PostgreSQL backend: it runs {exe} ({cmdline!r})")
    if str(exe).endswith(" (deleted)"):
        raise ProbeError(f"the binary of pid {pid} was replaced on disk ({exe}): restart the "
                         "cluster so the probe and the process agree")
    if not cmdline.startswith("postgres:"):
        raise ProbeError(f"pid {pid} is a postgres process but not a backend ({cmdline!r}): "
                         "probe the pid from SELECT pg_backend_pid()")
    parent_exe = ""
    with contextlib.suppress(OSError):
        parent_exe = os.readlink(f"/proc/{ppid}/exe")
    if os.path.basename(parent_exe) != "postgres":
        raise ProbeError(f"pid {pid}'s parent ({ppid}) is not a postmaster")
    return BackendInfo(pid, exe, cmdline, ppid, libc_path(pid))


@dataclass(frozen=True)
class ProbeTarget:
    """The process and files the probes attach to."""

    pid: int
    binary_path: Path
    libc: Path | None


@dataclass(frozen=True)
class Symbol:
    name: str
    address: int


def binary_symbols(binary: Path, names: Sequence[str]) -> dict[str, Symbol]:
    """Which of *names* (or their gcc clones) the binary defines: logical name -> symbol."""
    defined: dict[str, int] = {}
    # .symtab (static functions too), then .dynsym: a stripped binary such as
    # Debian's keeps only the exported functions (InstrStartNode, ...), which
    # uprobes can still use.
    for extra in ([], ["-D"]):
        cp = run([which("nm"), *extra, "--defined-only", str(binary)], timeout=120, what="nm",
                 check=False)
        for line in cp.stdout.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "tTwWiI":
                defined.setdefault(parts[2].split("@")[0], int(parts[0], 16))
    out = {}
    for n in names:
        for cand in BINARY_FUNCTIONS.get(n, (n,)):
            if cand in defined:
                out[n] = Symbol(cand, defined[cand])
                break
    return out


# ---------------------------------------------------------------------------
# Results


@dataclass
class ProbeResult:
    """What one probed query produced (``tool`` is "bcc" or "bpftrace")."""

    tool: str
    pid: int
    binary: Path
    libc: Path | None
    functions: pd.DataFrame                 # functions table: function, module, calls
    nodes: pd.DataFrame                     # per plan_node_id (empty if per_node False)
    outside_clock_reads: int = 0            # clock reads with no node executing
    query_ms: float = float("nan")
    attached: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    fallback_reason: str = ""
    errors: dict[str, int] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    query_result: Any = None

    def calls(self, function: str) -> int | None:
        r = self.functions.loc[self.functions["function"] == function, "calls"]
        return None if r.empty or pd.isna(r.iloc[0]) else int(r.iloc[0])


class PartialProbe(ProbeError):
    """The probe stopped early (backend exited, query failed); ``partial`` keeps the counts."""

    def __init__(self, message: str, partial: Any) -> None:
        super().__init__(message)
        self.partial = partial


# ---------------------------------------------------------------------------
# Cost guard


def estimate_probe_hits(plan_nodes: pd.DataFrame, functions: Sequence[str],
                        per_node: bool = True, constants: int = 8) -> dict[str, int]:
    """Predicted probe hits per function from a predicted plan_nodes table.

    *plan_nodes* is :func:`profkit.analyze.predict.predict`'s ``nodes`` (TIMING
    mode decides clock_calls_predicted).  With *per_node*, return probes on
    ExecProcNodeInstr / MultiExecProcNode / ExecShutdownNode_walker double their
    hits.  *constants* adds the per-query clock reads (EXPLAIN, pgss).
    """
    def col(name: str) -> int:
        return int(plan_nodes[name].fillna(0).sum()) if name in plan_nodes else 0

    executed = int((plan_nodes["loops"].fillna(0) > 0).sum()) if "loops" in plan_nodes else 0
    ret = 2 if per_node else 1
    table = {
        "ExecProcNodeInstr": col("exec_calls_predicted") * ret,
        "ExecProcNodeFirst": executed,
        "MultiExecProcNode": col("multiexec_calls_predicted") * ret,
        "InstrStartNode": col("instr_start_predicted"),
        "InstrStopNode": col("instr_start_predicted"),
        "InstrEndLoop": col("instr_endloop_predicted"),
        "ExecShutdownNode_walker": len(plan_nodes) * ret,
        "clock_gettime": col("clock_calls_predicted") + constants,
    }
    unknown = [f for f in functions if f not in table]
    if unknown:
        raise ProbeError(f"no hit estimate for {unknown}; known: {', '.join(table)}")
    return {f: table[f] for f in functions}


def probe_cost_ms(estimated_hits: Mapping[str, int] | int, method: str = "uprobe",
                  cost_ns_per_hit: Mapping[str, float] | None = None) -> float:
    costs = {**DEFAULT_COST_NS, **(cost_ns_per_hit or {})}
    if isinstance(estimated_hits, int):
        return estimated_hits * costs[method] / 1e6
    total = 0.0
    for fn, hits in estimated_hits.items():
        if method == "ltrace":
            kind = "ltrace"
        else:
            kind = "uprobe_libc" if fn in LIBC_FUNCTIONS else "uprobe"
        total += hits * costs[kind]
    return total / 1e6


def guard(estimated_hits: Mapping[str, int] | int, query_ms: float,
          cost_ns_per_hit: Mapping[str, float] | None = None, *, method: str = "uprobe",
          max_factor: float = 10.0, min_budget_ms: float = 2000.0, force: bool = False) -> float:
    """Refuse a probe that would multiply the query's time; return the estimated cost (ms).

    The budget is ``max(max_factor × query_ms, min_budget_ms)``: a probe that
    adds a second or two to a 3 ms query is fine, one that turns a 10 s query
    into 20 minutes is not.  ``force=True`` only returns the estimate.
    """
    est = probe_cost_ms(estimated_hits, method, cost_ns_per_hit)
    budget = max(max_factor * float(query_ms), min_budget_ms)
    if est > budget and not force:
        hits = estimated_hits if isinstance(estimated_hits, int) else sum(estimated_hits.values())
        cheaper = ("perf sampling (`profkit perf`, ~1-3% overhead), or bcc uprobes on the "
                   "binary's functions without clock_gettime" if method != "ltrace" else
                   "bcc uprobes (`profkit probe`, ~1-6 µs per hit instead of ~100 µs)")
        raise ProbeError(
            f"probing would cost ~{est / 1000:.1f} s ({hits:,} hits by {method}) for a query "
            f"that runs {query_ms:.1f} ms ({est / max(query_ms, 1e-3):.0f}× its time, budget "
            f"{budget / 1000:.1f} s). Use a smaller scale, a cheaper method ({cheaper}), or "
            "pass --force (force=True) to probe anyway.")
    return est


# ---------------------------------------------------------------------------
# BPF program text


BPF_TEMPLATE = r"""
#include <uapi/linux/ptrace.h>

__DEFINES__
#define TARGET_PID __PID__
#define MAX_DEPTH __MAX_DEPTH__
#define NFUNC __NFUNC__

BPF_ARRAY(fcount, u64, NFUNC);
BPF_HASH(exec_calls, s32, u64, 8192);
BPF_HASH(first_calls, s32, u64, 8192);
BPF_HASH(multi_calls, s32, u64, 8192);
BPF_HASH(shut_calls, s32, u64, 8192);
BPF_HASH(plan_tag, s32, u32, 8192);
BPF_HASH(ps_tag, s32, u32, 8192);
BPF_HASH(clock_by_node, u64, u64, 16384);
BPF_ARRAY(stack_node, s32, MAX_DEPTH);
BPF_ARRAY(stack_phase, u32, MAX_DEPTH);
BPF_ARRAY(depth, u32, 1);
BPF_ARRAY(errors, u64, 4);   /* 0 overflow, 1 underflow, 2 read failed */
/* 1 while counting: opened once every probe is attached, closed before the maps are
 * read, so all functions count over one window (attaching and reading take time while
 * the backend runs: a probe attached first would count calls the others miss) */
BPF_ARRAY(gate, u32, 1);

static __always_inline int other_pid(void)
{
    u32 z = 0;
    u32 *open = gate.lookup(&z);
    if (!open || *open == 0)
        return 1;
    return (bpf_get_current_pid_tgid() >> 32) != TARGET_PID;
}

static __always_inline void bump(int idx)
{
    u32 k = idx;
    u64 *v = fcount.lookup(&k);
    if (v)
        __sync_fetch_and_add(v, 1);
}

static __always_inline void err(int idx)
{
    u32 k = idx;
    u64 *v = errors.lookup(&k);
    if (v)
        __sync_fetch_and_add(v, 1);
}

#if PER_NODE
static __always_inline int read_node(struct pt_regs *ctx, s32 *id)
{
    void *ps = (void *) PT_REGS_PARM1(ctx);
    void *plan = 0;
    u32 ptag = 0, stag = 0;

    if (bpf_probe_read_user(&plan, sizeof(plan), ps + OFF_PS_PLAN) != 0 || plan == 0 ||
        bpf_probe_read_user(id, sizeof(*id), plan + OFF_PLAN_NODE_ID) != 0) {
        err(2);
        return -1;
    }
    if (plan_tag.lookup(id) == 0) {
        bpf_probe_read_user(&ptag, sizeof(ptag), plan + OFF_PLAN_TYPE);
        bpf_probe_read_user(&stag, sizeof(stag), ps + OFF_PS_TYPE);
        plan_tag.update(id, &ptag);
        ps_tag.update(id, &stag);
    }
    return 0;
}

static __always_inline void push(s32 id, u32 phase)
{
    u32 z = 0;
    u32 *d = depth.lookup(&z);
    if (!d)
        return;
    u32 i = *d;
    if (i < MAX_DEPTH) {
        stack_node.update(&i, &id);
        stack_phase.update(&i, &phase);
    } else {
        err(0);
    }
    *d = i + 1;
}

static __always_inline void pop(void)
{
    u32 z = 0;
    u32 *d = depth.lookup(&z);
    if (!d)
        return;
    if (*d == 0) {
        err(1);
        return;
    }
    *d = *d - 1;
}
#endif

int on_exec_instr(struct pt_regs *ctx)
{
    s32 id = -1;
    if (other_pid())
        return 0;
    bump(__IDX_ExecProcNodeInstr__);
#if PER_NODE
    if (read_node(ctx, &id) == 0)
        exec_calls.increment(id);
    push(id, 0);
#endif
    return 0;
}

int on_exec_first(struct pt_regs *ctx)
{
    s32 id = -1;
    if (other_pid())
        return 0;
    bump(__IDX_ExecProcNodeFirst__);
#if PER_NODE
    if (read_node(ctx, &id) == 0)
        first_calls.increment(id);
#endif
    return 0;
}

int on_multi(struct pt_regs *ctx)
{
    s32 id = -1;
    if (other_pid())
        return 0;
    bump(__IDX_MultiExecProcNode__);
#if PER_NODE
    if (read_node(ctx, &id) == 0)
        multi_calls.increment(id);
    push(id, 1);
#endif
    return 0;
}

int on_shutdown(struct pt_regs *ctx)
{
    s32 id = -1;
    if (other_pid())
        return 0;
    bump(__IDX_ExecShutdownNode_walker__);
#if PER_NODE
    if (read_node(ctx, &id) == 0)
        shut_calls.increment(id);
    push(id, 2);
#endif
    return 0;
}

#if PER_NODE
int on_return_pop(struct pt_regs *ctx)
{
    if (other_pid())
        return 0;
    pop();
    return 0;
}
#endif

int on_instr_start(struct pt_regs *ctx)
{
    if (!other_pid())
        bump(__IDX_InstrStartNode__);
    return 0;
}

int on_instr_stop(struct pt_regs *ctx)
{
    if (!other_pid())
        bump(__IDX_InstrStopNode__);
    return 0;
}

int on_instr_endloop(struct pt_regs *ctx)
{
    if (!other_pid())
        bump(__IDX_InstrEndLoop__);
    return 0;
}

int on_clock(struct pt_regs *ctx)
{
    if (other_pid())
        return 0;
    bump(__IDX_clock_gettime__);
#if PER_NODE
    u32 z = 0;
    u32 *d = depth.lookup(&z);
    s32 node = -1;
    u32 phase = 3;
    if (d && *d > 0) {
        u32 top = *d - 1;
        if (top >= MAX_DEPTH)
            top = MAX_DEPTH - 1;
        s32 *n = stack_node.lookup(&top);
        u32 *p = stack_phase.lookup(&top);
        if (n)
            node = *n;
        if (p)
            phase = *p;
    }
    u64 key = ((u64) phase << 32) | (u32) node;
    clock_by_node.increment(key);
#endif
    return 0;
}
"""


def bpf_text(pid: int, layout: dwarf.ExecutorLayout | None, per_node: bool) -> str:
    text = BPF_TEMPLATE
    defines = layout.c_defines() if layout is not None else ""
    defines += f"#define PER_NODE {1 if per_node and layout is not None else 0}\n"
    text = text.replace("__DEFINES__", defines)
    text = text.replace("__PID__", str(int(pid))).replace("__MAX_DEPTH__", str(MAX_DEPTH))
    text = text.replace("__NFUNC__", str(len(FUNC_INDEX)))
    for name, idx in FUNC_INDEX.items():
        text = text.replace(f"__IDX_{name}__", str(idx))
    return text


# entry handler and whether a return probe pops the node stack
HANDLERS: dict[str, tuple[str, bool]] = {
    "ExecProcNodeInstr": ("on_exec_instr", True),
    "ExecProcNodeFirst": ("on_exec_first", False),
    "MultiExecProcNode": ("on_multi", True),
    "ExecShutdownNode_walker": ("on_shutdown", True),
    "InstrStartNode": ("on_instr_start", False),
    "InstrStopNode": ("on_instr_stop", False),
    "InstrEndLoop": ("on_instr_endloop", False),
}


# ---------------------------------------------------------------------------
# Signal safety: turn SIGTERM into an exception while probes are attached so the
# finally blocks detach them.


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum} while probing")

    # profkit.processes installs its stop-everything SIGTERM handler when the first
    # background process starts; install it now so that we restore it (and not
    # the default) when the probe ends.
    from profkit import processes as _run

    install = getattr(_run, "_install_handlers", None)
    if install is not None:
        install()
    prev = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, prev)


# ---------------------------------------------------------------------------
# bcc


QueryRunner = Callable[[], Any]


def _connection_runner(conn: Any, sql: str) -> QueryRunner:
    def go() -> Any:
        cur = conn.execute(sql)
        try:
            return cur.fetchall()
        except Exception:  # noqa: BLE001 - statements without a result set
            return None
    return go


def is_connection_lost(e: BaseException) -> bool:
    """Whether a query's error means its backend went away (terminated, crashed):
    the client can hear of it before the process has left /proc."""
    name = type(e).__name__
    return name in ("OperationalError", "AdminShutdown", "ConnectionFailure",
                    "InterfaceError") or "terminat" in str(e).lower()


def _nodes_frame(exec_c: dict[int, int], first_c: dict[int, int], multi_c: dict[int, int],
                 shut_c: dict[int, int], clock_c: dict[tuple[int, int], int],
                 ptag: dict[int, int], stag: dict[int, int],
                 layout: dwarf.ExecutorLayout | None) -> tuple[pd.DataFrame, int]:
    ids = sorted({*exec_c, *first_c, *multi_c, *shut_c, *ptag,
                  *(n for (_p, n) in clock_c if n >= 0)})
    rows = []
    for i in ids:
        by_phase = {ph: clock_c.get((k, i), 0) for k, ph in PHASES.items() if k != 3}
        rows.append({
            "node_id": i,
            "node_tag": layout.tag_name(ptag[i]) if layout and i in ptag else None,
            "planstate_tag": layout.tag_name(stag[i]) if layout and i in stag else None,
            "exec_calls": exec_c.get(i, 0), "first_calls": first_c.get(i, 0),
            "multiexec_calls": multi_c.get(i, 0), "shutdown_calls": shut_c.get(i, 0),
            "clock_reads_exec": by_phase["exec"], "clock_reads_multiexec": by_phase["multiexec"],
            "clock_reads_shutdown": by_phase["shutdown"],
            "clock_reads": sum(by_phase.values()),
        })
    outside = sum(v for (p, n), v in clock_c.items() if n < 0 or p == 3)
    cols = ["node_id", "node_tag", "planstate_tag", "exec_calls", "first_calls",
            "multiexec_calls", "shutdown_calls", "clock_reads_exec", "clock_reads_multiexec",
            "clock_reads_shutdown", "clock_reads"]
    df = pd.DataFrame(rows, columns=cols)
    for c in cols[3:]:
        df[c] = df[c].astype("int64")
    return df, outside


def _functions_frame(counts: Mapping[str, int | None], binary: Path, libc: Path | None,
                     tool: str, run_id: str = "", build: str = "") -> pd.DataFrame:
    rows = []
    for fn, c in counts.items():
        rows.append({"run_id": run_id, "build": build, "tool": tool, "function": fn,
                     "module": str(libc if fn in LIBC_FUNCTIONS else binary),
                     "calls": c, "self": float("nan"), "total": float("nan"),
                     "self_share": float("nan")})
    df = pd.DataFrame(rows) if rows else tables.empty("functions")
    return tables.validate(df, "functions")


def _apply_env(env: Mapping[str, str]) -> dict[str, str | None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    return saved


def _restore_env(saved: Mapping[str, str | None]) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def probe_with_bcc(info: ProbeTarget, runner: QueryRunner, *, functions: Sequence[str],
                   layout: dwarf.ExecutorLayout | None, per_node: bool,
                   symbols: Mapping[str, Symbol], out_dir: Path | None = None) -> ProbeResult:
    """Attach bcc uprobes, run the query, read the maps, detach (always)."""
    bcc = kheaders.import_bcc()
    saved = _apply_env(kheaders.ensure_bcc_env())
    text = bpf_text(info.pid, layout, per_node)
    if out_dir is not None:
        (out_dir / "probe.bpf.c").write_text(text)
    try:
        try:
            b = bcc.BPF(text=text.encode(), cflags=["-Wno-ignored-attributes",
                                           "-Wno-unused-function",
                                           "-Wno-duplicate-decl-specifier"])
        except Exception as e:  # noqa: BLE001 - compile errors come as plain Exception
            raise kheaders.BccUnavailable(f"bcc could not compile the probe: {e}") from None
    finally:
        _restore_env(saved)
    attached: list[str] = []
    result: ProbeResult | None = None
    query_error: BaseException | None = None
    t0 = t1 = 0.0
    qres: Any = None
    try:
        with sigterm_raises():
            for fn in functions:
                if fn in LIBC_FUNCTIONS:
                    if info.libc is None:
                        continue
                    attach_uprobe(b, info.libc, fn, "on_clock", info.pid)
                    attached.append(fn)
                    continue
                sym = symbols.get(fn)
                if sym is None:
                    continue
                handler, pops = HANDLERS[fn]
                attach_uprobe(b, info.binary_path, sym.name, handler, info.pid)
                if pops and per_node and layout is not None:
                    attach_uprobe(b, info.binary_path, sym.name, "on_return_pop", info.pid,
                                  ret=True)
                attached.append(fn)
            _set_gate(b, 1)
            t0 = time.perf_counter()
            try:
                qres = runner()
            except Exception as e:  # noqa: BLE001 - keep the counts, report below
                query_error = e
            t1 = time.perf_counter()
            _set_gate(b, 0)
            result = _read_bcc_maps(b, info, functions, attached, layout, per_node)
            result.query_ms = (t1 - t0) * 1000
            result.query_result = qres
    finally:
        b.cleanup()
    assert result is not None
    if query_error is not None:
        if is_connection_lost(query_error) or not Path(f"/proc/{info.pid}").exists():
            raise PartialProbe(f"backend {info.pid} exited during the probe ({query_error}); "
                               "the counts up to that point are in .partial", result)
        raise PartialProbe(f"the query failed during the probe: {query_error}", result)
    return result


_ATTACH_UPROBE: list[Any] = []  # profkit's typed bpf_attach_uprobe, made once


def _libbcc_attach_uprobe() -> Any:
    """libbcc's ``bpf_attach_uprobe`` with its whole C signature.

    Its last parameter is the USDT reference counter's offset (``ref_ctr_offset``, 0 for a
    plain uprobe).  Debian 12's python3-bpfcc (0.26) declares and passes only the first
    six, so the seventh is whatever the caller's stack holds (6 on this machine), and the
    kernel registers the uprobe with that counter offset.  Another tracer's uprobe on the
    same function (bpftrace's, with 0) is then refused with EINVAL for as long as the
    first is attached, and the kernel logs "ref_ctr_offset mismatch".  This function
    object is profkit's own: bcc's stays as bcc declared it."""
    if not _ATTACH_UPROBE:
        import ctypes as ct
        lib = kheaders.import_bcc().libbcc.lib
        fn = type(lib.bpf_attach_uprobe)(("bpf_attach_uprobe", lib))
        fn.restype = ct.c_int
        fn.argtypes = [ct.c_int, ct.c_int, ct.c_char_p, ct.c_char_p, ct.c_ulonglong,
                       ct.c_int, ct.c_uint32]
        _ATTACH_UPROBE.append(fn)
    return _ATTACH_UPROBE[0]


def attach_uprobe(b: Any, path: str | Path, sym: str, fn_name: str, pid: int, *,
                  ret: bool = False) -> str:
    """Attach *b*'s function *fn_name* to *sym* in *path* for process *pid* (a uretprobe
    if *ret*), as ``BPF.attach_uprobe`` does, but with no reference counter (see
    :func:`_libbcc_attach_uprobe`).  The probe is *b*'s: ``b.cleanup()`` detaches it.
    Returns the event name."""
    import ctypes as ct
    bpf_cls = type(b)
    real_path, addr = bpf_cls._check_path_symbol(str(path).encode(), sym.encode(), None,
                                                 pid, 0)
    func = b.load_func(fn_name.encode(), bpf_cls.KPROBE)
    ev_name = b._get_uprobe_evname(b"r" if ret else b"p", real_path, addr, pid)
    fd = _libbcc_attach_uprobe()(func.fd, 1 if ret else 0, ev_name, real_path, addr, pid, 0)
    if fd < 0:
        errno = ct.get_errno()
        raise ProbeError(
            f"the kernel refused a {'uretprobe' if ret else 'uprobe'} on {sym} in {path}"
            + (f" ({os.strerror(errno)})" if errno else "")
            + f".  If the kernel log (dmesg) says 'ref_ctr_offset mismatch', another tracer "
            f"holds a probe on {sym} with a USDT reference counter (Debian's python3-bpfcc "
            "places its own uprobes that way): let it finish, then probe again.")
    b._add_uprobe_fd(ev_name, fd)
    return ev_name.decode()


def _set_gate(b: Any, value: int) -> None:
    """Open (1) or close (0) the probes' counting window (the ``gate`` map)."""
    g = b[b"gate"]
    g[g.Key(0)] = g.Leaf(value)


def _read_bcc_maps(b: Any, info: ProbeTarget, functions: Sequence[str], attached: Sequence[str],
                   layout: dwarf.ExecutorLayout | None, per_node: bool) -> ProbeResult:
    fc = b[b"fcount"]
    counts: dict[str, int | None] = {}
    for fn in functions:
        counts[fn] = int(fc[fc.Key(FUNC_INDEX[fn])].value) if fn in attached else None

    def as_dict(name: str) -> dict[int, int]:
        return {int(k.value): int(v.value) for k, v in b[name.encode()].items()}

    nodes = pd.DataFrame()
    outside = 0
    if per_node and layout is not None:
        clock = {}
        for k, v in b[b"clock_by_node"].items():
            key = int(k.value)
            node = key & 0xFFFFFFFF
            node = node - (1 << 32) if node >= (1 << 31) else node
            clock[(key >> 32, node)] = int(v.value)
        nodes, outside = _nodes_frame(as_dict("exec_calls"), as_dict("first_calls"),
                                      as_dict("multi_calls"), as_dict("shut_calls"), clock,
                                      as_dict("plan_tag"), as_dict("ps_tag"), layout)
    errs = b[b"errors"]
    errors = {name: int(errs[errs.Key(i)].value)
              for i, name in enumerate(("stack_overflow", "stack_underflow", "read_failed"))}
    missing = tuple(f for f in functions if f not in attached)
    return ProbeResult("bcc", info.pid, info.binary_path, info.libc,
                       _functions_frame(counts, info.binary_path, info.libc, "bcc"), nodes,
                       outside, attached=tuple(attached), missing=missing, errors=errors)


# ---------------------------------------------------------------------------
# bpftrace fallback


def bpftrace_script(info: ProbeTarget, functions: Sequence[str], symbols: Mapping[str, Symbol],
                    layout: dwarf.ExecutorLayout | None, per_node: bool) -> str:
    """An equivalent bpftrace program: same counts, same per-node attribution.

    ``-p`` does not filter uprobes on this bpftrace (0.17), so every probe has a
    ``/pid == N/`` predicate.  The node stack lives in maps keyed by depth.
    """
    pid = int(info.pid)
    per_node = per_node and layout is not None
    lines = [f"// generated by profkit for backend {pid}",
             "BEGIN { " + ("@depth = 0; " if per_node else "")
             + "printf(\"profkit-attached\\n\"); }"]
    binp = str(info.binary_path)

    def node_expr() -> str:
        assert layout is not None
        return (f"$ps = (uint64)arg0; "
                f"$plan = *(uint64 *)uptr($ps + {layout.planstate_plan}); "
                f"$id = *(int32 *)uptr($plan + {layout.plan_node_id}); "
                f"@plan_tag[$id] = *(uint32 *)uptr($plan + {layout.plan_type}); ")

    maps = {"ExecProcNodeInstr": ("exec_calls", 0), "ExecProcNodeFirst": ("first_calls", None),
            "MultiExecProcNode": ("multi_calls", 1),
            "ExecShutdownNode_walker": ("shut_calls", 2)}
    for fn in functions:
        if fn in LIBC_FUNCTIONS:
            if info.libc is None:
                continue
            body = f'@fcount["{fn}"] = count(); '
            if per_node:
                body += ("if (@depth > 0) { @clock[@stk_phase[@depth - 1], "
                         "@stk_node[@depth - 1]] = count(); } "
                         "else { @clock[3, -1] = count(); }")
            lines.append(f"uprobe:{info.libc}:{fn} /pid == {pid}/ {{ {body} }}")
            continue
        symbol = symbols.get(fn)
        if symbol is None:
            continue
        # bpftrace 0.17 silently attaches nothing for gcc clone names ("x.part.0"):
        # probe those by address
        sym = (symbol.name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", symbol.name)
               else hex(symbol.address))
        body = f'@fcount["{fn}"] = count(); '
        if per_node and fn in maps:
            mname, phase = maps[fn]
            body += node_expr() + f"@{mname}[$id] = count(); "
            if phase is not None:
                body += (f"@stk_node[@depth] = $id; @stk_phase[@depth] = {phase}; "
                         "@depth = @depth + 1; ")
                lines.append(f"uretprobe:{binp}:{sym} /pid == {pid}/ {{ "
                             "if (@depth > 0) { @depth = @depth - 1; } "
                             "else { @underflow = count(); } }")
        lines.append(f"uprobe:{binp}:{sym} /pid == {pid}/ {{ {body}}}")
    if per_node:
        # the stack maps are working state, not results: keep them out of the output
        lines.append("END { clear(@stk_node); clear(@stk_phase); delete(@depth); }")
    return "\n".join(lines) + "\n"


def parse_bpftrace_json(text: str) -> dict[str, Any]:
    """Maps printed by ``bpftrace -f json`` at exit, as {map name: value or {key: value}}.

    Input:  ``{"type": "map", "data": {"@exec_calls": {"2": 20001, "4": 21}}}``
    Output: ``{"exec_calls": {"2": 20001, "4": 21}}`` (the "@" dropped; multi-key
    maps keep bpftrace's "a,b" key strings).
    """
    out: dict[str, Any] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise ProbeError(f"bpftrace output line {n} is not JSON ({e}): {line[:120]!r}"
                             ) from None
        if obj.get("type") != "map":
            continue
        for k, v in (obj.get("data") or {}).items():
            out[k.lstrip("@")] = v
    return out


def _bpftrace_result(maps: Mapping[str, Any], info: ProbeTarget, functions: Sequence[str],
                     attached: Sequence[str], layout: dwarf.ExecutorLayout | None,
                     per_node: bool) -> ProbeResult:
    fc = maps.get("fcount", {}) or {}
    counts = {fn: (int(fc.get(fn, 0)) if fn in attached else None) for fn in functions}

    def d(name: str) -> dict[int, int]:
        return {int(k): int(v) for k, v in (maps.get(name) or {}).items()}

    nodes = pd.DataFrame()
    outside = 0
    if per_node and layout is not None:
        clock: dict[tuple[int, int], int] = {}
        for k, v in (maps.get("clock") or {}).items():
            ph, node = (int(x) for x in str(k).split(","))
            clock[(ph, node)] = int(v)
        nodes, outside = _nodes_frame(d("exec_calls"), d("first_calls"), d("multi_calls"),
                                      d("shut_calls"), clock, d("plan_tag"), {}, layout)
    missing = tuple(f for f in functions if f not in attached)
    errors = {"stack_underflow": int(maps.get("underflow", 0) or 0)}
    return ProbeResult("bpftrace", info.pid, info.binary_path, info.libc,
                       _functions_frame(counts, info.binary_path, info.libc, "bpftrace"), nodes,
                       outside, attached=tuple(attached), missing=missing, errors=errors)


# bpftrace's own words when the kernel refused a probe (as opposed to a script or
# permission error, which another try would not change)
_ATTACH_REFUSED = "Error attaching probe"


def _start_bpftrace(exe: str, script: Path, out: Path, err: Path, attach_timeout: float,
                    attempts: int) -> Background:
    """bpftrace running *script* and attached (its BEGIN printed), tried up to *attempts*
    times, a second apart, when the kernel refuses a probe.

    The kernel refuses a uprobe on a function another tracer already probes with a
    different USDT reference counter offset ("ref_ctr_offset mismatch" in its log), for
    as long as that tracer stays attached: CI met it when a neighbouring test's bcc probe
    (before profkit passed bcc a zero offset; see :func:`_libbcc_attach_uprobe`) held libc's
    clock_gettime.  This bpftrace (0.17) also ignores ``-p`` for uprobes, so its libc
    probes are placed in every process on the machine.  Each refused try's stderr is kept
    beside the output (``bpftrace.stderr.N``) and named in the error if every try fails."""
    kept: list[Path] = []
    for attempt in range(1, attempts + 1):
        out.write_text("")
        err.write_text("")
        bg = Background([exe, "-f", "json", str(script)], stdout_path=out, stderr_path=err,
                        stop_signal=signal.SIGINT, stop_timeout=60, what="bpftrace")
        bg.start()
        try:
            deadline = time.monotonic() + attach_timeout
            while "profkit-attached" not in out.read_text(errors="replace"):
                if not bg.alive():
                    break
                if time.monotonic() > deadline:
                    raise ProbeError(f"bpftrace did not attach within {attach_timeout:.0f} s "
                                     f"(its stderr: {err})")
                time.sleep(0.05)
            else:
                return bg
        except BaseException:
            bg.stop()
            raise
        bg.stop()
        text = err.read_text(errors="replace")
        if _ATTACH_REFUSED not in text or attempt == attempts:
            tries = (f" (try {attempt} of {attempts}; the earlier tries' stderr: "
                     f"{', '.join(map(str, kept))})" if kept else "")
            raise ProbeError(
                f"bpftrace exited before attaching{tries}: {text[-2000:]}"
                + ("\nThe kernel refused a probe.  If its log (dmesg) says 'ref_ctr_offset "
                   "mismatch', another tracer holds a probe on that function with a USDT "
                   "reference counter (Debian's python3-bpfcc places its own uprobes that way): "
                   "let it finish, then probe again."
                   if _ATTACH_REFUSED in text else ""))
        saved = err.with_name(f"{err.name}.{attempt}")
        err.replace(saved)
        kept.append(saved)
        time.sleep(1.0)
    raise AssertionError("unreachable")


def probe_with_bpftrace(info: ProbeTarget, runner: QueryRunner, *, functions: Sequence[str],
                        layout: dwarf.ExecutorLayout | None, per_node: bool,
                        symbols: Mapping[str, Symbol], out_dir: Path | None = None,
                        attach_timeout: float = 60.0, attach_attempts: int = 3
                        ) -> ProbeResult:
    exe = which("bpftrace")
    work = out_dir or Path(tempfile.mkdtemp(prefix="profkit-bpftrace-"))
    script = work / "probe.bt"
    script.write_text(bpftrace_script(info, functions, symbols, layout, per_node))
    out = work / "bpftrace.json"
    err = work / "bpftrace.stderr"
    attached = [f for f in functions if (f in LIBC_FUNCTIONS and info.libc is not None)
                or f in symbols]
    query_error: BaseException | None = None
    t0 = t1 = 0.0
    qres: Any = None
    with sigterm_raises():
        bg = _start_bpftrace(exe, script, out, err, attach_timeout, attach_attempts)
        try:
            t0 = time.perf_counter()
            try:
                qres = runner()
            except Exception as e:  # noqa: BLE001
                query_error = e
            t1 = time.perf_counter()
        finally:
            bg.stop()
    maps = parse_bpftrace_json(out.read_text(errors="replace"))
    res = _bpftrace_result(maps, info, functions, attached, layout, per_node)
    res.query_ms = (t1 - t0) * 1000
    res.query_result = qres
    res.artifacts = {"script": str(script), "output": str(out), "stderr": str(err)}
    if query_error is not None:
        raise PartialProbe(f"the query failed or the backend exited during the probe "
                           f"({query_error}); the counts so far are in .partial", res)
    return res


# ---------------------------------------------------------------------------
# Entry point


def probe_query(conn: Any, sql: str | None = None, *, pid: int | None = None,
                runner: QueryRunner | None = None,
                functions: Sequence[str] = (*BINARY_FUNCTIONS, *LIBC_FUNCTIONS),
                per_node: bool = True, tool: str = "auto", out_dir: Path | None = None
                ) -> ProbeResult:
    """Probe the backend behind *conn* while it runs *sql* (or *runner()*).

    *tool*: "auto" (bcc, falling back to bpftrace with the reason recorded in
    ``fallback_reason``), "bcc" or "bpftrace".  Functions absent from the binary
    are listed in ``missing`` and their counts are None.
    """
    if runner is None:
        if sql is None:
            raise ProbeError("give the SQL to run (sql=...) or a runner callable")
        runner = _connection_runner(conn, sql)
    if pid is None:
        pid = int(conn.info.backend_pid)
    elif conn is not None and int(conn.info.backend_pid) != int(pid):
        raise ProbeError(f"pid {pid} is not the backend of this connection "
                         f"({conn.info.backend_pid}): the query would run unobserved")
    unknown = [f for f in functions if f not in FUNC_INDEX]
    if unknown:
        raise ProbeError(f"cannot probe {unknown}; known: {', '.join(FUNC_INDEX)}")
    bi = backend_info(pid)
    target = ProbeTarget(bi.pid, bi.exe, bi.libc)
    layout = dwarf.executor_layout(bi.exe) if per_node else None
    symbols = binary_symbols(bi.exe, [f for f in functions if f not in LIBC_FUNCTIONS])
    if per_node and "ExecProcNodeInstr" not in symbols:
        raise ProbeError(f"{bi.exe} has no ExecProcNodeInstr symbol: per-node counts need it")
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
    reason = ""
    if tool in ("auto", "bcc"):
        try:
            res = probe_with_bcc(target, runner, functions=functions, layout=layout,
                                 per_node=per_node, symbols=symbols, out_dir=out_dir)
            return res
        except ProfkitError as e:
            if tool == "bcc" or not isinstance(e, BccUnavailable):
                raise
            reason = f"bcc unavailable, used bpftrace instead: {e}"
    res = probe_with_bpftrace(target, runner, functions=functions, layout=layout,
                              per_node=per_node, symbols=symbols, out_dir=out_dir)
    res.fallback_reason = reason
    return res
