"""How fast the vCPU runs, and what disturbed a backend, around one execution (Linux).

On this VM a backend's CPU time for the same query and the same instruction count is
bimodal (305–370 ms in most repetitions, 550–625 ms in some): the host slows the vCPU
in bursts, and CPU time cannot see that. Two measurements per repetition say when:

- :class:`VcpuProbe`: a small C program (``vcpu_calib.c``) that stays running, pinned
  to the CPU the backend is pinned to, and on request runs a fixed instruction stream
  (~3 ms) and reports its thread CPU time: the vCPU's speed at that moment. The bench
  asks just before and just after each execution.
- :func:`proc_counters`: the backend's context switches (voluntary / involuntary, from
  ``/proc/PID/status``), migrations (``se.nr_migrations`` in ``/proc/PID/sched``), page
  faults (minor / major, ``/proc/PID/stat``), the CPU it last ran on, and the host steal
  time of every CPU (``/proc/stat``, USER_HZ ticks), read before and after: the deltas
  go into the timings table (:func:`counter_deltas`).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from profkit.collect import ctools
from profkit.errors import ProfkitError

HELPER_SRC = Path(__file__).with_name("vcpu_calib.c")

#: Units of work per calibration: 100 × 4096 dependent steps ≈ 3 ms on this VM's vCPU.
DEFAULT_LOOPS = 100
_TICK_MS = 1000.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


class VcpuError(ProfkitError):
    """The calibration helper could not start or answer."""


def helper_path() -> Path:
    return ctools.helper_path(HELPER_SRC)


def build_helper() -> Path:
    """Compile vcpu_calib.c once per source hash; return the binary's path."""
    return ctools.build_helper(HELPER_SRC, "the vCPU calibration")


@dataclass(frozen=True)
class Calibration:
    """One run of the calibration work: its thread CPU time, wall time, and CPU."""

    cpu_ms: float
    wall_ms: float
    cpu: int


