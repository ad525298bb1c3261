"""Every notebook runs headless, top to bottom, and its asserts pass.

The reviewed source is the jupytext ``.py`` (percent format); each is converted in
memory and executed with nbclient in a real ipykernel (the venv's ``python3``
kernel), at a small scale. ``PROFKIT_PROFILES`` points at a fresh directory, so
the notebooks cannot lean on runs left in profiles/ by earlier work: the first
execution of each collects for real. Notebook 01 then runs a second time to
check that it reads the run it wrote instead of collecting again.

Parameters are injected after the cell tagged ``parameters`` (papermill's
convention), so the tests pin the small scales even if a notebook's defaults grow.

Also: each ``.ipynb`` is the jupytext pair of its ``.py`` (same cells, same
sources), so the committed notebooks never drift from the reviewed text.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(p.name for p in NB_DIR.glob("[0-9][0-9]_*.py"))

# Small scales for the test run; per-notebook timeout in seconds.
PARAMS: dict[str, dict[str, object]] = {
    "01_overhead.py": {"SCALE": 0.02, "REPS": 5, "INSTR_BUDGET_S": 15.0},
    "02_flamegraphs.py": {"SCALE": 0.03},
    "03_instrumentation_calls.py": {"SCALE": 0.2},
    "04_clock_calls_per_node.py": {"SCALE": 0.02, "REPS": 5},
    "05_clock_sources.py": {"SCALE": 0.02, "REPS": 5, "CLOCK_LOOPS": 2_000_000},
}
TIMEOUT_S: dict[str, int] = {"01_overhead.py": 600, "03_instrumentation_calls.py": 600}
DEFAULT_TIMEOUT_S = 300


def load(name: str) -> nbformat.NotebookNode:
    return jupytext.read(NB_DIR / name)


def inject_parameters(nb: nbformat.NotebookNode, params: dict[str, object]) -> None:
    """Insert a cell assigning *params* right after the cell tagged "parameters"."""
    idx = next((i for i, c in enumerate(nb.cells)
                if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    assert idx is not None, "no cell tagged 'parameters'"
    src = "# injected by tests/test_notebooks.py\n" + "\n".join(
        f"{k} = {v!r}" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(src)
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(idx + 1, cell)


def execute(nb: nbformat.NotebookNode, timeout: int, env: dict[str, str]) -> float:
    client = nbclient.NotebookClient(
        nb, timeout=timeout, kernel_name="python3",
        resources={"metadata": {"path": str(NB_DIR)}})
    t0 = time.monotonic()
    # env goes to the kernel process (jupyter_client's start_kernel(env=...))
    client.execute(env={**os.environ, **env})
    return time.monotonic() - t0


def outputs_text(nb: nbformat.NotebookNode) -> str:
    parts = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream":
                parts.append(o.get("text", ""))
            elif "data" in o:
                parts.append(str(o["data"].get("text/plain", "")))
                parts.append(str(o["data"].get("text/html", "")))
    return "\n".join(parts)


@pytest.fixture(scope="module")
def profiles(tmp_path_factory, vanilla_build):
    # vanilla_build: the notebooks need it; building it belongs to the session fixture
    return tmp_path_factory.mktemp("nb-profiles")


def test_every_notebook_has_parameters_and_asserts():
    assert len(NOTEBOOKS) == 5, NOTEBOOKS
    for name in NOTEBOOKS:
        nb = load(name)
        first_code = next(c for c in nb.cells if c.cell_type == "code")
        assert "parameters" in first_code.metadata.get("tags", []), name
        for p in ("SCALE", "RUN_DIR"):
            assert f"{p} =" in first_code.source, (name, p)
        n_asserts = sum(c.source.count("assert ") for c in nb.cells if c.cell_type == "code")
        assert n_asserts >= 4, (name, n_asserts)
        assert name in PARAMS


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_ipynb_is_paired_with_py(name):
    """The committed .ipynb holds the same cells as the .py (`jupytext --sync` keeps it)."""
    ipynb = NB_DIR / name.replace(".py", ".ipynb")
    assert ipynb.exists(), f"{ipynb.name} missing: run `jupytext --to ipynb notebooks/{name}`"
    a = jupytext.read(NB_DIR / name)
    b = nbformat.read(ipynb, as_version=4)
    strip = [(c.cell_type, c.source.strip()) for c in a.cells]
    strip_b = [(c.cell_type, c.source.strip()) for c in b.cells]
    assert strip == strip_b, f"{ipynb.name} is out of sync with {name}: jupytext --sync"
    assert b.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent"


@pytest.mark.pg
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_and_asserts(name, profiles):
    nb = load(name)
    inject_parameters(nb, PARAMS[name])
    env = {"PROFKIT_PROFILES": str(profiles / name.removesuffix(".py")),
           "PROFKIT_FLAMEGRAPHS": str(profiles / "flamegraphs")}
    try:
        seconds = execute(nb, TIMEOUT_S.get(name, DEFAULT_TIMEOUT_S), env)
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{name}: a cell failed:\n{str(e)[-4000:]}")
    print(f"{name}: {seconds:.1f} s")
    text = outputs_text(nb)
    assert "Traceback" not in text
    if name == "01_overhead.py":
        assert "collected a fresh run" in text
        # a second execution finds that run in profiles/ and does not collect again
        again = load(name)
        inject_parameters(again, PARAMS[name])
        seconds2 = execute(again, DEFAULT_TIMEOUT_S, env)
        text2 = outputs_text(again)
        assert "read an earlier run from disk" in text2, text2[-2000:]
        assert seconds2 < seconds
    if name == "02_flamegraphs.py":
        assert text.count("<iframe srcdoc=") >= 3
