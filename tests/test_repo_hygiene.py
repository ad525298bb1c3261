"""The repository never tracks profiler output or core files, and make's
variables never reach the programs profkit starts (PostgreSQL's make above all)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from profkit import processes as runmod

ROOT = Path(__file__).resolve().parent.parent
JUNK = re.compile(r"(^|/)(gmon\.out|perf\.data(\.old)?|core(\.[0-9]+)?|callgrind\.out\.[0-9]+)$")


def test_no_profiler_output_or_core_tracked():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.splitlines()
    assert files, "git ls-files listed nothing: not a clone?"
    junk = [f for f in files if JUNK.search(f)]
    assert junk == [], f"profiler output tracked in git (git rm --cached it): {junk}"


def test_junk_pattern_matches_what_tools_write():
    for name in ("gmon.out", "x/gmon.out", "perf.data", "perf.data.old", "core", "core.123",
                 "callgrind.out.4242"):
        assert JUNK.search(name), name
    for name in ("gmon.out.txt", "tests/fixtures/callgrind/fib.callgrind.out", "score",
                 "profkit/collect/core.py", "perf.data.json"):
        assert not JUNK.search(name), name


MAKE_ENV = {"MAKELEVEL": "1", "MAKEFLAGS": "w -j2 --jobserver-auth=fifo:/tmp/x", "MFLAGS": "-w",
            "MAKEOVERRIDES": "${-*-command-variables-*-}", "GNUMAKEFLAGS": "--no-print-directory"}


def _child_env_lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.split("\0") if "=" in line)


def test_children_never_see_make_variables(monkeypatch, tmp_path):
    """As under `make test`: the test process itself carries MAKELEVEL=1 and friends."""
    for k, v in MAKE_ENV.items():
        monkeypatch.setenv(k, v)
    # run(): with and without extra variables (the build passes CC, CCACHE_* ...)
    for extra in (None, {"CC": "ccache gcc"}):
        env = _child_env_lines(runmod.run(["env", "-0"], env=extra).stdout)
        assert not set(MAKE_ENV) & set(env), env
        assert env["PATH"]  # the rest of the environment is passed on
        if extra:
            assert env["CC"] == "ccache gcc"
    # a make child: MAKELEVEL must be 0 in the recipes of a top-level make we start
    mk = tmp_path / "Makefile"
    mk.write_text("all:\n\t@echo level=$(MAKELEVEL) flags=[$(MAKEFLAGS)]\n")
    out = runmod.run(["make", "-s", "-f", str(mk)], cwd=tmp_path).stdout
    assert "level=0" in out and "jobserver" not in out, out
    # Background (postgres, perf, tracers) too
    log = tmp_path / "bg.env"
    bg = runmod.Background(["env", "-0"], stdout_path=log).start()
    bg.proc.wait(10)
    bg.stop()
    env = _child_env_lines(log.read_text())
    assert not set(MAKE_ENV) & set(env) and env["PATH"]


def test_interrupted_command_leaves_no_grandchild(tmp_path):
    """A timeout (like Ctrl-C) kills the command's whole group, not just its leader:
    an interrupted `make -j2` must not leave compilers running."""
    import os
    import time

    from profkit.errors import CommandFailed

    pidfile = tmp_path / "grandchild.pid"
    script = f"sleep 60 & echo $! > {pidfile}; wait"
    t0 = time.monotonic()
    try:
        runmod.run(["sh", "-c", script], timeout=1.0)
    except CommandFailed as e:
        assert "timed out" in str(e)
    else:
        raise AssertionError("the command should have timed out")
    assert time.monotonic() - t0 < 10
    pid = int(pidfile.read_text())
    time.sleep(0.3)
    try:
        os.kill(pid, 0)
        alive = open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except ProcessLookupError:
        alive = False
    assert not alive, f"grandchild {pid} survived"
