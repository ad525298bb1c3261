"""ltrace and eBPF (bcc, bpftrace) against a real backend running join_sum.

join_sum at the test scale (conftest JOIN_SUM_SCALE, 0.02): i1 has N = 20,000
rows, i2 has M = 20.  The clusters load pg_stat_statements, which reads the
clock twice around each utility statement from its own .so — visible to a libc
uprobe, invisible to ltrace: that is the one constant between the two counts.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from proc_helpers import children_named, perf_bpf_fds

from profkit import tables
from profkit.analyze import predict as P
from profkit.collect import bpf, kheaders
from profkit.collect import ltrace as lt
from profkit.errors import ProbeError
from profkit.parse.ltrace import parse_ltrace_summary
from profkit.pg.workloads import get_workload

FIX = Path(__file__).parent / "fixtures"
# The bpftrace tests run in the alone phase: this bpftrace (0.17) places a libc uprobe in
# every process that maps libc, the other worker's postgres backends and valgrind runs too,
# not only in the backend.  (In one CI run the kernel refused it twice, EINVAL: a
# neighbouring test's bcc probe held libc's clock_gettime with a stray USDT counter offset;
# see test_bcc_and_bpftrace_probe_the_same_libc_function_at_once.)
BPFTRACE_ALONE = pytest.mark.alone
WL = get_workload("join_sum")


def _sizes(scale: float) -> tuple[int, int]:
    z = WL.sizes(scale)
    return z["i1"], z["i2"]






@pytest.fixture
def prediction(join_sum_conn):
    plan = join_sum_conn.execute(WL.query("analyze_timing", fmt="json")).fetchone()[0]
    return plan, P.predict(plan, P.context_from_conn(join_sum_conn, "analyze_timing"))


# ---------------------------------------------------------------------------
# The headline: ltrace, bcc and the prediction agree


@pytest.mark.pg
def test_clock_gettime_counts_agree(join_sum_conn, prediction, _join_sum_loaded, tmp_path):
    n, m = _sizes(_join_sum_loaded)
    _plan, pr = prediction
    sql = WL.query("analyze_timing")

    run = lt.count_calls(join_sum_conn, sql, out_dir=tmp_path / "ltrace")
    lt_df = parse_ltrace_summary(run.summary_text)
    assert lt_df.attrs["complete"]
    ltrace_calls = int(lt_df.set_index("function").loc["clock_gettime", "calls"])

    before = perf_bpf_fds()
    res = bpf.probe_query(join_sum_conn, sql, tool="bcc", functions=["clock_gettime"],
                          per_node=False)
    assert perf_bpf_fds() == before, "bcc left probes attached"
    bcc_calls = res.calls("clock_gettime")

    # observer-effect.txt: 2N + 4M + K with K = 28, as ltrace counts
    assert ltrace_calls == 2 * n + 4 * m + 28
    assert ltrace_calls == pr.totals["clock_reads_ltrace"]
    # the libc uprobe also sees pg_stat_statements' utility bracket
    pgss = sum(c.clock_reads for c in pr.constants if not c.ltrace_visible)
    assert pgss == 2
    assert bcc_calls == ltrace_calls + pgss == pr.totals["clock_reads"]
    assert res.tool == "bcc" and res.missing == ()


@pytest.mark.pg
def test_per_node_counts_match_plan(join_sum_conn, prediction, tmp_path):
    plan, pr = prediction
    res = bpf.probe_query(join_sum_conn, WL.query("analyze_timing"), tool="bcc",
                          out_dir=tmp_path / "bcc")
    assert (tmp_path / "bcc" / "probe.bpf.c").read_text().count("#define OFF_") == 5
    assert res.errors == {"stack_overflow": 0, "stack_underflow": 0, "read_failed": 0}
    nodes = res.nodes.set_index("node_id")
    flat = P.flatten_plan(plan).set_index("node_id")
    assert list(nodes.index) == list(flat.index)
    # measured ExecProcNode calls per node = rows + loops from the plan itself
    for nid, r in flat.iterrows():
        rows, loops = int(r["rows"]), int(r["loops"])
        if r["node_type"] == "Hash":  # MultiExecProcNode: one call per loop
            assert nodes.loc[nid, "exec_calls"] == 0
            assert nodes.loc[nid, "multiexec_calls"] == loops
        else:
            assert nodes.loc[nid, "exec_calls"] == rows + loops, (nid, r["node_type"])
            assert nodes.loc[nid, "first_calls"] == 1
        assert nodes.loc[nid, "shutdown_calls"] == 1
    # the probe's plan_node_id/tag reading agrees with the derived numbering
    assert P.check_node_ids(pr.nodes, res.nodes)["match"].all()
    assert list(nodes["planstate_tag"]) == ["T_AggState", "T_HashJoinState", "T_SeqScanState",
                                            "T_HashState", "T_SeqScanState"]
    # clock reads charged to each node = prediction; the rest is EXPLAIN + pgss
    merged = pr.nodes.set_index("node_id").join(nodes)
    assert (merged["clock_reads"] == merged["clock_calls_predicted"]).all()
    assert (nodes["clock_reads_shutdown"] == 2).all()
    assert res.outside_clock_reads == sum(c.clock_reads for c in pr.constants) == 8
    assert res.calls("clock_gettime") == pr.totals["clock_reads"]
    assert res.calls("InstrStartNode") == res.calls("InstrStopNode") == \
        pr.totals["instr_start_node"]
    assert res.calls("InstrEndLoop") == pr.totals["instr_end_loop_min"]
    table = P.plan_nodes_table(pr, run_id="t", build="vanilla", query="join_sum",
                               measured=res.nodes)
    tables.validate(table, "plan_nodes")
    assert (table["clock_calls_measured"] == table["clock_calls_predicted"]).all()
    assert (table["exec_calls_measured"] == table["exec_calls_predicted"]).all()


@pytest.mark.pg
def test_timing_off_and_plain(join_sum_conn, prediction, _join_sum_loaded):
    plan, _ = prediction
    ctx = P.context_from_conn(join_sum_conn, "analyze_notiming")
    off = bpf.probe_query(join_sum_conn, WL.query("analyze_notiming"), tool="bcc")
    pr_off = P.predict(plan, ctx)
    assert off.calls("clock_gettime") == pr_off.totals["clock_reads"] == 8
    assert (off.nodes["clock_reads"] == 0).all()
    assert off.calls("InstrStartNode") == pr_off.totals["instr_start_node"]
    plain = bpf.probe_query(join_sum_conn, WL.query("plain"), tool="bcc")
    pr_plain = P.predict(plan, P.context_from_conn(join_sum_conn, "plain"))
    assert plain.calls("ExecProcNodeInstr") == 0
    assert plain.calls("clock_gettime") == pr_plain.totals["clock_reads"] == 4
    assert plain.query_result == [(WL.expected_rows(_join_sum_loaded),)]


@pytest.mark.pg
@BPFTRACE_ALONE
def test_bpftrace_gives_the_same_counts(join_sum_conn, prediction, tmp_path):
    _plan, pr = prediction
    res = bpf.probe_query(join_sum_conn, WL.query("analyze_timing"), tool="bpftrace",
                          out_dir=tmp_path / "bt")
    assert res.tool == "bpftrace"
    script = (tmp_path / "bt" / "probe.bt").read_text()
    assert f"/pid == {join_sum_conn.info.backend_pid}/" in script
    assert res.calls("clock_gettime") == pr.totals["clock_reads"]
    merged = pr.nodes.set_index("node_id").join(res.nodes.set_index("node_id"))
    assert (merged["exec_calls"] == merged["exec_calls_predicted"]).all()
    assert (merged["clock_reads"] == merged["clock_calls_predicted"]).all()
    # counts only (no node stack): the same total
    flat = bpf.probe_query(join_sum_conn, WL.query("analyze_timing"), tool="bpftrace",
                           functions=["clock_gettime"], per_node=False,
                           out_dir=tmp_path / "bt-flat")
    assert flat.calls("clock_gettime") == pr.totals["clock_reads"] and flat.nodes.empty
    assert not children_named("bpftrace"), "bpftrace left running"


def test_bcc_imports_under_warnings_as_errors(tmp_path):
    """Debian 12's bcc/__init__.py holds an invalid escape sequence: compiling it warns
    (SyntaxWarning on Python 3.12, DeprecationWarning on 3.11), and under -W error the
    import failed ("bcc ... failed to import: invalid escape sequence").  A fresh pycache
    prefix makes Python compile bcc's source as a new machine would."""
    import subprocess
    import sys

    plain = "from profkit.collect import kheaders\nprint(kheaders.import_bcc().BPF.__name__)\n"
    recorded = ("import warnings\n"
                "from profkit.collect import kheaders\n"
                "with warnings.catch_warnings(record=True) as seen:\n"
                "    warnings.simplefilter('always')\n"
                "    bcc = kheaders.import_bcc()\n"
                "print(bcc.BPF.__name__, [str(w.message) for w in seen])\n")
    for name, code, want in (("plain", plain, "BPF"), ("recorded", recorded, "BPF []")):
        prefix = tmp_path / name
        env = {**os.environ, "PYTHONPYCACHEPREFIX": str(prefix)}
        for k in ("PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE"):  # the prefix shows the compile
            env.pop(k, None)
        cp = subprocess.run([sys.executable, "-W", "error", "-c", code], env=env,
                            capture_output=True, text=True, timeout=120)
        assert cp.returncode == 0, (name, cp.stderr[-2000:])
        assert cp.stdout.strip() == want, (name, cp.stdout)
        assert list(prefix.rglob("bcc/__init__.*.pyc")), f"{name}: bcc's source was not compiled"


