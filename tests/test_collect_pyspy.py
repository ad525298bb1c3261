"""py-spy collector on real Python child processes (no PostgreSQL needed).

The child splits its work between two functions that run the same loop body, ``hot``
3 times as many iterations as ``cold``, in turn; so py-spy must find ``hot`` on the stack
in ~75% of the samples and ``cold`` in ~25%. (A split by the clock — hot until t+3 ms,
cold until t+4 ms — gave 35–63% for hot on this loaded 2-core VM: samples then
correlate with the scheduler's preemptions, which the clock-driven loop turns into
time shifts between the two functions. A split by work is preempted alike in both.)
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from profkit.collect import pyspy
from profkit.experiments import profile as prof_exp
from profkit.rundir import load_run, open_run
from profkit.render.flamegraph import render

CHILD = '''
import sys, time

def hot(n):
    x = 0
    for i in range(n):
        x += i
    return x

def cold(n):
    x = 0
    for i in range(n):
        x -= i
    return x

def drive(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        hot(30000)
        cold(10000)

drive(float(sys.argv[1]))
'''


@pytest.fixture
def child_script(tmp_path: Path) -> Path:
    p = tmp_path / "busy_child.py"
    p.write_text(CHILD)
    return p


def _start(script: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(script), str(seconds)])
    time.sleep(0.3)  # past interpreter start-up, inside drive()
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()  # our own child, by pid
    proc.wait(10)


def _check_shares(prof: pyspy.PySpyProfile, samples: int) -> None:
    assert samples > 100
    hot, cold = prof.share("hot"), prof.share("cold")
    # 3 : 1 by work; ±0.12 covers sampling noise at a few hundred samples
    assert hot == pytest.approx(0.75, abs=0.12), prof.top()
    assert cold == pytest.approx(0.25, abs=0.12), prof.top()
    f = prof.functions.set_index("function")
    # when py-spy launches the command it also samples interpreter start-up
    # (imports) outside drive(): a few percent on a loaded machine
    assert f.loc["drive", "total_share"] > 0.85
    assert f.loc["hot", "module"] == "busy_child.py"
    assert prof.functions["frame"].str.startswith("hot (").any()


def test_record_pid_duration(child_script: Path, tmp_path: Path) -> None:
    proc = _start(child_script, 30)
    try:
        with open_run(pyspy.TOOL, workload="busy", base=tmp_path / "profiles") as rd:
            rec, _ = pyspy.record_pid(proc.pid, duration=2, rate=200, run=rd)
    finally:
        _stop(proc)
    prof = pyspy.fold_run(rec.run_dir)
    assert rec.samples is not None
    _check_shares(prof, rec.samples)
    assert sum(prof.counts.values()) == rec.samples
    d = Path(rec.run_dir)
    for name in ("pyspy.folded", "py-spy.log", "stacks.parquet", "functions.parquet",
                 "provenance.json"):
        assert (d / name).exists(), name
    p = load_run(d).provenance
    assert p["tool"] == "py-spy" and p["pid"] == proc.pid and p["status"] == "complete"
    assert p["tools"]["py-spy"].startswith("py-spy")
    # the same stacks make a flamegraph
    svg = render(prof.counts, title="busy child", provenance=load_run(d).subtitle_facts())
    assert "hot (busy_child.py)" in svg and "cold (busy_child.py)" in svg


def test_record_pid_while_action(child_script: Path, tmp_path: Path) -> None:
    proc = _start(child_script, 30)
    try:
        with open_run(pyspy.TOOL, base=tmp_path) as rd:
            rec, result = pyspy.record_pid(proc.pid, action=lambda: time.sleep(2.0) or "done",
                                           rate=200, run=rd)
    finally:
        _stop(proc)
    assert result == "done"
    assert rec.samples is not None
    _check_shares(pyspy.fold_run(rec.run_dir), rec.samples)


def test_record_command(child_script: Path, tmp_path: Path) -> None:
    with open_run(pyspy.TOOL, base=tmp_path) as rd:
        rec = pyspy.record_command([sys.executable, str(child_script), "1.5"], rate=200,
                                   run=rd)
    prof = pyspy.fold_run(rec.run_dir)
    assert rec.samples is not None
    _check_shares(prof, rec.samples)
    assert "<module>" in set(prof.functions["function"])


def test_dead_pid(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(10)
    with pytest.raises(pyspy.PySpyError, match=f"process {proc.pid} does not exist"):
        prof_exp.pyspy_run(pid=proc.pid, duration=1, base=tmp_path)
    assert not any(tmp_path.iterdir())  # refused before a run is opened


def test_not_a_python_process(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(pyspy.PySpyError, match="does not look like a Python interpreter"):
            prof_exp.pyspy_run(pid=proc.pid, duration=1, base=tmp_path)
    finally:
        _stop(proc)
    # the failed run says why and keeps py-spy's log
    run = next(tmp_path.iterdir())
    prov = load_run(run).provenance
    assert prov["status"] == "failed" and "Python interpreter" in prov["error"]
    assert (run / "py-spy.log").read_text()


def test_bad_arguments(tmp_path: Path) -> None:
    with open_run(pyspy.TOOL, base=tmp_path) as rd:
        with pytest.raises(pyspy.PySpyError, match="exactly one of duration"):
            pyspy.record_pid(1, run=rd)
        with pytest.raises(pyspy.PySpyError, match="rate"):
            pyspy.record_command([sys.executable, "-c", "pass"], rate=0, run=rd)
    # refused before py-spy ran: the run holds its provenance only
    assert sorted(p.name for p in rd.path.iterdir()) == ["provenance.json"]
    from profkit.errors import ToolNotFound

    with pytest.raises(ToolNotFound, match=r"pip install .profkit\[pyspy\]."):
        pyspy.pyspy_path("/nonexistent/py-spy")


def test_split_frame() -> None:
    assert pyspy.split_frame("hot (busy_child.py)") == ("hot", "busy_child.py")
    assert pyspy.split_frame("hot (busy_child.py:12)") == ("hot", "busy_child.py")
    assert pyspy.split_frame("<module> (<string>)") == ("<module>", "<string>")
    assert pyspy.split_frame("process 12:\"python x.py\"") == ("process 12:\"python x.py\"", "")


def test_cli_pyspy(child_script: Path, tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from profkit.cli import main

    monkeypatch.setenv("PROFKIT_PROFILES", str(tmp_path / "profiles"))
    out = tmp_path / "fg"
    r = CliRunner().invoke(main, ["py-spy", "--rate", "200", "--label", "busy", "--out",
                                  str(out), "--", sys.executable, str(child_script), "1"])
    assert r.exit_code == 0, r.output
    assert "hot" in r.output and "busy_child.py" in r.output
    svg = (out / "py-spy-busy.svg").read_text()
    assert "hot (busy_child.py)" in svg and "py-spy record --rate 200" in svg
    r = CliRunner().invoke(main, ["py-spy"])
    assert r.exit_code == 2 and "--pid PID or a command" in r.output
