"""make test's two phases and what its xdist workers share (tests/conftest.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from proc_helpers import alive, start_ticks

from conftest import _shared_by_workers, headline_module

ROOT = Path(__file__).resolve().parent.parent


def _collected(*args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {ln for ln in out.stdout.splitlines() if "::" in ln}


def test_phases_split_the_suite_by_the_alone_mark():
    files = ["tests/test_clock.py", "tests/test_docs.py"]
    everything = _collected(*files)
    alone = _collected("--phase", "alone", *files)
    shared = _collected("--phase", "shared", *files)
    assert alone and shared
    assert alone | shared == everything and not alone & shared
    assert {t.split("::")[0] for t in alone} == {"tests/test_clock.py"}
    assert {t.split("::")[0] for t in shared} == {"tests/test_docs.py"}


def test_the_makefile_runs_both_phases_and_fails_on_either():
    mk = (ROOT / "Makefile").read_text()
    recipe = mk[mk.index("\ntest: setup"):].split("\n\n", 1)[0]
    assert "--phase shared" in recipe and "--phase alone" in recipe
    assert "-n $(TEST_JOBS) --dist loadfile" in recipe
    assert recipe.count("$(PYTEST_ARGS)") == 2


def test_workers_count_a_cell_once_and_share_it(tmp_path, monkeypatch):
    """Two workers (threads here, processes in a run: the lock is a file lock) ask for the
    same cell at once: one counts it, the other waits and reads the same Count."""
    mod = headline_module()
    calls = []

    def measure(build, workload, scale, modes=mod.MODES, say=None, settings=None):
        calls.append((build, workload, scale, tuple(modes)))
        time.sleep(0.5)
        return mod.Count(build, workload, scale, {m: 1000 + i for i, m in enumerate(modes)},
                         "18.6", "abc123def456", "valgrind-3.19.0", 0.5)

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = [_shared_by_workers(mod, measure, "run1") for _ in range(2)]
    got = [None, None]

    def ask(i):
        got[i] = shared[i]("vanilla", "nested_loop", 0.02, ("plain", "analyze_notiming"))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [("vanilla", "nested_loop", 0.02, ("plain", "analyze_notiming"))]
    assert got[0] == got[1] and got[0].instructions == {"plain": 1000, "analyze_notiming": 1001}
    # another cell, another run: counted again
    shared[0]("vanilla", "nested_loop", 0.01, ("plain",))
    _shared_by_workers(mod, measure, "run2")("vanilla", "nested_loop", 0.02,
                                               ("plain", "analyze_notiming"))
    assert len(calls) == 3
    # a patch's setting is not a cell of the matrix: never shared
    shared[1]("vanilla", "nested_loop", 0.02, ("plain",), None, {"x.y": "1"})
    shared[0]("vanilla", "nested_loop", 0.02, ("plain",), None, {"x.y": "1"})
    assert len(calls) == 5
    assert sorted(p.name for p in (tmp_path / "profkit-test-counts-run1").glob("*.json")) \
        and not list((tmp_path / "profkit-test-counts-run1").glob("*.tmp"))


def test_the_last_lines_name_each_failure_and_its_message(tmp_path):
    """make test ends with scripts/test_failures.py over both phases' JUnit XML: each
    failed test, where it failed and its E lines; nothing for a run that passed."""
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n"
        "def test_ok():\n    assert True\n\n"
        "def test_bad():\n    got = {'samples': 12}\n"
        "    assert got['samples'] > 100, got\n\n"
        "class TestK:\n    def test_err(self, nosuchfixture):\n        pass\n")
    xml = tmp_path / "r.xml"

    def pytest_x() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               f"--junitxml={xml}", "--rootdir", str(tmp_path), "-c",
                               "/dev/null", str(tmp_path / "test_x.py")],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)

    cp = pytest_x()
    assert cp.returncode == 1, cp.stdout[-2000:]

    def report(*files: Path) -> list[str]:
        out = subprocess.run([sys.executable, str(ROOT / "scripts" / "test_failures.py"),
                              *map(str, files)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    lines = report(xml, tmp_path / "alone.xml")  # a phase that wrote nothing is passed over
    assert lines[0] == "make test: 2 failed", lines
    bad = lines.index("FAILED test_x.py::test_bad")
    assert lines[bad + 1].startswith("  at ") and "test_x.py:8" in lines[bad + 1], lines
    assert any("{'samples': 12}" in ln and ln.startswith("  E ") for ln in lines), lines
    assert "ERROR test_x.py::TestK::test_err" in lines
    assert any("nosuchfixture" in ln for ln in lines[lines.index(
        "ERROR test_x.py::TestK::test_err"):]), lines
    # a run that passed: nothing printed
    (tmp_path / "test_x.py").write_text("def test_ok():\n    assert True\n")
    assert pytest_x().returncode == 0
    assert report(xml) == []


def test_a_run_leaves_nothing_in_the_temp_directory(tmp_path):
    """Under xdist (a controller, as a run without xdist, and two workers): the profiles
    folder the run made and the workers' shared count folder are gone when pytest ends."""
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PROFKIT_PROFILES", "PROFKIT_FLAMEGRAPHS", "PYTEST_XDIST_WORKER",
                        "PYTEST_XDIST_TESTRUNUID", "PYTEST_CURRENT_TEST")}
    env["TMPDIR"] = str(temp)
    probe = ("tests/test_phases.py::test_workers_count_a_cell_once_and_share_it",
             "tests/test_env_files.py")
    cp = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         f"--basetemp={tmp_path / 'base'}", "-n", "2", "--dist", "loadfile",
                         *probe], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600)
    assert cp.returncode == 0, cp.stdout[-3000:]
    assert sorted(p.name for p in temp.iterdir()) == [], list(temp.iterdir())


