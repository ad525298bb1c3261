"""A non-editable install outside the clone (issue 14): ``pip install .`` into a fresh
venv, then profkit runs from an empty folder — its files land in that folder, never in
site-packages — and the command line works without the jupyter extra (IPython is not
imported by it)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_pip_install_outside_the_clone(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    # from a copy of the source: pip builds in the tree it is given (build/, *.egg-info),
    # and a stale build/lib in the clone could slip old modules into the wheel
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "profiles", "flamegraphs", ".hypothesis",
        "*_cache", "__pycache__", "gmon.out"))
    cp = subprocess.run([str(py), "-m", "pip", "install", "-q", str(src)], capture_output=True,
                        text=True, timeout=1200)
    assert cp.returncode == 0, cp.stderr[-3000:]
    site = Path(subprocess.run([str(py), "-c", "import profkit, os; print(os.path.dirname("
                                "os.path.dirname(profkit.__file__)))"], capture_output=True,
                               text=True, check=True, timeout=60, cwd=tmp_path).stdout.strip())
    assert site.name == "site-packages" and ROOT not in site.parents
    # the extras stay out of a plain install, and the command line does not need them
    for mod in ("IPython", "gprof2dot", "hypothesis"):
        found = subprocess.run([str(py), "-c", f"import {mod}"], capture_output=True,
                               timeout=60, cwd=tmp_path).returncode == 0
        assert not found, f"{mod} is installed by a plain `pip install .`"
    cp = subprocess.run([str(py), "-c", "import sys, profkit.cli; "
                         "print('IPython' in sys.modules)"], capture_output=True, text=True,
                        timeout=60, check=True, cwd=tmp_path)
    assert cp.stdout.strip() == "False"

    work = tmp_path / "empty"
    work.mkdir()
    folded = work / "some.folded"
    folded.write_text((ROOT / "tests/fixtures/perf/expected_clockloop.folded").read_text())
    env = {k: v for k, v in os.environ.items()
           if k not in ("PROFKIT_PROFILES", "PROFKIT_FLAMEGRAPHS", "PROFKIT_HOME")}
    profkit = str(venv / "bin" / "profkit")
    cp = subprocess.run([profkit, "flamegraph", "some.folded"], cwd=work, env=env,
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    assert (work / "flamegraphs" / "some.svg").exists()
    assert not (site / "flamegraphs").exists() and not (site / "profiles").exists()
    cp = subprocess.run([profkit, "--version"], capture_output=True, text=True, timeout=60)
    assert cp.stdout.startswith("profkit ")
