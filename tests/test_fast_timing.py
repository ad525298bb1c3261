"""fast_timing (pg19/ and pg18/): which wrapper runs when, and that its per-node times are sane.

The patch (profkit/patches/pg19/fast_timing.patch) installs a lean wrapper
(ExecProcNodeInstrTsc / ExecProcNodeInstrSystem, and their *Usage siblings for
BUFFERS/WAL) on a node whose instrumentation needs the timer, and keeps
ExecProcNodeInstr() for the rest (TIMING FALSE; async nodes).  Which
wrapper runs is counted exactly with bcc uprobes on the real backend (one hit per
ExecProcNode call: rows + loops per node, from the plan itself).  The same-answers
corpus (tests/test_same_answers.py) checks its rows and loops in all four modes.
The PostgreSQL 18 port (ExecProcNodeInstrTimer / ...TimerUsage, clock_gettime) gets
the same wrapper count and nesting check at the end.
"""
from __future__ import annotations

import contextlib
import json
import os

import pytest

from profkit.pg.build import get_build
from profkit.pg.cluster import Cluster
from profkit.pg.workloads import get_workload

pytestmark = [pytest.mark.pg, pytest.mark.alone]
pg19 = pytest.mark.builds("pg19/fast_timing")

WRAPPERS = ("ExecProcNodeInstrTsc", "ExecProcNodeInstrSystem", "ExecProcNodeInstrTscUsage",
            "ExecProcNodeInstrSystemUsage", "ExecProcNodeInstr")
SCALE = 0.02  # nested_loop: 800,000 rows through the nested loop, ~50 ms with TIMING


@pytest.fixture(scope="module")
def fast_cluster():
    build = get_build("pg19/fast_timing", progress=print)
    with Cluster(build, name="test-fast-timing") as cl:
        with cl.connect() as conn:
            get_workload("nested_loop").load(conn, SCALE)
        yield build, cl


@pytest.fixture(scope="module")
def fast_conn(fast_cluster):
    """The backend the uprobes count (they stay attached for the module)."""
    build, cl = fast_cluster
    with cl.connect() as conn:
        conn.autocommit = True
        yield build, conn


@pytest.fixture
def timed_conn(fast_cluster):
    """Another backend, for times: a uprobe on the counted backend costs ~1 µs a call,
    which would land in the parent node's time."""
    build, cl = fast_cluster
    with cl.connect() as conn:
        conn.autocommit = True
        yield build, conn


class _Counter:
    """bcc uprobes on the three wrappers, counting calls made by one backend."""

    PROG = """
#include <uapi/linux/ptrace.h>
BPF_ARRAY(hits, u64, 5);
static inline int bump(u32 k) {
    if ((bpf_get_current_pid_tgid() >> 32) != __PID__) return 0;
    u64 *v = hits.lookup(&k);
    if (v) __sync_fetch_and_add(v, 1);
    return 0;
}
int on_0(struct pt_regs *ctx) { return bump(0); }
int on_1(struct pt_regs *ctx) { return bump(1); }
int on_2(struct pt_regs *ctx) { return bump(2); }
int on_3(struct pt_regs *ctx) { return bump(3); }
int on_4(struct pt_regs *ctx) { return bump(4); }
"""

    def __init__(self, binary: str, pid: int, functions: tuple[str, ...] = WRAPPERS) -> None:
        assert len(functions) <= 5
        self.functions = functions
        from profkit.collect import kheaders

        bcc = kheaders.import_bcc()
        env = kheaders.ensure_bcc_env()
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            self.b = bcc.BPF(text=self.PROG.replace("__PID__", str(pid)).encode(),
                             cflags=["-Wno-duplicate-decl-specifier"])
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        try:
            for i, fn in enumerate(functions):
                self.b.attach_uprobe(name=binary.encode(), sym=fn.encode(),
                                     fn_name=f"on_{i}".encode(), pid=pid)
        except Exception:
            self.b.cleanup()
            raise

    def read(self) -> dict[str, int]:
        hits = self.b[b"hits"]
        out = {fn: int(hits[hits.Key(i)].value) for i, fn in enumerate(self.functions)}
        for i in range(len(self.functions)):
            hits[hits.Key(i)] = hits.Leaf(0)
        return out

    def close(self) -> None:
        self.b.cleanup()


@pytest.fixture(scope="module")
def counter(fast_conn):
    build, conn = fast_conn
    c = _Counter(str(build.postgres), conn.info.backend_pid)
    try:
        yield c
    finally:
        c.close()


