"""Facts about this machine and its tools, as every run's provenance records them.

What makes two runs comparable (pyperf's run metadata is the model): the machine (CPU
model, kernel, clock source, virtualization, CPU governor) and tool versions. A base
module: :mod:`profkit.rundir` reads it when it creates a run, and nothing here calls up
into the collectors. (The server's non-default settings need a connection:
:func:`profkit.collect.artifacts.server_settings`.)
"""
from __future__ import annotations

import functools
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

from profkit.errors import ProfkitError
from profkit.processes import run

CLOCKSOURCE_DIR = Path("/sys/devices/system/clocksource/clocksource0")


def _read(path: str | os.PathLike[str]) -> str:
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return ""


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first CPU in ``/proc/cpuinfo`` text.

    Input:  ``model name\\t: AMD EPYC 7B13`` / ``flags\\t\\t: fpu tsc constant_tsc ...``
    Output: ``("AMD EPYC 7B13", frozenset({"fpu", "tsc", "constant_tsc", ...}))``
    """
    model = ""
    flags: frozenset[str] = frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return model, flags


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
    _model, flags = parse_cpuinfo(_read("/proc/cpuinfo"))
    if flags:
        return "vm (cpuinfo hypervisor flag)" if "hypervisor" in flags else "none"
    return ""


def _os_release() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return platform.platform()


@functools.cache
def machine_info() -> dict[str, Any]:
    """Facts about this machine (cached per process: they do not change during a run)."""
    model, flags = parse_cpuinfo(_read("/proc/cpuinfo"))
    governor = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    return {
        "hostname": platform.node(),
        "arch": platform.machine(),
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "kernel_version": platform.version(),
        "os": _os_release(),
        "clocksource": _read(CLOCKSOURCE_DIR / "current_clocksource") or "unknown",
        "invariant_tsc": "constant_tsc" in flags and "nonstop_tsc" in flags,
        "virtualization": virtualization(),
        "governor": governor or None,
        "python": sys.version.split()[0],
    }


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


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (NaN where the system cannot tell)."""
    try:
        return list(os.getloadavg())
    except OSError:
        return [float("nan")] * 3


def uptime() -> str:
    """``uptime``'s line (the load averages with how long the machine has been up), or
    the load averages alone where the program is missing."""
    exe = shutil.which("uptime")
    fallback = "load average: " + " ".join(f"{x:.2f}" for x in loadavg())
    if exe is None:
        return fallback
    try:
        return run([exe], timeout=10, check=False).stdout.strip()
    except ProfkitError:
        return fallback
