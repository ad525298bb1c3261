"""The facts a run's provenance records about this machine and its tools.

What makes two runs comparable (pyperf's run metadata is the model): the machine (CPU
model, kernel, clock source, virtualization, CPU governor), tool versions and the
server's non-default settings. The run directory itself (create, provenance.json,
load) is :mod:`profkit.rundir`.
"""
from __future__ import annotations

import functools
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profkit.errors import ProfkitError
from profkit.run import run

if TYPE_CHECKING:
    import psycopg


PROVENANCE_FILE = "provenance.json"

def _read(path: str | os.PathLike[str]) -> str:
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return ""


# --------------------------------------------------------------------------- machine

def virtualization() -> str:
    """What the machine runs in: systemd-detect-virt, else /sys/hypervisor, else the
    CPU's ``hypervisor`` flag ("none" on bare metal, "" when nothing can tell)."""
    exe = shutil.which("systemd-detect-virt")
    if exe:
        try:
            # exit status 1 with "none" on bare metal: not an error here
            cp = run([exe], timeout=10, check=False, what="systemd-detect-virt")
            out = cp.stdout.strip()
            if out:
                return out
        except ProfkitError:
            pass
    hv = _read("/sys/hypervisor/type")
    if hv:
        return hv
    from profkit.collect.clock import parse_cpuinfo

    _model, flags = parse_cpuinfo(_read("/proc/cpuinfo"))
    if flags:
        return "vm (cpuinfo hypervisor flag)" if "hypervisor" in flags else "none"
    return ""


@functools.cache
def machine_info() -> dict[str, Any]:
    """Facts about this machine (cached per process: they do not change during a run)."""
    from profkit.collect.clock import clock_info

    ci = clock_info()
    governor = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    return {
        "hostname": platform.node(),
        "arch": platform.machine(),
        "cpu_model": ci.cpu_model,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "kernel_version": platform.version(),
        "os": _os_release(),
        "clocksource": ci.current_clocksource,
        "invariant_tsc": ci.invariant_tsc,
        "virtualization": virtualization(),
        "governor": governor or None,
        "python": sys.version.split()[0],
    }


def _os_release() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return platform.platform()


@functools.cache
def tool_version(tool: str, args: tuple[str, ...] = ("--version",)) -> str:
    """First line of ``TOOL --version`` ("" when the tool is missing or says nothing)."""
    exe = tool if os.sep in tool else shutil.which(tool)
    if not exe:
        # tools installed into a venv that is not activated (py-spy)
        cand = Path(sys.executable).parent / tool
        exe = str(cand) if os.access(cand, os.X_OK) else None
    if not exe:
        return ""
    try:
        cp = run([exe, *args], timeout=30, check=False, what=Path(tool).name)
    except ProfkitError:
        return ""
    text = (cp.stdout or cp.stderr or "").strip()
    return text.splitlines()[0].strip() if text else ""


def server_settings(conn: psycopg.Connection) -> dict[str, str]:
    """The server's settings that are not at their built-in default (plus version)."""
    rows = conn.execute(
        "SELECT name, setting FROM pg_settings WHERE source NOT IN ('default', 'override') "
        "ORDER BY name").fetchall()
    out = {str(n): str(s) for n, s in rows}
    out["server_version"] = str(conn.execute("SHOW server_version").fetchone()[0])
    return out