@pytest.mark.cold
def test_two_processes_on_an_empty_cache_share_one_header_tree(tmp_path):
    """Two probes at once on an empty cache (two xdist workers of a cold make test did):
    the second waited for nothing, downloaded the kernel headers too and replaced the
    first's tree while the first's bcc compiled against it ('asm/types.h' file not
    found). Now one downloads, the other waits and takes that tree, and a complete tree
    never goes away."""
    import subprocess
    import sys

    cache = tmp_path / "cache"
    code = "from profkit.collect import kheaders\nprint(kheaders.headers_tree())\n"
    env = {**os.environ, "PROFKIT_CACHE": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    seen, gone = None, 0
    try:
        while any(p.poll() is None for p in procs):
            if seen is None:
                done = list((cache / "kheaders").glob("*/.profkit-complete"))
                seen = done[0].parent if done else None
            elif not (seen / "include" / "linux" / "kconfig.h").exists():
                gone += 1
            time.sleep(0.005)
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    trees = {out.strip() for out, _ in outs}
    assert trees == {str(seen)}, (trees, seen)
    assert gone == 0, f"the complete tree went missing for {gone} polls"
    assert list(seen.rglob("uapi/asm/types.h")), "the merged tree lacks asm/types.h"


@pytest.mark.pg
@BPFTRACE_ALONE
def test_falls_back_to_bpftrace_when_bcc_is_missing(join_sum_conn, monkeypatch, tmp_path):
    # bcc is installed here, so its absence is simulated (the only mock in this file)
    def no_bcc():
        raise kheaders.BccUnavailable("the bcc Python package is not installed (simulated)")

    monkeypatch.setattr(kheaders, "import_bcc", no_bcc)
    res = bpf.probe_query(join_sum_conn, WL.query("analyze_notiming"),
                          functions=["ExecProcNodeInstr", "clock_gettime"], out_dir=tmp_path)
    assert res.tool == "bpftrace"
    assert "bcc unavailable, used bpftrace instead" in res.fallback_reason
    assert res.calls("ExecProcNodeInstr") == 20_045
    with pytest.raises(kheaders.BccUnavailable):
        bpf.probe_query(join_sum_conn, "SELECT 1", tool="bcc")


def _hold_bpftrace_on_libc_clock(libc: str, out: Path):
    """A real bpftrace holding a uprobe on libc's clock_gettime (any process) until stopped;
    None and its stderr if the kernel refused it."""
    from profkit.processes import Background
    bg = Background(["bpftrace", "-e", f"BEGIN {{ printf(\"held\\n\"); }} "
                     f"uprobe:{libc}:clock_gettime {{ @n = count(); }}"],
                    stdout_path=out, stderr_path=out.with_suffix(".err"), what="bpftrace")
    bg.start()
    deadline = time.monotonic() + 60
    while "held" not in out.read_text(errors="replace"):
        if not bg.alive() or time.monotonic() > deadline:
            bg.stop()
            return None, out.with_suffix(".err").read_text(errors="replace")
        time.sleep(0.05)
    return bg, ""


@pytest.mark.pg
@BPFTRACE_ALONE
def test_bcc_and_bpftrace_probe_the_same_libc_function_at_once(join_sum_conn, prediction,
                                                               tmp_path):
    """Debian's python3-bpfcc registers uprobes with a stray USDT counter offset, and the
    kernel then refuses anyone else's uprobe on that function (and is refused by it):
    profkit's bcc probes must coexist with another tracer on libc's clock_gettime."""
    _plan, pr = prediction
    libc = str(bpf.libc_path(join_sum_conn.info.backend_pid))
    # a bpftrace holds the function, then profkit's bcc probe attaches beside it
    held, why = _hold_bpftrace_on_libc_clock(libc, tmp_path / "held.out")
    assert held is not None, why
    try:
        res = bpf.probe_query(join_sum_conn, WL.query("analyze_timing"), tool="bcc")
    finally:
        held.stop()
    assert res.calls("clock_gettime") == pr.totals["clock_reads"]
    # profkit's bcc probe holds it, and a bpftrace attaches beside it
    seen: dict[str, str] = {}

    def runner():
        other, why = _hold_bpftrace_on_libc_clock(libc, tmp_path / "beside.out")
        seen["why"] = why
        if other is not None:
            other.stop()
        return join_sum_conn.execute(WL.query("analyze_timing")).fetchall()

    res = bpf.probe_query(join_sum_conn, runner=runner, tool="bcc")
    assert seen["why"] == "", seen["why"]
    assert res.calls("clock_gettime") == pr.totals["clock_reads"]
    assert not children_named("bpftrace"), "bpftrace left running"


REFUSING_BPFTRACE = """#!/bin/sh
# refuses the first {refusals} runs as the kernel did once in CI, then runs bpftrace
n=$(cat "{dir}/runs" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "{dir}/runs"
if [ $n -le {refusals} ]; then
  echo 'perf_event_open(/sys/kernel/tracing/events/uprobes/p_x/id): Invalid argument' >&2
  echo 'ERROR: Error attaching probe: uprobe:{libc}:clock_gettime' >&2
  exit 1
fi
exec {real} "$@"
"""


def _refusing_bpftrace(tmp_path, monkeypatch, refusals: int) -> Path:
    """A bpftrace on PATH whose first *refusals* runs fail as a refused uprobe does (a
    kernel refusal cannot be made at will here; every later run is the real bpftrace)."""
    import shutil
    real = shutil.which("bpftrace")
    assert real, "bpftrace is installed by scripts/setup-system.sh"
    d = tmp_path / "bin"
    d.mkdir()
    script = d / "bpftrace"
    script.write_text(REFUSING_BPFTRACE.format(refusals=refusals, dir=d, real=real,
                                               libc="/usr/lib/x86_64-linux-gnu/libc.so.6"))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    return d


@pytest.mark.pg
@BPFTRACE_ALONE
def test_bpftrace_tries_again_when_the_kernel_refuses_a_probe(join_sum_conn, prediction,
                                                              tmp_path, monkeypatch):
    _plan, pr = prediction
    d = _refusing_bpftrace(tmp_path, monkeypatch, refusals=2)
    res = bpf.probe_query(join_sum_conn, WL.query("analyze_timing"), tool="bpftrace",
                          functions=["clock_gettime"], per_node=False, out_dir=tmp_path / "bt")
    assert (d / "runs").read_text().strip() == "3"
    assert res.calls("clock_gettime") == pr.totals["clock_reads"]
    for n in (1, 2):  # each refused try's stderr is kept
        assert "Invalid argument" in (tmp_path / "bt" / f"bpftrace.stderr.{n}").read_text()
    assert "Invalid argument" not in (tmp_path / "bt" / "bpftrace.stderr").read_text()
    assert not children_named("bpftrace"), "bpftrace left running"


@pytest.mark.pg
@BPFTRACE_ALONE
def test_bpftrace_refused_every_time_or_failing_otherwise(join_sum_conn, tmp_path, monkeypatch):
    d = _refusing_bpftrace(tmp_path, monkeypatch, refusals=99)
    with pytest.raises(ProbeError) as e:
        bpf.probe_query(join_sum_conn, "SELECT 1", tool="bpftrace", functions=["clock_gettime"],
                        per_node=False, out_dir=tmp_path / "bt")
    msg = str(e.value)
    assert (d / "runs").read_text().strip() == "3"
    assert "try 3 of 3" in msg and "bpftrace.stderr.2" in msg and "Invalid argument" in msg
    assert "ref_ctr_offset mismatch" in msg
    # an error another try would not change is reported at once, without the bcc hint
    (d / "bpftrace").write_text(f"#!/bin/sh\necho 1 >> '{d}/runs2'\n"
                                "echo 'ERROR: Could not resolve symbol' >&2; exit 1\n")
    with pytest.raises(ProbeError) as e:
        bpf.probe_query(join_sum_conn, "SELECT 1", tool="bpftrace", functions=["clock_gettime"],
                        per_node=False, out_dir=tmp_path / "bt2")
    assert (d / "runs2").read_text().count("1") == 1
    assert "Could not resolve symbol" in str(e.value) and "ref_ctr_offset" not in str(e.value)
    assert not children_named("bpftrace"), "bpftrace left running"


# ---------------------------------------------------------------------------
# Bad input, backends that die, nothing left behind


@pytest.mark.pg
def test_pid_that_is_not_a_backend(pg_cluster, join_sum_conn):
    with pytest.raises(ProbeError, match="not a backend"):
        bpf.backend_info(pg_cluster.pid)  # the postmaster
    with pytest.raises(ProbeError, match="not a PostgreSQL backend"):
        bpf.probe_query(None, "SELECT 1", pid=os.getpid())
    with pytest.raises(ProbeError, match="not a PostgreSQL backend"):
        lt.count_calls(None, "SELECT 1", pid=os.getpid())
    with pytest.raises(ProbeError, match="no process with pid"):
        bpf.backend_info(2**22 + 12345)
    with pytest.raises(ProbeError, match="not the backend of this connection"):
        bpf.probe_query(join_sum_conn, "SELECT 1", pid=pg_cluster.pid)


def _terminate_when_sleeping(pg_cluster, pid: int) -> threading.Thread:
    def go() -> None:
        with pg_cluster.connect() as other:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                row = other.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                                    (pid,)).fetchone()
                if row and row[0] == "PgSleep":
                    break
                time.sleep(0.05)
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


