"""Issue 15, part 3 of the issue (``--pid`` / ``--dsn``): perf and clock-calls on a backend
profkit did not start — the machine's own Debian PostgreSQL 15 (stripped binary, dynamic
symbols only), started by the test as the unprivileged user ``profkit`` on a private
socket in a temporary directory (the system cluster is never touched)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

DEBIAN_BIN = Path("/usr/lib/postgresql/15/bin")
PORT = 5497


def _cli(*argv: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "profkit", *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def _as_profkit(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "profkit", "--", *cmd], capture_output=True,
                          text=True, timeout=timeout, cwd="/")


@pytest.fixture(scope="module")
def debian_pg(tmp_path_factory):
    assert (DEBIAN_BIN / "postgres").exists(), \
        "Debian's postgresql-15 is not installed (scripts/setup-system.sh installs it)"
    d = Path(tmp_path_factory.mktemp("debian-pg"))
    d.chmod(0o755)
    for p in (d, *d.parents):
        if str(p).startswith("/tmp/") or p == Path("/tmp"):
            p.chmod(p.stat().st_mode | 0o011)
    shutil.chown(d, "profkit")
    data = d / "data"
    cp = _as_profkit([str(DEBIAN_BIN / "initdb"), "-D", str(data), "-U", "profkit", "-A", "trust"])
    assert cp.returncode == 0, cp.stderr
    cp = _as_profkit([str(DEBIAN_BIN / "pg_ctl"), "-D", str(data), "-l", str(d / "log"), "-w",
                      "-o", f"-k {d} -c listen_addresses= -p {PORT}", "start"])
    assert cp.returncode == 0, cp.stderr + (d / "log").read_text()
    pm = int((data / "postmaster.pid").read_text().split()[0])
    dsn = f"host={d} port={PORT} user=profkit dbname=postgres"
    try:
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as c:
            # < 8 MB: no parallel scan
            c.execute("CREATE TABLE t1 AS SELECT a FROM generate_series(1, 100000) a")
            c.execute("ANALYZE t1")
            # a role without superuser: probe --dsn must not need more
            c.execute("CREATE ROLE pkuser LOGIN")
            c.execute("GRANT SELECT ON t1 TO pkuser")
        yield {"dsn": dsn, "dir": d, "postmaster": pm,
               "user_dsn": f"host={d} port={PORT} user=pkuser dbname=postgres"}
    finally:
        _as_profkit([str(DEBIAN_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"])
        try:
            os.kill(pm, 0)
        except ProcessLookupError:
            pass
        else:
            os.kill(pm, 9)


def test_bad_dsn_and_not_a_backend_are_one_line(tmp_path):
    cp = _cli("perf", "--dsn", f"host={tmp_path} port=1 dbname=x", "--sql", "SELECT 1",
              cwd=tmp_path)
    assert cp.returncode == 1
    assert len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert "cannot connect to" in cp.stderr and "check host, port" in cp.stderr
    cp = _cli("perf", "--pid", str(os.getpid()), "--seconds", "1", cwd=tmp_path)
    assert cp.returncode == 1 and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert "is not a PostgreSQL backend" in cp.stderr
    cp = _cli("perf", cwd=tmp_path)
    assert cp.returncode == 2 and "or --pid PID / --dsn DSN" in cp.stderr
    cp = _cli("clock-calls", "--sql", "SELECT 1", cwd=tmp_path)
    assert cp.returncode == 2 and "--cluster NAME" in cp.stderr


def test_binary_report_levels():
    from profkit.experiments.attach import binary_report

    rep = binary_report(DEBIAN_BIN / "postgres")
    assert rep.level == "dynsym" and not rep.symtab
    assert rep.instr_exported and rep.dynsym_functions > 5000
    assert rep.version.startswith("postgres (PostgreSQL) 15.")
    assert "dynamic symbols only" in rep.describe() and "-dbgsym" in rep.describe()


@pytest.mark.pg
def test_perf_dsn_on_debian_backend(debian_pg, tmp_path):
    # 30 executions (~250 samples): at 3 (~25 samples, ~8 % of them in the scan's named
    # functions) a cold make test once drew none in ExecScan/ExecAgg/heapgetpage
    cp = _cli("perf", "--dsn", debian_pg["dsn"], "--sql", "SELECT count(*) FROM t1",
              "--mode", "analyze_timing", "--reps", "30", "--no-stat", "--out",
              str(tmp_path / "fg"), cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert "dynamic symbols only" in cp.stdout
    run = Path(cp.stdout.split("artifacts: ")[1].split()[0])
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["target"]["binary"] == str(DEBIAN_BIN / "postgres")
    assert prov["target"]["binary_level"] == "dynsym"
    fn = pd.read_parquet(run / "functions.parquet")
    names = set(fn["function"])
    assert fn["self"].sum() >= 100, fn["self"].sum()
    # exported functions are named even in the stripped binary (and the vDSO clock)
    assert "ExecScan" in names or "ExecAgg" in names or "heapgetpage" in names, names
    assert any("clock_gettime" in n for n in names)
    assert list((tmp_path / "fg").glob("perf-pid*.svg"))


@pytest.mark.pg
def test_perf_pid_records_a_busy_backend(debian_pg, tmp_path):
    import psycopg

    with psycopg.connect(debian_pg["dsn"], autocommit=True) as conn, \
            psycopg.connect(debian_pg["dsn"], autocommit=True) as ctl:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        t = threading.Thread(target=lambda: _swallow(conn))
        t.start()
        time.sleep(0.3)
        try:
            cp = _cli("perf", "--pid", str(pid), "--seconds", "1.5", "--no-stat", "--out",
                      str(tmp_path / "fg"), cwd=tmp_path)
        finally:
            ctl.execute("SELECT pg_cancel_backend(%s)", (pid,))
            t.join(60)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert f"pid{pid}" in cp.stdout
    run = Path(cp.stdout.split("artifacts: ")[1].split()[0])
    fn = pd.read_parquet(run / "functions.parquet")
    assert fn["self"].sum() > 100
    assert "generate_series_int4" in set(fn["function"]) or \
        "generate_series_step_int4" in set(fn["function"])


def _swallow(conn) -> None:
    try:
        conn.execute("SELECT count(*) FROM generate_series(1, 300000000)")
    except Exception:  # noqa: BLE001 - cancelled by the test
        pass


@pytest.mark.pg
def test_clock_calls_dsn_on_debian_backend(debian_pg, tmp_path):
    cp = _cli("clock-calls", "--dsn", debian_pg["dsn"], "--sql",
              "SELECT count(*) FROM t1 WHERE a <= 2000", "--method", "bcc", "--json",
              "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert "dynamic symbols only" in cp.stderr
    res = json.loads(cp.stdout)
    row = res["clock_calls"][0]
    # a serial plan (the table is too small for a parallel scan): every clock read is this
    # backend's, and profkit's prediction from the plan's rows and loops is exact
    assert row["method"] == "bcc" and row["exact"]
    assert row["measured"] == row["predicted"] and row["measured"] >= 2 * 2000, row
    prov = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert prov["target"]["binary_level"] == "dynsym"


# --------------------------------------------------------------------------- probe --dsn/--pid

Q2000 = "SELECT count(*) FROM t1 WHERE a <= 2000"


def _settings(dsn: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT name, setting FROM pg_settings ORDER BY name").fetchall()


@pytest.mark.pg
def test_probe_dsn_on_debian_backend_as_a_plain_role(debian_pg, tmp_path):
    """EXPLAIN's per-node table for a role without superuser, plus function-level uprobe
    counts (the stripped binary exports InstrStartNode/InstrStopNode); nothing changed."""
    before = _settings(debian_pg["dsn"])
    cp = _cli("probe", "--dsn", debian_pg["user_dsn"], "--sql", Q2000, "--json", "--out",
              str(tmp_path / "run"), cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr[-2000:]
    res = json.loads(cp.stdout)
    assert res["binary_level"] == "dynsym"
    assert "per-node counts need DWARF" in res["allowed"]
    assert "not visible: ExecProcNodeInstr" in res["allowed"]
    # pkuser cannot read shared_preload_libraries: said, not guessed silently
    assert any("shared_preload_libraries is not readable" in n for n in res["notes"])
    nodes = {n["node_type"]: n for n in res["nodes"]}
    assert set(nodes) == {"Aggregate", "Seq Scan"}
    assert nodes["Seq Scan"]["rows"] == 2000 and nodes["Aggregate"]["rows"] == 1
    assert nodes["Seq Scan"]["parent_id"] == nodes["Aggregate"]["node_id"]
    assert "exec_calls_measured" not in nodes["Seq Scan"]  # per node needs DWARF
    fn = {f["function"]: f for f in res["functions"]}
    # one InstrStartNode per row returned + 1 per node (NULL at the end) + EXPLAIN's bracket
    assert fn["InstrStartNode"]["calls"] == fn["InstrStartNode"]["predicted"] == 2000 + 1 + 2 + 2
    assert fn["InstrStopNode"]["calls"] == fn["InstrStartNode"]["calls"]
    assert fn["clock_gettime"]["calls"] == fn["clock_gettime"]["predicted"] >= 2 * 2000
    assert fn["ExecProcNodeInstr"]["calls"] is None  # static: not in .dynsym
    assert (tmp_path / "run" / "plan_nodes.parquet").exists()
    assert _settings(debian_pg["dsn"]) == before


@pytest.mark.pg
def test_probe_dsn_without_root_is_the_explain_table_only(debian_pg, monkeypatch):
    """Not root: no uprobes, and it says so; the EXPLAIN table comes all the same."""
    from profkit.experiments.attach import probe_attached

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    res = probe_attached(dsn=debian_pg["user_dsn"], sql=Q2000, mode="analyze_notiming")
    assert res.level == "none" and "need root" in res.allowed
    assert res.functions["calls"].isna().all()
    rows = res.nodes.set_index("node_type")["rows"]
    assert rows["Seq Scan"] == 2000 and rows["Aggregate"] == 1
    assert res.plan[0]["Plan"]["Plans"][0]["Relation Name"] == "t1"


@pytest.mark.pg
def test_probe_and_clock_calls_by_pid(debian_pg, tmp_path):
    """--pid: counts whatever a busy backend runs for --seconds (here EXPLAIN ANALYZE in a
    loop: 2005 InstrStartNode calls and 2 InstrEndLoop calls per query)."""
    import psycopg

    stop = threading.Event()
    with psycopg.connect(debian_pg["dsn"], autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]

        def loop() -> None:
            while not stop.is_set():
                conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + Q2000).fetchall()

        t = threading.Thread(target=loop)
        t.start()
        try:
            time.sleep(0.3)
            cp = _cli("probe", "--pid", str(pid), "--seconds", "1.5", "--json", "--out",
                      str(tmp_path / "p"), cwd=tmp_path)
            cc = _cli("clock-calls", "--pid", str(pid), "--seconds", "1", "--json", "--out",
                      str(tmp_path / "c"), cwd=tmp_path)
        finally:
            stop.set()
            t.join(60)
    assert cp.returncode == 0, cp.stderr[-2000:]
    res = json.loads(cp.stdout)
    assert res["pid"] == pid and res["binary_level"] == "dynsym" and res["nodes"] == []
    fn = {f["function"]: f["calls"] for f in res["functions"]}
    assert fn["InstrStartNode"] > 2005 and fn["InstrEndLoop"] >= 2
    # consistent with the plan's rows: ~1002.5 starts per InstrEndLoop (a query cut by
    # the window's edges moves it by at most one query's worth)
    assert abs(fn["InstrStartNode"] - 1002.5 * fn["InstrEndLoop"]) <= 2 * 2005, fn
    assert abs(fn["InstrStartNode"] - fn["InstrStopNode"]) <= 4, fn
    assert fn["clock_gettime"] >= 1.9 * fn["InstrStartNode"], fn
    assert cc.returncode == 0, cc.stderr[-2000:]
    rows = {r["method"]: r for r in json.loads(cc.stdout)["clock_calls"]}
    assert set(rows) == {"ltrace", "bcc"}
    assert rows["ltrace"]["measured"] > 0 and rows["bcc"]["measured"] > rows["ltrace"]["measured"]


@pytest.mark.pg
def test_probe_dsn_with_dwarf_counts_per_node(pg_cluster, _join_sum_loaded, tmp_path):
    """A profkit build (full DWARF) reached by DSN: per-node counts, equal to the plan's."""
    dsn = pg_cluster.dsn
    cp = _cli("probe", "--dsn", dsn, "--workload", "join_sum", "--json", "--out",
              str(tmp_path / "run"), cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr[-2000:]
    res = json.loads(cp.stdout)
    assert res["binary_level"] == "dwarf" and "per-node" in res["allowed"]
    nodes = pd.DataFrame(res["nodes"])
    assert set(nodes["node_type"]) >= {"Hash Join", "Seq Scan", "Hash"}
    assert (nodes["exec_calls_measured"] == nodes["exec_calls_predicted"]).all(), nodes
    assert (nodes["clock_calls_measured"] == nodes["clock_calls_predicted"]).all(), nodes
    fn = {f["function"]: f for f in res["functions"]}
    assert fn["ExecProcNodeInstr"]["calls"] == fn["ExecProcNodeInstr"]["predicted"] > 0


def test_probe_bad_targets_are_one_line(tmp_path):
    cp = _cli("probe", "--dsn", f"host={tmp_path} port=1 dbname=x", "--sql", "SELECT 1",
              cwd=tmp_path)
    assert cp.returncode == 1 and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert "cannot connect to" in cp.stderr
    cp = _cli("clock-calls", "--dsn", f"host={tmp_path} port=1 dbname=x", "--sql", "SELECT 1",
              cwd=tmp_path)
    assert cp.returncode == 1 and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert "cannot connect to" in cp.stderr and "check host, port" in cp.stderr
    assert not list(tmp_path.glob("*/provenance.json")), "no run directory for a bad target"
    for cmd in (["probe"], ["clock-calls"]):
        cp = _cli(*cmd, "--pid", str(os.getpid()), "--seconds", "1", cwd=tmp_path)
        assert cp.returncode == 1 and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
        assert "is not a PostgreSQL backend" in cp.stderr
    cp = _cli("probe", "--sql", "SELECT 1", cwd=tmp_path)
    assert cp.returncode == 2 and "--dsn DSN (any server) or --pid PID" in cp.stderr
    cp = _cli("probe", "--pid", "1", "--sql", "SELECT 1", cwd=tmp_path)
    assert cp.returncode == 2 and "to run a query use --dsn" in cp.stderr.replace(",", "")
