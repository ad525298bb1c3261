"""py-spy on a Python process: folded stacks into the same tables and flamegraphs as perf.

Python frames are invisible to perf (it sees ``_PyEval_EvalFrameDefault``), so the
client side of a measurement — the program driving the queries, a notebook kernel, a
PL/Python backend — is profiled with py-spy, which reads the interpreter's frames from
outside (ptrace/process_vm_readv; root or the same user). Three ways:

- :func:`record_pid` with ``duration=``: ``py-spy record --pid PID -d SECONDS``;
- :func:`record_pid` with ``action=``: py-spy runs while ``action()`` does, then is
  stopped with SIGINT (py-spy writes its output on Ctrl-C);
- :func:`record_command`: ``py-spy record -- python script.py`` until the command exits.

Output: ``py-spy record --format raw`` is FlameGraph's folded format, root→leaf, one
line per distinct stack; with ``--nolineno`` (the default here) a frame is
``function (file.py)``, so the lines of one function are one frame. ``--native`` adds C
frames (``PyObject_Call (libpython3.11.so)``...), ``--idle`` keeps idle samples,
``--subprocesses`` adds a ``process PID:"command"`` root frame per process.

:func:`fold_run` reads the raw file into the ``stacks`` and ``functions`` tables
(``function`` = the name before `` (file)``, ``module`` = the file), writes parquet
beside the raw file, and a flamegraph is :func:`profkit.render.flamegraph.render` of
the counts.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from profkit.rundir import RunDir, load_run
from profkit.collect.perf import pid_alive
from profkit.errors import CommandFailed, ProbeError, ToolNotFound
from profkit.parse.folded import functions_table, read_folded, stacks_table
from profkit.processes import Background, format_argv, install_hint, which
from profkit.processes import run as run_argv

T = TypeVar("T")

RAW = "pyspy.folded"
FOLDED = "stacks.folded"
NO_FRAME = "[no Python frame]"
LOG = "py-spy.log"
STACKS_PARQUET = "stacks.parquet"
FUNCTIONS_PARQUET = "functions.parquet"
TOOL = "py-spy"

_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


class PySpyError(ProbeError):
    """py-spy could not profile the process; the message says why and what to do."""


def pyspy_path(py_spy: str = "py-spy") -> str:
    """py-spy from PATH or from this interpreter's bin directory (a venv not activated)."""
    try:
        return which(py_spy, extra_paths=[Path(sys.executable).parent])
    except ToolNotFound:
        raise ToolNotFound(f"py-spy not found ({py_spy!r}); {install_hint('py-spy')}") from None


def _options(rate: int, native: bool, idle: bool, subprocesses: bool, lineno: bool,
             gil: bool, threads: bool) -> list[str]:
    if rate <= 0:
        raise PySpyError(f"rate must be a positive number of samples per second, not {rate}")
    opts = ["--rate", str(rate)]
    if native:
        opts.append("--native")
    if idle:
        opts.append("--idle")
    if subprocesses:
        opts.append("--subprocesses")
    if not lineno:
        opts.append("--nolineno")
    if gil:
        opts.append("--gil")
    if threads:
        opts.append("--threads")
    return opts


def _explain(text: str, pid: int | None) -> str:
    """py-spy's error text → advice (its own message comes with a Rust backtrace)."""
    first = next((ln.strip() for ln in text.splitlines() if ln.startswith("Error:")), "")
    if "Failed to find python version" in text:
        return (f"process {pid} does not look like a Python interpreter ({first}); py-spy "
                "profiles Python processes only (use perf for C programs such as postgres)")
    if "Permission denied" in text or "Operation not permitted" in text:
        return (f"py-spy may not read process {pid} ({first}): run as root or as the "
                "process's user, and allow ptrace (kernel.yama.ptrace_scope, the container's "
                "SYS_PTRACE capability)")
    if "No such file or directory" in text or "No such process" in text:
        return f"process {pid} exited before or while py-spy sampled it ({first})"
    return first or text.strip()[-500:]


@dataclass(frozen=True)
class PySpyRecording:
    run_id: str
    run_dir: str
    pid: int | None
    raw: str
    argv: tuple[str, ...]
    samples: int | None
    seconds: float


_SAMPLES = re.compile(r"Samples: (\d+)")


