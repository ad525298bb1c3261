"""The command line's one explicit list of commands, and its loud failure."""
from __future__ import annotations

import os
import subprocess
import sys

import click
import pytest


def test_every_listed_command_is_attached_under_its_name() -> None:
    from profkit.cli import COMMANDS, main

    names = [c.name for c in COMMANDS]
    assert len(names) == len(set(names))
    assert sorted(main.commands) == sorted(names)
    assert {"build", "cluster", "load", "regress", "parse", "flamegraph", "clock-cost",
            "clock-calls", "probe", "bench", "reproduce", "observers", "correction", "perf",
            "gprof", "callgrind", "py-spy", "timing-accuracy", "import", "export",
            "record-script", "nodetime"} == set(names)
    assert all(isinstance(c, click.Command) for c in COMMANDS)


def test_a_command_module_that_fails_to_import_fails_profkit_loudly() -> None:
    # The old importlib loop skipped a module whose ModuleNotFoundError named the module
    # itself: the command vanished from --help without a word. Now it is an error.
    code = ("import sys; sys.modules['profkit.cli.probe'] = None\n"
            "import profkit.cli")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode != 0
    assert "ModuleNotFoundError" in cp.stderr and "profkit.cli.probe" in cp.stderr


def test_a_command_module_raising_on_import_fails_the_command_line() -> None:
    code = ("import runpy, sys\n"
            "class Broken:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'profkit.cli.observers':\n"
            "            raise RuntimeError('broken command module')\n"
            "sys.meta_path.insert(0, Broken())\n"
            "sys.argv = ['profkit', '--help']\n"
            "runpy.run_module('profkit', run_name='__main__')")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode != 0
    assert "RuntimeError: broken command module" in cp.stderr
    assert "Commands:" not in cp.stdout


def test_python_dash_m_profkit_lists_the_commands() -> None:
    cp = subprocess.run([sys.executable, "-m", "profkit", "--help"], capture_output=True,
                        text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    for name in ("bench", "timing-accuracy", "observers", "correction", "probe"):
        assert f"  {name} " in cp.stdout


HEAVY = ("pandas", "numpy", "psycopg", "matplotlib", "rich", "scipy", "pyarrow", "elftools")


@pytest.mark.parametrize("argv, env", [
    (["--version"], {}),
    (["--help"], {}),
    (["perf", "--help"], {}),
    ([], {"_PROFKIT_COMPLETE": "bash_complete", "COMP_WORDS": "profkit clo", "COMP_CWORD": "1"}),
])
def test_the_command_line_starts_without_the_heavy_libraries(argv: list[str],
                                                             env: dict[str, str]) -> None:
    """--version, --help and completion import click and profkit's command modules only:
    pandas, numpy, psycopg, rich… load where a command's work needs them (each costs a
    command line tenths of a second; benchmarks/bench_cli_startup.py times it)."""
    code = ("import atexit, sys, runpy\n"
            "atexit.register(lambda: sys.stderr.write('MODULES ' + ' '.join(sys.modules)))\n"
            f"sys.argv = ['profkit', *{argv!r}]\n"
            "runpy.run_module('profkit', run_name='__main__')\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=60, env={**os.environ, **env})
    assert cp.returncode == 0, cp.stderr
    loaded = {m.split(".")[0] for m in cp.stderr.rpartition("MODULES ")[2].split()}
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    if env:
        assert cp.stdout.split() == ["plain,clock-calls", "plain,clock-cost"], cp.stdout
    else:
        assert cp.stdout.startswith("profkit 0.") or "Usage:" in cp.stdout
