"""Foundation: source, cached builds, clusters, workloads — against real PostgreSQL."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from proc_helpers import alive

from profkit import paths
from profkit.errors import BuildError, ClusterError, PatchError, ToolNotFound
from profkit.pg.build import BuildSpec, get_build, get_builds, resolve_spec
from profkit.pg.cluster import Cluster
from profkit.pg.source import SourceError, get_source
from profkit.pg.workloads import WorkloadError, get_workload
from profkit.processes import run, which

FIXTURES = Path(__file__).parent / "fixtures"
pytestmark = pytest.mark.pg




def test_default_source_is_debian_pg18():
    src = get_source()
    assert src.kind == "debian"
    assert src.version.startswith("18."), src.version
    assert len(src.identity) == 64
    assert (Path(src.path) / "src" / "backend" / "executor" / "instrument.c").exists()
    assert "postgresql-18" in src.detail


def test_build_is_cached_and_has_provenance(vanilla_build):
    t0 = time.monotonic()
    again = get_build("vanilla")
    assert time.monotonic() - t0 < 30, "a cached build must not rebuild"
    assert again.key == vanilla_build.key
    assert (again.dir / "COMPLETE").read_text().strip() == again.key
    assert again.pg_config["VERSION"].startswith("PostgreSQL 18.")
    assert "-fno-omit-frame-pointer" in again.pg_config["CFLAGS"]
    assert "--enable-depend" in again.pg_config["CONFIGURE"]
    assert again.postgres.exists()
    assert (again.prefix / "lib" / "postgresql" / "pg_stat_statements.so").exists() or \
        any(again.prefix.glob("lib/**/pg_stat_statements.so"))
    # debug info for probes; frame pointers for perf
    out = run(["readelf", "-S", again.postgres]).stdout
    assert ".debug_info" in out
    # only what profkit runs is built and installed (pg.build.BUILD_DIRS)
    bins = {p.name for p in again.bindir.iterdir()}
    assert {"postgres", "initdb", "pg_ctl", "psql", "pg_config", "pg_test_timing"} <= bins, bins
    assert not bins & {"pg_dump", "pgbench", "ecpg", "pg_basebackup", "pg_upgrade"}, bins
    assert any(again.prefix.glob("lib/**/plpgsql.so")) and any(again.prefix.glob("lib/**/dict_snowball.so"))
    assert any(again.prefix.glob("share/**/timezonesets/Default"))
    # 1,167 objects here (PostgreSQL 18.6); the full `make` of the tree compiles more (ecpg,
    # pg_dump, pgbench, pg_basebackup, pg_upgrade, replication plugins, regress programs)
    assert again.timings["objects"] < 1250, again.timings


def test_cache_key_ignores_a_patch_header(tmp_path):
    """Rewording a patch's header keeps its builds; changing a hunk does not."""
    from profkit.pg.build import BuildSpec, cache_key, patch_body
    from profkit.pg.source import Source

    hunk = ("diff --git a/src/x.c b/src/x.c\n--- a/src/x.c\n+++ b/src/x.c\n@@ -1 +1 @@\n"
            "-int x;\n+int y;\n")
    a, b, c = tmp_path / "a.patch", tmp_path / "b.patch", tmp_path / "c.patch"
    a.write_text("Header one.\n--- numbers: +1.0 %\n\n" + hunk)
    b.write_text("Another header, other figures.\n" + hunk)
    c.write_text("Header one.\n--- numbers: +1.0 %\n\n" + hunk.replace("int y", "int z"))
    assert patch_body(a.read_bytes()) == patch_body(b.read_bytes()) == hunk.encode()
    src = Source("tarball", "tarball:x", "18.6", "x", "id", "/nonexistent")
    spec = BuildSpec("t", patches=("a",))
    key = {p.name: cache_key(spec, src, [p], "gcc") for p in (a, b, c)}
    assert key["a.patch"] == key["b.patch"] != key["c.patch"]
    # a plain `diff -u` (no "diff " line) starts at its ---/+++ pair
    plain = "Notes\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"
    assert patch_body(plain.encode()).startswith(b"--- a/f\n+++ b/f")