def _finish(run: RunDir, argv: Sequence[str], pid: int | None, t0: float) -> PySpyRecording:
    raw = run.file(RAW)
    log_text = run.file(LOG).read_text(errors="replace") if run.file(LOG).exists() else ""
    m = _SAMPLES.search(log_text)
    samples = int(m.group(1)) if m else None
    if not raw.exists():
        run.finish(status="failed", error=_explain(log_text, pid))
        raise PySpyError(f"py-spy wrote no profile: {_explain(log_text, pid)} (log kept in "
                         f"{run.file(LOG)})")
    run.add_artifact(RAW, "py-spy record --format raw (folded stacks)")
    seconds = time.monotonic() - t0
    run.update(samples=samples, recording_seconds=round(seconds, 3))
    return PySpyRecording(run.run_id, str(run.path), pid, str(raw), tuple(argv), samples,
                          seconds)


def check_pid(pid: int) -> None:
    """Refuse a pid that names no running process (before a run is opened for it)."""
    if not pid_alive(pid):
        raise PySpyError(f"process {pid} does not exist: pass the pid of a running Python "
                         "process")


def _start_run(run: RunDir, facts: dict[str, Any]) -> RunDir:
    run.update(**facts)
    run.add_artifact(LOG, "py-spy's messages")
    return run


def record_pid(pid: int, *, duration: float | None = None, action: Callable[[], T] | None = None,
               rate: int = 100, native: bool = False, idle: bool = False,
               subprocesses: bool = False, lineno: bool = False, gil: bool = False,
               threads: bool = False, run: RunDir, py_spy: str = "py-spy",
               attach_timeout: float = 20.0) -> tuple[PySpyRecording, T | None]:
    """Sample Python process *pid* for *duration* seconds, or while ``action()`` runs.

    *run*: the run it writes into, opened by the caller with
    :func:`profkit.rundir.open_run` (:func:`profkit.experiments.profile.pyspy_run`).
    """
    exe = pyspy_path(py_spy)
    if (duration is None) == (action is None):
        raise PySpyError("give exactly one of duration= (seconds) or action= (a callable)")
    if duration is not None and duration <= 0:
        raise PySpyError(f"duration must be > 0 seconds, not {duration}")
    check_pid(pid)
    opts = _options(rate, native, idle, subprocesses, lineno, gil, threads)
    run = _start_run(run, {"pid": pid, "rate": rate, "native": native})
    argv = [exe, "record", "--format", "raw", "-o", str(run.file(RAW)), "--pid", str(pid),
            *opts, "--nonblocking"]
    t0 = time.monotonic()
    result: T | None = None
    if duration is not None:
        argv += ["--duration", str(max(1, round(duration)))]
        run.update(tool_command=format_argv(argv), tool_summary=f"py-spy record --rate {rate}")
        try:
            run_argv(argv, timeout=duration + 120, stdout_path=run.file(LOG), merge_stderr=True,
                     what="py-spy")
        except CommandFailed:
            text = run.file(LOG).read_text(errors="replace")
            run.finish(status="failed", error=_explain(text, pid))
            raise PySpyError(f"py-spy failed: {_explain(text, pid)} (log: {run.file(LOG)})"
                             ) from None
        return _finish(run, argv, pid, t0), None
    run.update(tool_command=format_argv(argv), tool_summary=f"py-spy record --rate {rate}")
    bg = Background(argv, stdout_path=run.file(LOG), stderr_path=run.file(LOG),
                    stop_signal=signal.SIGINT, stop_timeout=30, what="py-spy")
    bg.start()
    failure: BaseException | None = None
    try:
        _wait_sampling(bg, run.file(LOG), pid, attach_timeout)
        assert action is not None
        result = action()
    except PySpyError:
        bg.stop()
        raise
    except BaseException as e:  # noqa: BLE001 - stop py-spy, keep what it sampled
        failure = e
    finally:
        bg.stop()
    rec = _finish(run, argv, pid, t0)
    if failure is not None:
        run.finish(status="failed", error=str(failure))
        if isinstance(failure, KeyboardInterrupt):
            raise failure
        raise PySpyError(f"the profiled action failed: {failure}; py-spy was stopped and its "
                         f"samples are kept in {rec.raw}") from failure
    return rec, result


