"""The fresh-machine path, on every `make test`: vanilla built into an EMPTY cache.

A warm build cache hides a broken first run (it did once: under make, PostgreSQL's
own make skipped its generated headers and every cold build failed). So each run
builds vanilla again into a new, empty PROFKIT_CACHE, through the CLI, with make's
variables in the environment exactly as `make demo` / `make test` leave them, then
runs the integration smoke on it: start a cluster, load, Query-1/2/3, stop.  step1 is
built in the same command, as a fresh machine's list of builds is: its source copy,
patch and configure beside vanilla's, its compile after vanilla's.

Reused to keep it to minutes: the source download and apt lists (symlinked from the
machine's cache) and ccache (CCACHE_DIR); configure, the source tree, the build tree
and the install are all made anew.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proc_helpers import alive, proc_text

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.pg, pytest.mark.cold]


def _session_ccache() -> str:
    """The ccache this session's builds fill and read: $CCACHE_DIR when set, else the one
    in the warm cache (profkit.pg.build.ccache_env, evaluated here, before PROFKIT_CACHE
    points at the empty cache).  A fixed ``<warm cache>/ccache`` missed every object when
    CCACHE_DIR was set (benchmarks/fresh_machine.py --root sets it): the cold-path build
    then compiled vanilla and step1 from nothing, 730 s of a cold make test."""
    from profkit.pg.build import ccache_env

    return ccache_env()["CCACHE_DIR"]


@pytest.fixture(scope="module")
def cold_build():
    from profkit import paths

    # Not under pytest's basetemp: pytest keeps /tmp/pytest-of-<user> at mode 0700 (and
    # resets it whenever a session starts), and postgres runs as the user profkit, which
    # must reach the install. The warm cache's own folder is readable by it already.
    cold = paths.empty_cache("cold-cache-")
    env = {**os.environ, "PROFKIT_CACHE": str(cold), "CCACHE_DIR": _session_ccache(),
           "MAKELEVEL": "1", "MAKEFLAGS": "w", "MFLAGS": "-w"}
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "profkit.cli", "build", "vanilla", "step1"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600,
                        stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - t0
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    builds = {d.name.split("-")[0]: d for d in (cold / "builds").iterdir()
              if (d / "COMPLETE").exists()}
    assert sorted(builds) == ["step1", "vanilla"], builds
    # one line per build on stdout, in the order asked
    assert [ln.split("\t")[0] for ln in cp.stdout.splitlines()] == ["vanilla", "step1"], cp.stdout
    print(f"cold vanilla and step1 builds: {seconds:.0f} s")
    yield cold, builds["vanilla"], env, builds["step1"]
    shutil.rmtree(cold, ignore_errors=True)


def test_cold_build_is_complete_and_new(cold_build):
    from profkit import paths

    cold, bdir, _env, _step1 = cold_build
    info = json.loads((bdir / "build.json").read_text())
    # made here, not copied: its own source tree, configure run and install
    assert Path(info["dir"]) == bdir and str(cold) in info["source"]["path"]
    assert (bdir / "build" / "config.status").exists()
    assert (bdir / "build" / "src" / "include" / "utils" / "errcodes.h").exists()
    assert info["timings"]["configure_s"] > 0 and info["timings"]["make_s"] > 0
    # compiled through the session's ccache, which holds vanilla's objects by now (the
    # session builds vanilla first): nearly every object hits (step2, built after vanilla,
    # misses 18 of its 1,168 compiles; vanilla from nothing misses 1,233)
    misses = info["timings"]["ccache"]["cache_miss"]
    assert misses <= 200, (
        f"the cold-path build of vanilla missed {misses} objects in ccache "
        f"{_session_ccache()}: it should reuse the objects the session's vanilla left "
        "there (an emptied ccache refills on this run; the next one hits)")
    assert Path(paths.cache_dir()) != cold  # the session's own cache is untouched


def test_a_list_of_builds_compiles_one_at_a_time_in_order_and_overlaps_the_rest(cold_build):
    """`profkit build vanilla step1`: step1's source copy, patch and configure began
    before vanilla compiled; step1 compiled only once vanilla had (one compile at a time,
    in the order given: a variant finds the objects of the builds before it in ccache),
    and at once: during vanilla's make install, or the moment it had configured."""
    _cold, vdir, _env, sdir = cold_build
    v = json.loads((vdir / "build.json").read_text())["timings"]
    s = json.loads((sdir / "build.json").read_text())["timings"]
    for t in (v, s):
        assert (t["started_at"] <= t["configured_at"] <= t["make_started_at"]
                < t["make_ended_at"] < t["ended_at"]), t
    assert s["started_at"] < v["make_started_at"], (v, s)
    assert s["make_started_at"] >= v["make_ended_at"], (v, s)
    # step1 compiles as soon as vanilla has, during vanilla's make install, unless it was
    # still configuring then (a loaded machine): then it compiles once it has configured
    if s["configured_at"] <= v["make_ended_at"]:
        assert s["make_started_at"] < v["ended_at"], (v, s)
    else:
        assert s["make_started_at"] - s["configured_at"] < 1.0, (v, s)