@pytest.mark.pg
def test_backend_exits_mid_probe_bcc(pg_cluster):
    conn = pg_cluster.connect()
    pid = conn.info.backend_pid
    before = perf_bpf_fds()
    t = _terminate_when_sleeping(pg_cluster, pid)
    with pytest.raises(bpf.PartialProbe, match=f"backend {pid} exited") as ei:
        bpf.probe_query(conn, "EXPLAIN (ANALYZE, TIMING TRUE) SELECT pg_sleep(30)", tool="bcc")
    t.join(10)
    part = ei.value.partial
    # what was counted before the backend died is kept
    assert part.calls("ExecProcNodeInstr") >= 1
    assert part.calls("clock_gettime") >= 3  # planning bracket + node start at least
    assert part.nodes["exec_calls"].sum() >= 1
    assert perf_bpf_fds() == before, "probes not detached"
    conn.close()


@pytest.mark.pg
def test_backend_exits_mid_probe_ltrace(pg_cluster, tmp_path):
    conn = pg_cluster.connect()
    pid = conn.info.backend_pid
    t = _terminate_when_sleeping(pg_cluster, pid)
    with pytest.raises(bpf.PartialProbe, match="exited") as ei:
        lt.count_calls(conn, "EXPLAIN (ANALYZE, TIMING TRUE) SELECT pg_sleep(30)",
                       out_dir=tmp_path)
    t.join(10)
    run = ei.value.partial
    assert isinstance(run, lt.LtraceRun)
    df = parse_ltrace_summary(run.summary_text)
    if run.summary_text.strip():
        assert int(df.set_index("function").loc["clock_gettime", "calls"]) >= 3
    else:
        # ltrace itself sometimes loses its counts when the tracee dies; we say so
        assert "No such process" in run.stderr
        assert "ltrace printed no summary" in str(ei.value)
    assert run.returncode is not None, "ltrace still running"
    assert not children_named("ltrace")
    conn.close()


