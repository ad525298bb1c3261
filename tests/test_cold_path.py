"""The fresh-machine path, on every `make test`: vanilla built into an EMPTY cache.

A warm build cache hides a broken first run (it did once: under make, PostgreSQL's
own make skipped its generated headers and every cold build failed). So each run
builds vanilla again into a new, empty PROFKIT_CACHE, through the CLI, with make's
variables in the environment exactly as `make demo` / `make test` leave them, then
runs the integration smoke on it: start a cluster, load, Query-1/2/3, stop.

Reused to keep it to minutes: the source download and apt lists (symlinked from the
machine's cache) and ccache (CCACHE_DIR); configure, the source tree, the build tree
and the install are all made anew.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proc_helpers import alive

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.pg, pytest.mark.cold]


@pytest.fixture(scope="module")
def cold_build():
    from profkit import paths

    warm = paths.cache_dir()
    # Not under pytest's basetemp: pytest keeps /tmp/pytest-of-<user> at mode 0700 (and
    # resets it whenever a session starts), and postgres runs as the user profkit, which
    # must reach the install. The warm cache's own folder is readable by it already.
    cold = paths.empty_cache("cold-cache-")
    env = {**os.environ, "PROFKIT_CACHE": str(cold), "CCACHE_DIR": str(warm / "ccache"),
           "MAKELEVEL": "1", "MAKEFLAGS": "w", "MFLAGS": "-w"}
    t0 = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "profkit.cli", "build", "vanilla"], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=3600,
                        stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - t0
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    builds = [d for d in (cold / "builds").iterdir() if (d / "COMPLETE").exists()]
    assert len(builds) == 1 and builds[0].name.startswith("vanilla-"), builds
    print(f"cold vanilla build: {seconds:.0f} s")
    yield cold, builds[0], env
    shutil.rmtree(cold, ignore_errors=True)


def test_cold_build_is_complete_and_new(cold_build):
    from profkit import paths

    cold, bdir, _env = cold_build
    info = json.loads((bdir / "build.json").read_text())
    # made here, not copied: its own source tree, configure run and install
    assert Path(info["dir"]) == bdir and str(cold) in info["source"]["path"]
    assert (bdir / "build" / "config.status").exists()
    assert (bdir / "build" / "src" / "include" / "utils" / "errcodes.h").exists()
    assert info["timings"]["configure_s"] > 0 and info["timings"]["make_s"] > 0
    assert Path(paths.cache_dir()) != cold  # the session's own cache is untouched


def test_cold_build_smoke(cold_build, monkeypatch):
    from profkit.pg.build import Build
    from profkit.pg.cluster import Cluster
    from profkit.pg.workloads import get_workload

    cold, bdir, _env = cold_build
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