def test_query_triple_row_count(nested_loop_conn):
    from conftest import NESTED_LOOP_SCALE

    wl = get_workload("nested_loop")
    expected = wl.expected_rows(NESTED_LOOP_SCALE)
    # scale 0.02: test1 3000+100 rows, test2 1000, test3 700 -> (700+100)*1000
    assert expected == (min(3000, 700) + min(100, 700)) * 1000
    (count,) = nested_loop_conn.execute(wl.query("plain")).fetchone()
    assert count == expected
    for mode in ("analyze_notiming", "analyze_timing"):
        plan = nested_loop_conn.execute(wl.query(mode, fmt="json")).fetchone()[0][0]
        assert plan["Plan"]["Node Type"] == "Aggregate"
        assert plan["Plan"]["Actual Rows"] == 1
        # the aggregate's input carries exactly the joined rows
        assert plan["Plan"]["Plans"][0]["Actual Rows"] == expected
        has_time = "Actual Total Time" in plan["Plan"]
        assert has_time == (mode == "analyze_timing")


def test_cluster_settings_and_private_socket(pg_cluster):
    with pg_cluster.connect() as conn:
        got = dict(conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN ('jit', "
            "'max_parallel_workers_per_gather', 'listen_addresses', 'shared_preload_libraries')"
        ).fetchall())
    assert got == {"jit": "off", "max_parallel_workers_per_gather": "0", "listen_addresses": "",
                   "shared_preload_libraries": "pg_stat_statements"}
    assert (pg_cluster.socket_dir.stat().st_mode & 0o777) == 0o700
    if os.geteuid() == 0:
        # postgres refuses root: it runs as the unprivileged user
        assert Path(f"/proc/{pg_cluster.pid}").stat().st_uid == pg_cluster.os_user.uid != 0


def test_no_process_left_after_error(vanilla_build):
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="boom"):
        with Cluster(vanilla_build, name="test-error") as cl:
            with cl.connect() as conn:
                pids = [cl.pid, *cl.backend_pids(), cl.backend_pid(conn)]
                raise RuntimeError("boom")
    assert len(pids) >= 3
    time.sleep(0.2)
    assert [p for p in pids if alive(p)] == []
    assert cl.dir is not None and not cl.dir.exists()


def test_no_process_left_after_ctrl_c(vanilla_build, tmp_path):
    """A real SIGINT to a process holding a cluster leaves no postgres behind."""
    pidfile = tmp_path / "pids"
    script = textwrap.dedent(f"""
        import faulthandler, signal, time
        faulthandler.register(signal.SIGUSR1)  # the test asks for a traceback if stuck
        from profkit.pg.build import get_build
        from profkit.pg.cluster import Cluster
        b = get_build("vanilla")
        with Cluster(b, name="test-sigint") as cl:
            open({str(pidfile)!r}, "w").write(" ".join(map(str, [cl.pid, *cl.backend_pids()])))
            time.sleep(120)
    """)
    # A terminal's Ctrl-C reaches a process whose SIGINT is at its default. A test run
    # started as a background job (`make test &` from a script) inherits SIGINT ignored:
    # the child then never sees it and the test would wait 90 s, as one CI run did.
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parent.parent,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not pidfile.exists() or not pidfile.read_text():
        assert proc.poll() is None, "child died before starting the cluster"
        assert time.monotonic() < deadline
        time.sleep(0.2)
    listed = [int(p) for p in pidfile.read_text().split()]
    # a connection's backend may already have exited; the postmaster and its
    # auxiliary processes must be alive
    pids = [p for p in listed if alive(p)]
    assert pids[0] == listed[0] and len(pids) >= 3
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        # still running 90 s after Ctrl-C: where it is stuck, then stop it (by pid)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        proc.kill()
        _out, err = proc.communicate(timeout=30)
        os.kill(pids[0], signal.SIGINT)  # the killed child could not stop its postmaster
        pytest.fail(f"still running 90 s after SIGINT; its stacks:\n{err[-6000:]}")
    # a fast shutdown of an idle cluster takes about a second: a stop that waited for a
    # crash recovery that never happened (or for the 60 s stop timeout) would show here
    assert time.monotonic() - t0 < 30
    time.sleep(0.3)
    assert [p for p in pids if alive(p)] == []


