"""A foreground command profkit runs (a build's make -j2) dies with profkit: on SIGTERM and
on Ctrl-C the whole process group goes, not only its leader."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from proc_helpers import alive, start_ticks

SCRIPT = """
import sys
from profkit.processes import run
# a leader with a grandchild in its group, like make -j2 with its compilers
run(["sh", "-c", "sleep 300 & echo $! > {pidfile}; wait"], timeout=600)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_foreground_group_dies_with_profkit(tmp_path, sig):
    pidfile = tmp_path / "pid"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(pidfile=pidfile)],
                            # SIGINT reaches Python as KeyboardInterrupt only when not ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    start = start_ticks(grandchild)
    assert alive(grandchild, start)
    proc.send_signal(sig)
    proc.wait(30)
    deadline = time.monotonic() + 10
    while alive(grandchild, start) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild, start), f"sleep {grandchild} outlived profkit after {sig.name}"


def test_a_child_that_ignores_the_stop_signal_is_stopped_at_once():
    """A child of a background job or a CI runner inherits an ignored SIGINT; Background's
    stop sends SIGINT first (perf finalises its file on it) and used to wait the whole
    timeout for it before SIGTERM. An ignored signal is now skipped (SigIgn in
    /proc/PID/status)."""
    from profkit.processes import Background

    prev = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what the child inherits
    try:
        bg = Background(["sleep", "600"]).start()
    finally:
        signal.signal(signal.SIGINT, prev)
    start = start_ticks(bg.pid)
    assert alive(bg.pid, start)
    t0 = time.monotonic()
    bg.stop(timeout=20)
    assert time.monotonic() - t0 < 5
    assert not alive(bg.pid, start)