@pytest.mark.pg
def test_query_error_under_ltrace_is_not_an_exit(pg_cluster, tmp_path):
    # a query that fails in a live backend is "the query failed", not "exited"; a
    # terminated one (the test above) is "exited" even when the client hears of it
    # before the backend has left /proc
    conn = pg_cluster.connect()
    pid = conn.info.backend_pid
    with pytest.raises(bpf.PartialProbe, match="the query failed while ltrace") as ei:
        lt.count_calls(conn, "SELECT 1 / 0", out_dir=tmp_path)
    assert "division by zero" in str(ei.value)
    assert f"backend {pid} exited" not in str(ei.value)
    assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == pid
    assert ei.value.partial.returncode is not None, "ltrace still running"
    assert not children_named("ltrace")
    conn.close()


def test_connection_lost_errors():
    import psycopg
    assert bpf.is_connection_lost(psycopg.errors.AdminShutdown(
        "terminating connection due to administrator command"))
    assert bpf.is_connection_lost(psycopg.OperationalError("server closed the connection"))
    assert not bpf.is_connection_lost(psycopg.errors.DivisionByZero("division by zero"))
    assert not bpf.is_connection_lost(psycopg.errors.QueryCanceled(
        "canceling statement due to statement timeout"))


@pytest.mark.pg
def test_ltrace_refuses_a_traced_backend(join_sum_conn, tmp_path):
    # while one ltrace is attached, a second attempt is refused with the tracer's pid
    pid = join_sum_conn.info.backend_pid
    seen: dict[str, object] = {}

    def inner() -> None:
        try:
            lt.count_calls(None, pid=pid, runner=lambda: None, out_dir=tmp_path / "b")
        except ProbeError as e:
            seen["err"] = str(e)

    run = lt.count_calls(join_sum_conn, None, runner=inner, out_dir=tmp_path / "a")
    assert "already traced by pid" in str(seen.get("err"))
    assert parse_ltrace_summary(run.summary_text).attrs["complete"]