def test_port_taken_gives_clear_error(vanilla_build):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ClusterError, match=f"port {port} is already taken"):
            Cluster(vanilla_build, port=port, tcp=True).start()


def test_unknown_names_and_bad_scale():
    with pytest.raises(SourceError, match="unknown PostgreSQL source"):
        get_source("svn:/nowhere")
    with pytest.raises(SourceError, match="does not exist"):
        get_source("tarball:/nonexistent/postgresql.tar.bz2")
    with pytest.raises(BuildError, match="unknown build 'nonesuch'.*vanilla"):
        resolve_spec("nonesuch")
    with pytest.raises(WorkloadError, match="unknown workload"):
        get_workload("tpcc")
    wl = get_workload("nested_loop")
    for bad in (0, -1, "x"):
        with pytest.raises(WorkloadError, match="scale must be a number > 0"):
            wl.load(None, bad)  # type: ignore[arg-type]


def test_missing_tool_says_how_to_install():
    with pytest.raises(ToolNotFound, match="apt-get install"):
        which("ltrace-not-a-tool")
    with pytest.raises(ToolNotFound, match="install"):
        run(["/nonexistent/bin/perf"])


def _no_entry_for(name: str) -> bool:
    return not any(d.name.startswith(name + "-") for d in paths.sub("builds").iterdir())


def test_patch_that_does_not_apply():
    spec = BuildSpec("test-broken", patches=(str(FIXTURES / "patches" / "broken.patch"),))
    with pytest.raises(PatchError) as ei:
        get_build(spec)
    msg = str(ei.value)
    assert "broken.patch" in msg
    assert "src/backend/executor/execProcnode.c" in msg
    assert "hunk #2" in msg and "@@ -455,6 +456,7 @@" in msg
    assert _no_entry_for("test-broken"), "a failed build must leave no cache entry"
    assert Path(ei.value.log_path).exists()
    Path(ei.value.log_path).unlink()  # the user's cache keeps no log of the tests' builds


def test_patch_that_does_not_apply_is_said_before_waiting_for_another_build():
    """While another build holds the cache's compile lock, a patch that does not apply
    fails at once (not after the other build), with its rejected hunks and a log."""
    import fcntl

    spec = BuildSpec("test-broken", patches=(str(FIXTURES / "patches" / "broken.patch"),))
    with open(paths.sub("builds") / ".compile.lock", "w") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # "another build"
        with pytest.raises(PatchError) as ei:
            get_build(spec)
    assert "hunk #2" in str(ei.value) and "broken.patch" in str(ei.value)
    assert Path(ei.value.log_path).exists()
    # the same words as a build that failed applying it with nobody else building
    assert str(ei.value).startswith("build 'test-broken' failed at step 'patch': ")
    assert str(ei.value).endswith(f"(log: {ei.value.log_path})")
    assert _no_entry_for("test-broken")
    Path(ei.value.log_path).unlink()


def test_a_failed_build_stops_a_list_and_keeps_the_builds_before_it(vanilla_build):
    """get_builds(vanilla, a broken patch, a build after it): vanilla comes back (through
    on_built too), the error is the broken build's own, and the build after it, started
    beside it, is neither configured (it configures after the builds before it have) nor
    compiled nor left in the cache."""
    broken = BuildSpec("test-broken", patches=(str(FIXTURES / "patches" / "broken.patch"),))
    after = BuildSpec("test-after-broken")
    seen, said = [], []
    with pytest.raises(PatchError) as ei:
        get_builds(["vanilla", broken, after], on_built=seen.append, progress=said.append)
    assert [b.dir for b in seen] == [vanilla_build.dir]
    assert str(ei.value).startswith("build 'test-broken' failed at step 'patch': ")
    assert "hunk #2" in str(ei.value)
    assert _no_entry_for("test-broken") and _no_entry_for("test-after-broken")
    assert not [s for s in said if s.startswith(("test-after-broken: configure",
                                                 "test-after-broken: make"))], said
    Path(ei.value.log_path).unlink()


