"""Run directories: ``profiles/<run_id>/`` with the raw artifacts and ``provenance.json``.

Every collector (perf, gprof, py-spy) writes what it recorded into one run directory
and describes the run in ``provenance.json`` — what makes two runs comparable
(pyperf's run metadata is the model): the build (:meth:`Build.provenance`: source,
patches and their hashes, configure flags, CFLAGS, compiler), the machine (CPU model,
kernel, clock source, virtualization, CPU governor), tool versions, the profiled pid,
start and end time, workload, query, scale, mode and the server's non-default settings.
Nothing is filled in from the current machine when a run is loaded back
(:func:`load_run` reads exactly what was written).

The provenance file is written when the run starts and rewritten as the collector adds
facts, so a run that fails half-way still says what it is and which files it holds.
"""
from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import platform
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profkit import paths
from profkit.errors import ProfkitError
from profkit.run import run

if TYPE_CHECKING:
    import psycopg

    from profkit.pg.build import Build

PROVENANCE_FILE = "provenance.json"

# Fields a comparison of two runs must find equal (pyperf's _CHECKED_METADATA idea).
CHECKED_FIELDS: tuple[str, ...] = (
    "machine.cpu_model", "machine.kernel", "machine.clocksource", "machine.virtualization",
    "build.source.version", "workload", "scale",
)


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).astimezone().isoformat(timespec="milliseconds")


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


# --------------------------------------------------------------------------- run dirs

_SAFE = re.compile(r"[^A-Za-z0-9_.+-]+")


def make_run_id(*parts: str | None) -> str:
    """``<part>-<part>-...-<YYYYmmdd-HHMMSS-ffffff>``: sortable and unique per process."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    words = [_SAFE.sub("_", p).strip("_") for p in parts if p]
    return "-".join([*(w for w in words if w), stamp])


@dataclass
class RunDir:
    """One run's directory and its provenance (kept on disk as it grows)."""

    run_id: str
    path: Path
    provenance: dict[str, Any] = field(default_factory=dict)

    def file(self, name: str) -> Path:
        """Path of an artifact of this run (not created)."""
        return self.path / name

    def update(self, **facts: Any) -> None:
        """Add facts and rewrite provenance.json at once (a crash keeps what is known)."""
        self.provenance.update(facts)
        self.save()

    def add_artifact(self, name: str, what: str) -> Path:
        """Name a file of this run in provenance["artifacts"] (file name → description)."""
        self.provenance.setdefault("artifacts", {})[name] = what
        self.save()
        return self.file(name)

    def finish(self, **facts: Any) -> None:
        self.update(ended_at=_now(), **facts)

    def save(self) -> None:
        tmp = self.path / (PROVENANCE_FILE + ".tmp")
        tmp.write_text(json.dumps(self.provenance, indent=1, sort_keys=True, default=str) + "\n")
        os.replace(tmp, self.path / PROVENANCE_FILE)

    def get(self, dotted: str) -> Any:
        """A provenance field by dotted path (``machine.kernel``), None when absent."""
        cur: Any = self.provenance
        for part in dotted.split("."):
            if not isinstance(cur, Mapping) or part not in cur:
                return None
            cur = cur[part]
        return cur

    def subtitle_facts(self) -> dict[str, str]:
        """The provenance a flamegraph subtitle shows (short values only)."""
        p = self.provenance
        b = p.get("build") or {}
        src = b.get("source") or {}
        out = {
            "build": b.get("build") or p.get("build_name"),
            "PostgreSQL": src.get("version") or (b.get("pg_config") or {}).get("VERSION"),
            "patches": ", ".join(x.get("name", "?") for x in b.get("patches") or []) or None,
            "workload": p.get("workload"), "scale": p.get("scale"),
            "query": p.get("query_name") or p.get("mode"),
            "tool": p.get("tool_summary") or p.get("tool"),
            "kernel": self.get("machine.kernel"),
            "clocksource": self.get("machine.clocksource"),
            "virt": self.get("machine.virtualization"),
            "run": self.run_id, "date": (p.get("started_at") or "")[:19],
        }
        return {k: str(v) for k, v in out.items() if v not in (None, "")}

    def __repr__(self) -> str:
        return f"<RunDir {self.run_id} at {self.path}>"


def new_run(tool: str, *, build: Build | None = None, workload: str | None = None,
            mode: str | None = None, run_id: str | None = None,
            base: str | os.PathLike[str] | None = None,
            tools: Sequence[str] = (), **facts: Any) -> RunDir:
    """Create ``<base or profiles/>/<run_id>/`` and write its first provenance.json.

    *tools*: programs whose ``--version`` is recorded (the collector's own tool is
    always included). *facts*: anything else (scale, query, backend_pid, settings...).
    """
    run_id = run_id or make_run_id(tool, build.name if build is not None else None,
                                   workload, mode)
    if _SAFE.search(run_id) or run_id in (".", ".."):
        raise ProfkitError(f"run id {run_id!r} may only contain letters, digits and _.+-")
    root = Path(base) if base is not None else paths.profiles_dir()
    path = root / run_id
    try:
        path.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        raise ProfkitError(f"run directory {path} already exists; pick another run id "
                           "(runs are never overwritten)") from None
    versions = {t: tool_version(t) for t in dict.fromkeys([tool, *tools])}
    prov: dict[str, Any] = {
        "run_id": run_id, "tool": tool, "started_at": _now(),
        "build": build.provenance() if build is not None else None,
        "build_name": build.name if build is not None else None,
        "workload": workload, "mode": mode,
        "machine": machine_info(), "tools": versions,
        "profkit": _profkit_version(), "argv": sys.argv,
        "artifacts": {},
    }
    prov.update(facts)
    rd = RunDir(run_id, path, prov)
    rd.save()
    return rd


def _profkit_version() -> str:
    try:
        from importlib.metadata import version

        return version("profkit")
    except Exception:  # noqa: BLE001 - not installed (running from a checkout)
        return "unknown"


def load_run(path_or_id: str | os.PathLike[str]) -> RunDir:
    """A run directory written earlier (a path, or a run id under profiles/)."""
    p = Path(path_or_id)
    if not p.is_dir():
        p = paths.profiles_dir() / str(path_or_id)
    f = p / PROVENANCE_FILE
    try:
        prov = json.loads(f.read_text())
    except FileNotFoundError:
        raise ProfkitError(f"no run at {p}: {PROVENANCE_FILE} is missing (pass a directory "
                           "written by a profkit collector, or a run id under profiles/)"
                           ) from None
    except ValueError as e:
        raise ProfkitError(f"{f} is not valid JSON ({e}); the run is damaged") from None
    return RunDir(str(prov.get("run_id") or p.name), p, prov)


def compare_provenance(a: RunDir, b: RunDir, fields: Sequence[str] = CHECKED_FIELDS
                       ) -> dict[str, tuple[Any, Any]]:
    """The checked fields whose values differ between two runs (empty: comparable)."""
    return {f: (a.get(f), b.get(f)) for f in fields if a.get(f) != b.get(f)}