# ---------------------------------------------------------------------------
# Cost guard (no backend needed: prediction from the recorded plan)


def test_guard_estimates_and_refuses():
    plan = json.loads((FIX / "plans" / "join_sum_0.02.json").read_text())
    pr = P.predict(plan, P.PredictContext(mode="analyze_timing", pgss_loaded=True))
    hits = bpf.estimate_probe_hits(pr.nodes, ["ExecProcNodeInstr", "clock_gettime"])
    assert hits == {"ExecProcNodeInstr": 2 * 20_045, "clock_gettime": 40_102 + 8}
    est = bpf.probe_cost_ms(hits)
    assert est == pytest.approx((2 * 20_045 * 1000 + 40_110 * 6000) / 1e6)
    # a 3 ms query: ~0.28 s of probing is within the 2 s floor
    assert bpf.guard(hits, query_ms=3.0) == pytest.approx(est)
    # ltrace at ~100 µs per call would take ~4 s: refused, bcc suggested
    with pytest.raises(ProbeError, match=r"bcc uprobes .*--force"):
        bpf.guard({"clock_gettime": 40_110}, query_ms=3.0, method="ltrace")
    # the seed's scale (N = 1e6): 2e6 clock hits at 6 µs = 12 s for a 100 ms query
    with pytest.raises(ProbeError, match="perf sampling"):
        bpf.guard({"clock_gettime": 2_000_000}, query_ms=100.0)
    assert bpf.guard({"clock_gettime": 2_000_000}, query_ms=100.0, force=True) == \
        pytest.approx(12_000.0)
    with pytest.raises(ProbeError, match="no hit estimate"):
        bpf.estimate_probe_hits(pr.nodes, ["malloc"])