INNER = '''
import os, time
from pathlib import Path
import pytest
from profkit.processes import Background

OUT = Path(os.environ["INNER_OUT"])


@pytest.fixture(scope="module")
def held():
    yield
    (OUT / "teardown").write_text("ran")


def test_first(held):
    bg = Background(["sleep", "600"]).start()
    (OUT / "sleep.pid").write_text(str(bg.pid))
    (OUT / "profiles").write_text(os.environ["PROFKIT_PROFILES"])
    (OUT / "ready").write_text("1")
    time.sleep(600)


def test_second():
    (OUT / "second").write_text("ran")
'''


@pytest.mark.parametrize("workers,whom", [(0, "group"), (2, "group"), (2, "leader")])
def test_a_terminated_run_stops_cleans_up_and_runs_nothing_more(tmp_path, workers, whom):
    """SIGTERM (a CI job's time limit, `timeout`, `kill`) to the run's process group ends
    the run as Ctrl-C does: the test running is interrupted, no other test starts, the
    fixtures' teardowns run, what the tests started is stopped by pid and the run's
    temporary folder is removed; sent to the whole group (every xdist worker gets it) or
    to pytest alone (the controller stops its workers), also when the run started with
    SIGINT ignored, as a background job does.  Before, profkit's own handler
    failed the running test and the run went on to the next (Python's default would have
    died at once: no teardown, no clean-up)."""
    (tmp_path / "test_inner.py").write_text(INNER)
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PROFKIT_PROFILES", "PROFKIT_FLAMEGRAPHS", "PYTEST_"))}
    env.update(INNER_OUT=str(out), PYTHONPATH=str(ROOT / "tests"))
    argv = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
            *(["-n", str(workers), "--dist", "loadfile"] if workers else []),
            "test_inner.py"]
    # started as a background job starts (`make test &`, nohup, some CI runners): with
    # SIGINT ignored, which xdist's workers must not keep (conftest)
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 120
        while not (out / "ready").exists():
            assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
            assert time.monotonic() < deadline, "the inner test did not start in 120 s"
            time.sleep(0.2)
        sleeper = int((out / "sleep.pid").read_text())
        start = start_ticks(sleeper)
        assert alive(sleeper, start)
        profiles = Path((out / "profiles").read_text())
        assert profiles.parent.name.startswith("profkit-tests-") and profiles.parent.is_dir()
        (os.killpg if whom == "group" else os.kill)(proc.pid, signal.SIGTERM)
        text = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, text
    assert (out / "teardown").read_text() == "ran", text
    assert not (out / "second").exists(), text
    assert not alive(sleeper, start), text
    assert not profiles.parent.exists(), text