class VcpuProbe:
    """The calibration helper, running for the length of a ``with`` block, pinned to *cpu*.

    Stopped by pid (stdin closed, then SIGKILL if it lingers) when the block ends, also
    on errors.
    """

    def __init__(self, cpu: int | None, loops: int = DEFAULT_LOOPS) -> None:
        self.cpu = cpu
        self.loops = int(loops)
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> VcpuProbe:
        helper = build_helper()
        self.proc = subprocess.Popen([str(helper)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        try:
            if self.cpu is not None:
                os.sched_setaffinity(self.proc.pid, {self.cpu})
            self.calibrate()  # the first answer pages the table in
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        with contextlib.suppress(OSError, ValueError):
            assert p.stdin is not None
            p.stdin.close()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
        with contextlib.suppress(OSError, ValueError):
            assert p.stdout is not None
            p.stdout.close()

    def calibrate(self) -> Calibration:
        """Run the fixed work once; its CPU time is the vCPU's speed now (lower: faster)."""
        p = self.proc
        if p is None or p.stdin is None or p.stdout is None:
            raise VcpuError("the vCPU calibration helper is not running (use it in a with block)")
        try:
            p.stdin.write(f"{self.loops}\n")
            p.stdin.flush()
            line = p.stdout.readline()
        except (OSError, ValueError) as e:
            raise VcpuError(f"the vCPU calibration helper (pid {p.pid}) stopped: {e}") from None
        parts = line.split()
        if len(parts) != 3:
            raise VcpuError(f"the vCPU calibration helper (pid {p.pid}) answered {line!r}")
        return Calibration(int(parts[0]) / 1e6, int(parts[1]) / 1e6, int(parts[2]))


def pin(pid: int, cpu: int) -> None:
    """Pin process *pid* (a backend) to *cpu*."""
    os.sched_setaffinity(pid, {cpu})


def calibration_facts(calibrate: bool) -> dict[str, object] | None:
    """The provenance's ``vcpu_calibration`` of a run that calibrates (None if not)."""
    if not calibrate:
        return None
    return {"loops": DEFAULT_LOOPS, "helper": "profkit/collect/vcpu_calib.c",
            "where": "just before and after every execution, on the pinned CPU"}


def default_pin_cpu() -> int | None:
    """The last CPU this process may use (None with a single one: nothing to choose)."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[-1] if len(cpus) > 1 else None


def resolve_pin(pin_cpu: int | str | None,
                error: type[ProfkitError] = VcpuError) -> int | None:
    """The CPU to pin measured backends to: ``"auto"`` → :func:`default_pin_cpu`, None or
    ``"none"`` → None (not pinned), a CPU number this process may use → itself; anything
    else raises *error*."""
    if pin_cpu is None or pin_cpu == "none":
        return None
    if pin_cpu == "auto":
        return default_pin_cpu()
    allowed = sorted(os.sched_getaffinity(0))
    if isinstance(pin_cpu, bool) or not isinstance(pin_cpu, int) or pin_cpu not in allowed:
        raise error(f"pin_cpu {pin_cpu!r} is not a CPU this process may use "
                    f"({', '.join(map(str, allowed))}); or 'auto', or None")
    return pin_cpu


def proc_counters(pid: int) -> dict[str, float]:
    """The backend's scheduler and fault counters, and the machine's steal time, now.

    Input: ``/proc/PID/stat`` (fields 10 minflt, 12 majflt, 39 processor),
    ``/proc/PID/status`` (``voluntary_ctxt_switches: 12``), ``/proc/PID/sched``
    (``se.nr_migrations : 3``), ``/proc/stat`` (``cpu1 ... steal`` 8th value, ticks).
    Output: ``{"minflt": 1520, "majflt": 0, "vol_cs": 12, "invol_cs": 3,
    "migrations": 3, "last_cpu": 1, "steal_ms": 11350.0, "steal_ms_cpu1": 5680.0}``
    (a field the kernel does not provide is left out).
    """
    out: dict[str, float] = {}
    with contextlib.suppress(OSError, IndexError, ValueError):
        text = Path(f"/proc/{pid}/stat").read_text()
        # the command name may hold spaces: fields count from after its ')'
        f = text[text.rindex(")") + 2:].split()
        out["minflt"] = float(f[7])
        out["majflt"] = float(f[9])
        out["last_cpu"] = float(f[36])
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                out["vol_cs"] = float(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                out["invol_cs"] = float(line.split()[1])
    with contextlib.suppress(OSError, IndexError, ValueError):
        for line in Path(f"/proc/{pid}/sched").read_text().splitlines():
            if line.startswith("se.nr_migrations"):
                out["migrations"] = float(line.split(":")[1])
                break
    out.update(steal_ms())
    return out


def steal_ms() -> dict[str, float]:
    """Host steal time so far, in ms: ``steal_ms`` (all CPUs) and ``steal_ms_cpuN``."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError, IndexError, ValueError):
        for line in Path("/proc/stat").read_text().splitlines():
            if not line.startswith("cpu"):
                break
            f = line.split()
            v = float(f[8]) * _TICK_MS if len(f) > 8 else 0.0
            out["steal_ms" if f[0] == "cpu" else f"steal_ms_{f[0]}"] = v
    return out


#: The per-execution columns :func:`counter_deltas` fills (extra columns of ``timings``).
DELTA_COLUMNS: tuple[str, ...] = ("vol_cs", "invol_cs", "migrations", "minflt", "majflt",
                                  "steal_ms", "steal_cpu_ms", "last_cpu")


def counter_deltas(before: dict[str, float], after: dict[str, float],
                   cpu: int | None) -> dict[str, float]:
    """After minus before of :func:`proc_counters`; ``steal_cpu_ms`` is the steal of *cpu*
    (the pinned one; all CPUs when None), ``last_cpu`` the CPU the backend ran on last."""
    nan = float("nan")
    out = {k: (after[k] - before[k]) if k in after and k in before else nan
           for k in ("vol_cs", "invol_cs", "migrations", "minflt", "majflt", "steal_ms")}
    key = f"steal_ms_cpu{cpu}" if cpu is not None else "steal_ms"
    out["steal_cpu_ms"] = (after[key] - before[key]) if key in after and key in before else nan
    out["last_cpu"] = after.get("last_cpu", nan)
    return out