@pytest.mark.pg
def test_symbols_present_in_full_and_stripped_binaries(vanilla_build, tmp_path):
    import subprocess

    names = list(bpf.BINARY_FUNCTIONS)
    full = bpf.binary_symbols(vanilla_build.postgres, names)
    assert set(full) == set(names)
    # gcc split the walker: the ".part.0" body is the one every node goes through
    assert full["ExecShutdownNode_walker"].name == "ExecShutdownNode_walker.part.0"
    # a stripped binary (like Debian's) keeps only exported functions: static
    # ExecProcNodeInstr/ExecProcNodeFirst vanish, so do inlined ones in patched builds
    stripped = tmp_path / "postgres"
    subprocess.run(["strip", "-o", str(stripped), str(vanilla_build.postgres)], check=True)
    left = bpf.binary_symbols(stripped, names)
    assert set(left) == {"InstrStartNode", "InstrStopNode", "InstrEndLoop", "MultiExecProcNode"}
    assert left["InstrStartNode"] == full["InstrStartNode"]  # same address, from .dynsym


PROBE_SCRIPT = r"""
import sys, psycopg
from profkit.collect import bpf, ltrace
conn = psycopg.connect(sys.argv[1], autocommit=True)
print("pid", conn.info.backend_pid, flush=True)
try:
    if sys.argv[2] == "ltrace":
        ltrace.count_calls(conn, "SELECT pg_sleep(30)", out_dir=sys.argv[3])
    else:
        bpf.probe_query(conn, "SELECT pg_sleep(30)", tool=sys.argv[2], out_dir=sys.argv[3])
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
"""