def _explain(conn, sql: str, opts: str) -> dict:
    row = conn.execute(f"EXPLAIN (ANALYZE, {opts}, FORMAT JSON) {sql}").fetchone()
    doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return doc[0]


def _nodes(plan: dict) -> list[dict]:
    out = [plan]
    for c in plan.get("Plans", []) or []:
        out += _nodes(c)
    return out


def _calls(doc: dict) -> int:
    """ExecProcNode calls the plan implies: rows + loops per node (each loop ends with
    one call that returns no tuple)."""
    return sum(int(n["Actual Rows"]) + int(n["Actual Loops"]) for n in _nodes(doc["Plan"]))


SMALL = "SELECT count(*) FROM generate_series(1, 1000) AS g WHERE g % 3 = 0"


@pg19
@pytest.mark.parametrize("opts, clock, expect", [
    ("TIMING TRUE, BUFFERS FALSE", "tsc", "ExecProcNodeInstrTsc"),
    ("TIMING TRUE, BUFFERS FALSE", "system", "ExecProcNodeInstrSystem"),
    # BUFFERS (EXPLAIN ANALYZE's default) and WAL: the lean wrappers that snapshot usage
    ("TIMING TRUE, BUFFERS TRUE", "tsc", "ExecProcNodeInstrTscUsage"),
    ("TIMING TRUE, BUFFERS FALSE, WAL TRUE", "system", "ExecProcNodeInstrSystemUsage"),
    # no timer: upstream's wrapper
    ("TIMING FALSE, BUFFERS TRUE", "tsc", "ExecProcNodeInstr"),
    ("TIMING FALSE, BUFFERS FALSE", "tsc", "ExecProcNodeInstr"),
])
def test_wrapper_chosen_per_instrumentation(fast_conn, counter, opts, clock, expect):
    _build, conn = fast_conn
    conn.execute(f"SET timing_clock_source = {clock}")
    try:
        counter.read()
        doc = _explain(conn, SMALL, opts)
        got = counter.read()
    finally:
        conn.execute("RESET timing_clock_source")
    calls = _calls(doc)
    # Aggregate: 1 row + 1 loop; Function Scan: 333 rows + 1 loop
    assert calls == 2 + 334
    assert got == {fn: (calls if fn == expect else 0) for fn in WRAPPERS}
    assert _nodes(doc["Plan"])[1]["Actual Rows"] == 333
    if "TIMING TRUE" in opts:
        assert doc["Plan"]["Actual Total Time"] > 0


def _usage(plan: dict) -> list[tuple]:
    keys = ("Shared Hit Blocks", "Shared Read Blocks", "Shared Dirtied Blocks",
            "Local Hit Blocks", "Temp Read Blocks", "Temp Written Blocks", "WAL Records")
    return [(n["Node Type"], *(n.get(k) for k in keys)) for n in _nodes(plan)]


@pg19
def test_buffers_and_wal_counted_like_upstream(timed_conn):
    """The *Usage wrappers' buffer and WAL counts per node equal ExecProcNodeInstr()'s
    (TIMING FALSE runs upstream's wrapper): warm cache, the same plan, fresh inserts."""
    _build, conn = timed_conn
    q = get_workload("nested_loop").query("plain")
    _explain(conn, q, "TIMING FALSE, BUFFERS TRUE")  # warm the cache
    lean = _explain(conn, q, "TIMING TRUE, BUFFERS TRUE")["Plan"]
    upstream = _explain(conn, q, "TIMING FALSE, BUFFERS TRUE")["Plan"]
    assert _usage(lean) == _usage(upstream)
    assert lean["Shared Hit Blocks"] > 0
    conn.execute("DROP TABLE IF EXISTS ft_wal")
    conn.execute("CREATE TABLE ft_wal (i int)")
    ins = "INSERT INTO ft_wal SELECT g FROM generate_series(1, 500) AS g"
    walled = []
    for opts in ("TIMING TRUE, WAL TRUE, BUFFERS FALSE", "TIMING FALSE, WAL TRUE, BUFFERS FALSE"):
        conn.execute("TRUNCATE ft_wal")
        walled.append(_explain(conn, ins, opts)["Plan"])
    assert walled[0]["WAL Records"] == walled[1]["WAL Records"] >= 500
    assert _usage(walled[0]) == _usage(walled[1])
    conn.execute("DROP TABLE ft_wal")


def _check_nesting(node: dict) -> None:
    """Every node's inclusive time (total × loops) covers each child's."""
    incl = node["Actual Total Time"] * node["Actual Loops"]
    assert node["Actual Startup Time"] <= node["Actual Total Time"]
    for k in node.get("Plans", []) or []:
        # EXPLAIN rounds per-loop times to 1 µs: allow that per loop
        slack = 0.0005 * (node["Actual Loops"] + k["Actual Loops"])
        assert incl + slack >= k["Actual Total Time"] * k["Actual Loops"], (node, k)
        _check_nesting(k)