def _wait_sampling(bg: Background, log: Path, pid: int, timeout: float) -> None:
    """py-spy prints "Sampling process N times a second" once it is attached."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if "Sampling process" in text:
            return
        if not bg.alive():
            raise PySpyError(f"py-spy could not attach: {_explain(text, pid)} (log: {log})")
        time.sleep(0.02)
    raise PySpyError(f"py-spy did not start sampling process {pid} within {timeout:.0f} s "
                     f"(log: {log})")


def record_command(argv: Sequence[str | os.PathLike[str]], *, rate: int = 100,
                   native: bool = False, idle: bool = False, subprocesses: bool = False,
                   lineno: bool = False, gil: bool = False, threads: bool = False,
                   run: RunDir, py_spy: str = "py-spy", timeout: float = 3600,
                   cwd: str | os.PathLike[str] | None = None) -> PySpyRecording:
    """``py-spy record -- ARGV``: sample a Python command from start to exit.

    *run*: the run it writes into, opened by the caller with
    :func:`profkit.rundir.open_run` (:func:`profkit.experiments.profile.pyspy_run`).
    """
    exe = pyspy_path(py_spy)
    if not argv:
        raise PySpyError("no command to profile")
    opts = _options(rate, native, idle, subprocesses, lineno, gil, threads)
    run = _start_run(run, {"command": [str(a) for a in argv], "rate": rate, "native": native})
    full = [exe, "record", "--format", "raw", "-o", str(run.file(RAW)), *opts, "--",
            *(str(a) for a in argv)]
    run.update(tool_command=format_argv(full), tool_summary=f"py-spy record --rate {rate}")
    t0 = time.monotonic()
    try:
        run_argv(full, timeout=timeout, stdout_path=run.file(LOG), merge_stderr=True, cwd=cwd,
                 what="py-spy")
    except CommandFailed as e:
        text = run.file(LOG).read_text(errors="replace")
        if not run.file(RAW).exists():
            run.finish(status="failed", error=_explain(text, None))
            raise PySpyError(f"py-spy failed: {_explain(text, None)} (log: {run.file(LOG)})"
                             ) from None
        # py-spy passes on the command's exit status; the samples are still good
        run.update(command_returncode=e.returncode)
    return _finish(run, full, None, t0)


# --------------------------------------------------------------------------- folding

@dataclass(frozen=True)
class PySpyProfile:
    run: RunDir
    counts: dict[str, float]
    stacks: pd.DataFrame
    functions: pd.DataFrame

    def top(self, n: int = 10) -> pd.DataFrame:
        cols = ["function", "module", "self", "self_share", "total", "total_share"]
        return self.functions[cols].head(n).reset_index(drop=True)

    def share(self, function: str, basis: str = "total") -> float:
        """Share of samples with *function* on the stack (``total``) or as leaf (``self``)."""
        rows = self.functions.loc[self.functions["function"] == function,
                                  f"{basis}_share"]
        return float(rows.sum()) if len(rows) else 0.0


def split_frame(frame: str) -> tuple[str, str]:
    """``"inner_hot (busy.py)"`` → ``("inner_hot", "busy.py")``; other frames as they are."""
    m = _FRAME.match(frame)
    if m is None:
        return frame, ""
    return m["name"], m["file"]


def _normalised(raw: Path, dest: Path) -> Path:
    """Copy py-spy's raw file to *dest*, naming empty stacks.

    py-spy writes a sample taken while the thread had no Python frame (interpreter
    start-up or shutdown) as an empty stack, `` 1``; FlameGraph counts such lines at the
    root only, profkit's folded reader wants a frame, so they become ``[no Python frame]``.
    """
    with open(raw, encoding="utf-8", errors="replace") as src, \
            open(dest, "w", encoding="utf-8") as dst:
        for line in src:
            if line[:1] == " " and line.strip():
                line = NO_FRAME + line
            dst.write(line)
    return dest


def fold_run(run: RunDir | str | os.PathLike[str]) -> PySpyProfile:
    """py-spy's raw file → stacks/functions tables (+ parquet in the run directory)."""
    rd = run if isinstance(run, RunDir) else load_run(run)
    raw = rd.file(RAW)
    if not raw.exists():
        raise PySpyError(f"no {RAW} in {rd.path}: record first")
    counts = read_folded(_normalised(raw, rd.file(FOLDED)), strict=True)
    label = str(rd.provenance.get("build_name") or "")
    stacks = stacks_table(counts, run_id=rd.run_id, build=label, tool=TOOL)
    funcs = functions_table(counts, root_is_process=False, run_id=rd.run_id, build=label,
                            tool=TOOL)
    # a frame is "function (file)": keep the full frame for the flamegraph, split it here
    split = [split_frame(f) for f in funcs["function"].astype(str)]
    funcs["frame"] = funcs["function"]
    funcs["function"] = pd.array([s[0] for s in split], dtype="string")
    funcs["module"] = pd.array([s[1] for s in split], dtype="string")
    stacks.to_parquet(rd.file(STACKS_PARQUET), index=False)
    funcs.to_parquet(rd.file(FUNCTIONS_PARQUET), index=False)
    rd.add_artifact(FOLDED, "folded stacks (py-spy's, empty stacks named)")
    rd.add_artifact(STACKS_PARQUET, "stacks table")
    rd.add_artifact(FUNCTIONS_PARQUET, "functions table (function, module = file)")
    rd.finish(status="complete", samples_folded=float(sum(counts.values())))
    return PySpyProfile(rd, counts, stacks, funcs)