def test_configure_failure():
    spec = BuildSpec("test-badcflags", cflags="-O2 -fno-such-flag-profkit")
    with pytest.raises(BuildError) as ei:
        get_build(spec)
    assert ei.value.step == "configure"
    assert "step 'configure'" in str(ei.value)
    assert "C compiler" in str(ei.value) or "cannot create executables" in str(ei.value)
    assert _no_entry_for("test-badcflags")
    assert Path(ei.value.log_path).exists()
    Path(ei.value.log_path).unlink()


@pytest.mark.slow
def test_one_file_patch_rebuilds_incrementally(vanilla_build):
    spec = BuildSpec("test-touch-execprocnode",
                     patches=(str(FIXTURES / "patches" / "execprocnode-touch.patch"),))
    b = get_build(spec)
    out = run(["nm", b.postgres]).stdout
    assert "profkit_first_calls" in out
    if "ccache" in b.timings:  # fresh build: only the touched file is compiled for real
        # measured in a cold make test on 2026-12-03 (ccache's depend mode, only what
        # profkit uses built): 18 misses, as step2, fast_timing and test-pk15-double-clock
        # (patches to .c files, no header): the touched file plus the objects that miss in
        # every new build tree; a header change (step1, step3) missed 363
        cc = b.timings["ccache"]
        assert cc["cache_miss"] <= 24, b.timings
        assert cc["direct_cache_hit"] + cc["preprocessed_cache_hit"] >= b.timings["objects"] - 30, \
            b.timings
        cold = vanilla_build.timings.get("make_s", 0)
        print(f"one-file patch: make {b.timings['make_s']:.0f} s (vanilla cold/first make "
              f"{cold:.0f} s)")


def test_builds_compile_in_ccache_depend_mode(monkeypatch):
    """ccache reads profkit's settings as meant (a misspelt variable would be ignored
    silently): depend mode, the C library's version in every key, and CCACHE_NODEPEND
    giving ccache's default mode back."""
    from profkit.pg.build import SYSTEM_HEADER_ID, ccache_env

    def config(env: dict[str, str]) -> dict[str, str]:
        out = run(["ccache", "--show-config"], env=env).stdout
        # "(environment) depend_mode = true"
        return {k.split(")")[-1].strip(): v.strip()
                for k, v in (ln.split("=", 1) for ln in out.splitlines() if "=" in ln)}

    monkeypatch.delenv("CCACHE_NODEPEND", raising=False)
    monkeypatch.delenv("CCACHE_DEPEND", raising=False)
    on = config(ccache_env())
    assert on["depend_mode"] == "true", on
    assert on["direct_mode"] == "true" and on["run_second_cpp"] == "true", on
    assert on["extra_files_to_hash"] == SYSTEM_HEADER_ID, on
    assert "__GLIBC_MINOR__" in Path(SYSTEM_HEADER_ID).read_text()
    assert on["hash_dir"] == "false", on
    monkeypatch.setenv("CCACHE_NODEPEND", "1")
    off = config(ccache_env())
    assert off["depend_mode"] == "false", off


def test_recovering_reads_the_log_in_order(vanilla_build, tmp_path):
    """Stop waits for recovery only while the postmaster is really recovering."""
    cl = Cluster(vanilla_build, name="log-only")
    cl.dir = tmp_path
    assert not cl.recovering()  # no log yet
    ready = "LOG:  database system is ready to accept connections"
    crash = "LOG:  client backend (PID 42) was terminated by signal 9: Killed"
    for lines, want in (([ready], False), ([ready, crash], True), ([ready, crash, ready], False),
                        ([crash], True)):
        (tmp_path / "postgres.log").write_text("\n".join(lines) + "\n")
        assert cl.recovering() is want, lines
    assert "terminated by signal 9" in cl.crash_report()  # the report still finds it