@pg19
@pytest.mark.parametrize("clock", ["tsc", "system"])
def test_node_times_nest_and_add_up(timed_conn, clock):
    """Per-node times of the lean wrappers on nested_loop (~50 ms): every node's
    inclusive time (total × loops) covers its children's, and the root's is
    EXPLAIN's Execution Time less executor start-up and shut-down."""
    _build, conn = timed_conn
    conn.execute(f"SET timing_clock_source = {clock}")
    try:
        # three runs: the nesting holds in each; the gap to Execution Time is taken from
        # the least disturbed (a preemption outside the root's window widens it)
        docs = [_explain(conn, get_workload("nested_loop").query("plain"),
                         "TIMING TRUE, BUFFERS FALSE") for _ in range(3)]
    finally:
        conn.execute("RESET timing_clock_source")
    for doc in docs:
        _check_nesting(doc["Plan"])
    doc = min(docs, key=lambda d: d["Execution Time"] - d["Plan"]["Actual Total Time"])

    root = doc["Plan"]
    nl = root["Plans"][0]
    assert nl["Node Type"] == "Nested Loop" and nl["Actual Rows"] == 800_000
    mat = next(n for n in _nodes(root) if n["Node Type"] == "Materialize")
    assert mat["Actual Rows"] == 800 and mat["Actual Loops"] == 1000  # per loop
    # the children's time is a large, real share of the join's: not zero, not all
    child_sum = sum(k["Actual Total Time"] * k["Actual Loops"] for k in nl["Plans"])
    assert 0.2 * nl["Actual Total Time"] < child_sum < nl["Actual Total Time"]
    exec_ms = doc["Execution Time"]
    assert root["Actual Total Time"] <= exec_ms
    assert exec_ms - root["Actual Total Time"] < max(1.0, 0.05 * exec_ms)


@pg19
def test_clock_switch_between_queries(timed_conn):
    """The clock is chosen per node when the query starts: switching the GUC between
    queries gives each query the clock in effect (ticks and their conversion agree:
    the Execution Time and root time stay within each other's bounds)."""
    _build, conn = timed_conn
    with contextlib.ExitStack() as stack:
        stack.callback(conn.execute, "RESET timing_clock_source")
        for clock in ("tsc", "system", "tsc"):
            conn.execute(f"SET timing_clock_source = {clock}")
            assert conn.execute("SHOW timing_clock_source").fetchone()[0] == clock
            doc = _explain(conn, SMALL, "TIMING TRUE, BUFFERS FALSE")
            assert 0 < doc["Plan"]["Actual Total Time"] <= doc["Execution Time"] < 1000


# ---------------------------------------------------------------------------
# PostgreSQL 18 (profkit/patches/pg18/fast_timing.patch): clock_gettime, static wrappers

PG18_WRAPPERS = ("ExecProcNodeInstrTimer", "ExecProcNodeInstrTimerUsage", "ExecProcNodeInstr")


@pytest.mark.builds("fast_timing")
def test_pg18_wrapper_choice_and_nesting():
    build = get_build("fast_timing", progress=print)
    with Cluster(build, name="test-fast-timing-18") as cl:
        with cl.connect() as conn:
            conn.autocommit = True
            get_workload("nested_loop").load(conn, SCALE)
            # times first, with no uprobe on this backend
            doc = _explain(conn, get_workload("nested_loop").query("plain"),
                           "TIMING TRUE, BUFFERS FALSE")
            _check_nesting(doc["Plan"])
            assert doc["Plan"]["Plans"][0]["Actual Rows"] == 800_000
            assert 0 < doc["Plan"]["Actual Total Time"] <= doc["Execution Time"]
            c = _Counter(str(build.postgres), conn.info.backend_pid, PG18_WRAPPERS)
            try:
                for opts, expect in (("TIMING TRUE, BUFFERS FALSE", "ExecProcNodeInstrTimer"),
                                     ("TIMING TRUE, BUFFERS TRUE", "ExecProcNodeInstrTimerUsage"),
                                     ("TIMING FALSE, BUFFERS TRUE", "ExecProcNodeInstr")):
                    c.read()
                    small = _explain(conn, SMALL, opts)
                    got = c.read()
                    calls = _calls(small)
                    assert calls == 2 + 334
                    assert got == {fn: (calls if fn == expect else 0) for fn in PG18_WRAPPERS}
            finally:
                c.close()