def test_cold_build_smoke(cold_build, monkeypatch):
    from profkit.pg.build import Build
    from profkit.pg.cluster import Cluster
    from profkit.pg.workloads import get_workload

    cold, bdir, _env, _step1 = cold_build
    monkeypatch.setenv("PROFKIT_CACHE", str(cold))
    build = Build.from_dir(bdir)
    wl = get_workload("nested_loop")
    scale = 0.01
    with Cluster(build, name="cold-smoke") as cl:
        pids = [cl.pid, *cl.backend_pids()]
        with cl.connect() as conn:
            wl.load(conn, scale)
            q1 = conn.execute(wl.query("plain")).fetchone()[0]
            assert q1 == wl.expected_rows(scale)
            for mode in ("analyze_notiming", "analyze_timing"):
                plan = conn.execute(wl.query(mode, fmt="json")).fetchone()[0][0]["Plan"]
                assert plan["Actual Rows"] == 1 and plan["Actual Loops"] == 1
                assert ("Actual Total Time" in plan) == (mode == "analyze_timing")
                ver = conn.execute("SHOW server_version").fetchone()[0]
                assert build.version == f"PostgreSQL {ver}"
    time.sleep(0.3)
    assert [p for p in pids if alive(p)] == []


def _processes_with(env_entry: str) -> list[int]:
    """Live processes whose environment holds *env_entry* (a build's commands inherit
    PROFKIT_CACHE: configure, make, the compilers)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid() and alive(int(d.name)):
            if env_entry in proc_text(int(d.name), "environ").split("\0"):
                out.append(int(d.name))
    return out


def test_ctrl_c_stops_both_builds_of_a_list():
    """Ctrl-C while `profkit build vanilla step1` has vanilla compiling and step1
    configuring: exit 130, no configure, make or compiler left running (their process
    groups are their own, out of the terminal's reach), neither half-made tree left in the
    cache, and no log of a failed build: both were stopped, neither failed."""
    from profkit import paths

    cold = paths.empty_cache("cold-cache-")
    env = {**os.environ, "PROFKIT_CACHE": str(cold), "CCACHE_DIR": _session_ccache()}
    try:
        p = subprocess.Popen([sys.executable, "-m", "profkit.cli", "build", "vanilla", "step1"],
                             cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        said = []
        try:
            while not {"vanilla: configure", "step1: configure"} <= {ln.strip("• \n")
                                                                     for ln in said}:
                # step1 configures once vanilla has (the same answers: autoconf's cache)
                line = p.stderr.readline()
                assert line, "".join(said)
                said.append(line)
            time.sleep(1)  # configure is running: its children too
            assert _processes_with(f"PROFKIT_CACHE={cold}"), "nothing to stop yet"
            p.send_signal(signal.SIGINT)
            rest = p.communicate(timeout=120)[1]
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 130, "".join(said) + rest
        assert "interrupted" in rest, rest
        time.sleep(0.5)
        assert _processes_with(f"PROFKIT_CACHE={cold}") == []
        assert [d.name for d in (cold / "builds").iterdir() if not d.name.startswith(".")] == []
        # nothing failed: no build log kept as a failure's (make test stops its background
        # builder so, and a user's cache kept "step5_clang-...-failed-...log" for it)
        assert sorted(p.name for p in (cold / "logs").glob("*failed*")) == []
    finally:
        shutil.rmtree(cold, ignore_errors=True)
