"""What byte-compiling costs make's venv step, and what its absence costs each process.

    python3 benchmarks/venv_setup.py [--rounds 2]

Per round, in new venvs outside the clone (pip's download cache warm, as on any machine
after the first install): `pip install -e '.[dev]'` as pip does it (compiling on one
core), against `pip install --no-compile` followed by `python -m compileall -j 0` over
the venv (make's venv step).  Then, in the compiled venv, `import pandas,
matplotlib.pyplot, scipy.stats` with its bytecode and from source (PYTHONPYCACHEPREFIX
pointed at an empty folder with PYTHONDONTWRITEBYTECODE set: what every process of a venv
without bytecode pays).  Prints wall seconds and user+sys CPU seconds of each.  Take it
with the machine otherwise idle.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMPORTS = "import pandas, matplotlib.pyplot, scipy.stats"


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall s, CPU s of the command and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(argv, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def new_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    py = where / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return py


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="venv-setup-"))
    rows: list[tuple[str, float, float]] = []
    try:
        for r in range(a.rounds):
            py = new_venv(work / f"pip{r}")
            rows.append(("pip install, pip compiling",
                         *timed([str(py), "-m", "pip", "install", "-q", "-e", ".[dev]"])))
            shutil.rmtree(work / f"pip{r}")
            venv = work / f"make{r}"
            py = new_venv(venv)
            w1, c1 = timed([str(py), "-m", "pip", "install", "-q", "--no-compile", "-e",
                            ".[dev]"])
            w2, c2 = timed([str(py), "-m", "compileall", "-q", "-j", "0", str(venv / "lib")])
            rows.append(("pip install --no-compile", w1, c1))
            rows.append(("compileall -j 0", w2, c2))
            rows.append(("make's venv step (the two above)", w1 + w2, c1 + c2))
            env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
            rows.append((f"`{IMPORTS}`, bytecode", *timed([str(py), "-c", IMPORTS], env)))
            empty = work / f"nopyc{r}"
            empty.mkdir()
            rows.append((f"`{IMPORTS}`, from source",
                         *timed([str(py), "-c", IMPORTS],
                                {**env, "PYTHONPYCACHEPREFIX": str(empty)})))
            shutil.rmtree(venv)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{a.rounds} rounds, {os.cpu_count()} CPUs, {sys.version.split()[0]}")
    print("| step | round | wall s | CPU s |\n|---|---|---|---|")
    per_round = len(rows) // a.rounds
    for i, (name, wall, cpu) in enumerate(rows):
        print(f"| {name} | {i // per_round + 1} | {wall:.1f} | {cpu:.1f} |")


if __name__ == "__main__":
    main()
