"""/proc checks the tests share: is a process gone, did a tracer stay behind."""
from __future__ import annotations

import os
from pathlib import Path


def start_ticks(pid: int) -> int | None:
    """When *pid* started (clock ticks since boot, /proc/PID/stat), or None once it is
    gone: with a pid, it names one process (pids are reused: this machine's pid_max is
    32,768, and a cold make test starts about 263,000 processes)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int, start: int | None = None) -> bool:
    """True while *pid* exists and is not a zombie (a zombie is dead for our purposes);
    with *start* (:func:`start_ticks` taken while it ran), only while it is that process,
    not another that got its pid since."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and (start is None or int(fields[19]) == start)


def proc_text(pid: int, name: str) -> str:
    """/proc/PID/NAME (cmdline, comm ...), or "" once the process is gone (a child seen
    in a listing may exit before its files are read)."""
    try:
        return Path(f"/proc/{pid}/{name}").read_text(errors="replace")
    except OSError:
        return ""


def children_named(*names: str) -> list[int]:
    """Live child processes of this test process whose command is one of *names*."""
    me = str(os.getpid())
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        if comm in names and fields[1] == me and fields[0] != "Z":
            out.append(int(d.name))
    return out


def perf_bpf_fds() -> int:
    """perf-event and BPF file descriptors this process holds (attached probes)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        n += "perf_event" in target or "bpf" in target
    return n


def remove_chromium_singleton(profile: Path) -> None:
    """Remove the folder of Chromium's SingletonSocket, which a stopped headless Chromium
    leaves in its TMPDIR (``org.chromium.Chromium.XXXXXX``; 172 had piled up in /tmp from
    the tests' runs).  The profile's ``SingletonSocket`` link names it."""
    import shutil

    try:
        target = Path(os.readlink(profile / "SingletonSocket"))
    except OSError:
        return
    if target.parent.name.startswith("org.chromium.Chromium."):
        shutil.rmtree(target.parent, ignore_errors=True)