@pytest.mark.pg
@pytest.mark.parametrize("tool", ["bcc", pytest.param("bpftrace", marks=BPFTRACE_ALONE),
                                  "ltrace"])
def test_sigterm_detaches_everything(pg_cluster, tmp_path, tool):
    import signal
    import subprocess
    import sys

    script = tmp_path / "probe.py"
    script.write_text(PROBE_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), pg_cluster.dsn, tool, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    backend = int(proc.stdout.readline().split()[1])
    with pg_cluster.connect() as other:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # attached and the query is running
            row = other.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                                (backend,)).fetchone()
            if row and row[0] == "PgSleep":
                break
            time.sleep(0.1)
        else:
            proc.kill()
            pytest.fail("probe never started the query")
        if tool == "ltrace":
            assert lt.tracer_pid(backend) > 0
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
        assert "interrupted" in out and proc.returncode == 3
        # no tracer left: not attached to the backend, no child tool running anywhere
        assert lt.tracer_pid(backend) in (0, -1)
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    cmd = (d / "cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                assert str(tmp_path) not in cmd or "probe.py" in cmd, cmd
        # the backend was not killed by a stray breakpoint (SIGTRAP): the server is
        # up and nobody crashed
        assert other.execute("SELECT 1").fetchone() == (1,)
    log = pg_cluster.log_path.read_text(errors="replace")
    assert "terminated by signal" not in log


def test_kernel_header_choice_and_tracefs_parsing():
    names = ["linux-headers-6.1.0-57-common", "linux-headers-6.1.0-57-amd64",
             "linux-headers-6.12.117+deb12-amd64", "linux-headers-6.12.117+deb12-common",
             "linux-headers-6.12.117+deb12-rt-amd64", "linux-headers-6.12.118+deb12-amd64",
             "linux-headers-amd64"]
    # 6.12.118 has no -common package listed: not usable
    assert kheaders.pick_header_version(names, "amd64") == "6.12.117+deb12"
    assert kheaders.pick_header_version(names, "arm64") is None
    assert kheaders.tracefs_mounted("nodev /sys/kernel/tracing tracefs rw,relatime 0 0\n")
    assert not kheaders.tracefs_mounted("proc /proc proc rw 0 0\n")


@pytest.mark.pg
def test_bcc_env_and_import_here():
    env = kheaders.ensure_bcc_env()
    if not kheaders.running_kernel_build_dir().exists():
        tree = Path(env["BCC_KERNEL_SOURCE"])
        assert (tree / "include" / "linux" / "kconfig.h").exists()
        assert (tree / ".config").exists() and (tree / "arch" / "x86").exists()
    bcc = kheaders.import_bcc()
    assert hasattr(bcc, "BPF")
    import numpy

    # only the bcc package came from dist-packages, not Debian's numpy
    assert "/usr/lib/python3/dist-packages" not in numpy.__file__
