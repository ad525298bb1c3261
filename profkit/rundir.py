"""Run directories: ``profiles/<run_id>/``, the one place runs are created and read back.

Every experiment and collector (bench, timing accuracy, observers, correction, perf,
gprof, py-spy, probes, a notebook's own collection) writes its run here:

- one run-id format, :func:`new_run_id`: ``YYYYmmdd-HHMMSS-<kind>[-<word>...]`` (local
  time; sorts by start; ``-2``, ``-3``... when taken);
- :func:`open_run` is THE run lifecycle, a context manager: it names the folder (or takes
  ``--out``, refused when it holds anything: :func:`place`, the one such check), writes
  ``provenance.json`` with status ``running`` before any work, turns a full disk into
  :class:`RunDiskFull`, records Ctrl-C as ``interrupted`` and any other error as
  ``failed`` (with the error), else ``complete``, and points ``latest`` at a completed
  run it named. Every experiment, collector and notebook run goes through it (a
  collector takes the run from its caller; :func:`new_run` is its first half);
- :class:`RunDir` rewrites provenance.json atomically as facts arrive, so a run
  that dies half-way still says what it is and which files it holds;
- :class:`RowWriter` appends rows with one ``write`` + ``fsync`` each (a crash keeps
  every row reported written; a failed write is truncated back, the file stays parseable);
- :func:`load_run` is the one loader: a path, a run id under profiles/, or ``latest``.
  It reads provenance.json exactly as written (nothing filled in from this machine) and
  refuses a directory without one with a message saying what it is missing;
  :func:`list_runs` every run under a folder; :attr:`RunDir.status` reads the final
  status, the old word ``ok`` as ``complete``;
- :data:`CHECKED_FIELDS` and :func:`check_comparable`: the provenance two runs must share
  before their numbers are pooled or compared (pyperf's checked metadata);
- :func:`update_latest`: ``profiles/latest`` → the newest run (a relative symlink).

The machine facts recorded in provenance (CPU, kernel, clock source, tool versions)
come from the base module :mod:`profkit.machine`.
"""
from __future__ import annotations

import contextlib
import csv
import datetime as _dt
import errno
import io
import json
import math
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profkit import paths
from profkit.errors import ComparisonError, ProfkitError
from profkit.machine import loadavg, machine_info, tool_version

if TYPE_CHECKING:
    from profkit.pg.build import Build

PROVENANCE_FILE = "provenance.json"
LATEST = "latest"

#: A run's status words: ``running`` while it runs, then exactly one of the other three.
RUNNING, COMPLETE, FAILED, INTERRUPTED = "running", "complete", "failed", "interrupted"
STATUSES: tuple[str, ...] = (RUNNING, COMPLETE, FAILED, INTERRUPTED)
#: Words older runs wrote for a final status (read as the current word).
_OLD_STATUS = {"ok": COMPLETE}

#: Provenance fields two runs must share before they are compared (pyperf's
#: ``_CHECKED_METADATA``). A collector's run keeps its source under ``build.source``,
#: a multi-build experiment under ``source``: :func:`get_field` reads either.
CHECKED_FIELDS: tuple[str, ...] = (
    "machine.cpu_model", "machine.kernel", "machine.clocksource", "machine.virtualization",
    "machine.cpus", "workload", "scale", "source.version",
)
_ALIASES = {"source.version": ("source.version", "build.source.version")}

_SAFE = re.compile(r"[^A-Za-z0-9_.+-]+")


class RunDirError(ProfkitError):
    """A run directory cannot be created, read or pointed at."""


class RunDiskFull(RunDirError):
    """The profiles folder filled up: the run stopped; what it wrote before is kept.

    ``run_dir``: the run's folder; ``oserror``: the write that failed.
    """

    def __init__(self, message: str, *, run_dir: Path, oserror: OSError) -> None:
        super().__init__(message)
        self.run_dir = run_dir
        self.oserror = oserror


def normalize_status(status: Any) -> str | None:
    """A provenance status as the current word (``ok`` -> ``complete``); None if absent."""
    if status is None:
        return None
    return _OLD_STATUS.get(str(status), str(status))


def now() -> str:
    """Local time with offset, as every provenance timestamp is written."""
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


# --------------------------------------------------------------------------- ids

def new_run_id(kind: str, *words: str | None, root: str | os.PathLike[str] | None = None
               ) -> str:
    """``20261130-031500-bench-nested_loop``: start time, kind, words; unique in *root*."""
    parts = [_SAFE.sub("_", str(w)).strip("_") for w in (kind, *words) if w]
    base = "-".join([_dt.datetime.now().strftime("%Y%m%d-%H%M%S"), *(p for p in parts if p)])
    if root is None:
        return base
    rid, n = base, 1
    while (Path(root) / rid).exists():
        n += 1
        rid = f"{base}-{n}"
    return rid


def check_run_id(run_id: str) -> str:
    if not run_id or _SAFE.search(run_id) or run_id in (".", "..", LATEST):
        raise RunDirError(f"run id {run_id!r} may only contain letters, digits and _.+- "
                          f"(and is not {LATEST!r})")
    return run_id


# --------------------------------------------------------------------------- the directory

def get_field(prov: Mapping[str, Any], dotted: str) -> Any:
    """A provenance field by dotted path (``machine.kernel``); None when absent."""
    for path in _ALIASES.get(dotted, (dotted,)):
        cur: Any = prov
        for part in path.split("."):
            if not isinstance(cur, Mapping) or part not in cur:
                cur = None
                break
            cur = cur[part]
        if cur is not None:
            return cur
    return None


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
        """The end of a run opened with :func:`new_run`: ``ended_at`` and the final
        status (one of :data:`STATUSES`; the old ``ok`` is written as ``complete``)."""
        if "status" in facts:
            facts["status"] = normalize_status(facts["status"])
        self.update(ended_at=now(), **facts)

    def save(self) -> None:
        tmp = self.path / (PROVENANCE_FILE + ".tmp")
        tmp.write_text(json.dumps(self.provenance, indent=1, sort_keys=True, default=str) + "\n")
        os.replace(tmp, self.path / PROVENANCE_FILE)

    def get(self, dotted: str) -> Any:
        """A provenance field by dotted path (``machine.kernel``), None when absent."""
        return get_field(self.provenance, dotted)

    @property
    def kind(self) -> str:
        return str(self.provenance.get("kind") or self.provenance.get("tool") or "")

    @property
    def status(self) -> str | None:
        """running / complete / failed / interrupted (an old run's ``ok`` reads as
        complete; None for a run written before statuses were recorded)."""
        return normalize_status(self.provenance.get("status"))

    def rows(self, name: str, columns: Sequence[str] = ()) -> RowWriter:
        """An fsync'd row file of this run (must not exist yet; no columns: JSON lines)."""
        return RowWriter(self.file(name), columns)

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


def _profkit_version() -> str:
    try:
        from importlib.metadata import version

        return version("profkit")
    except Exception:  # noqa: BLE001 - not installed (running from a checkout)
        return "unknown"


def place(kind: str, *words: str | None, path: str | os.PathLike[str] | None = None,
          base: str | os.PathLike[str] | None = None, run_id: str | None = None
          ) -> tuple[str, Path]:
    """(run id, folder) of a new run, checked and not created: THE "never overwrite" rule.

    *path* (``--out``) may be a new or an empty directory, anything else is refused; else
    the folder is ``<base or profiles/>/<run_id>`` with *run_id* given or named by
    :func:`new_run_id` from *kind* and *words*. Callers that build or check things
    before the run starts call it first, so a bad ``--out`` fails before any work.
    """
    if path is not None:
        p = Path(path)
        rid = check_run_id(run_id or p.name)
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise RunDirError(f"{p} already exists and is not empty; runs are never "
                              "overwritten: choose another --out")
        return rid, p
    root = Path(base) if base is not None else paths.profiles_dir()
    rid = check_run_id(run_id or new_run_id(kind, *words, root=root))
    p = root / rid
    if p.exists():
        raise RunDirError(f"run directory {p} already exists; pick another run id "
                          "(runs are never overwritten)")
    return rid, p


def _full_message(where: Path, e: OSError) -> str:
    return (f"profiles folder is full: free space or choose --out (writing in {where} "
            f"failed: {e.strerror or e})")


def new_run(kind: str, *, build: Build | None = None, workload: str | None = None,
            mode: str | None = None, run_id: str | None = None,
            base: str | os.PathLike[str] | None = None, path: str | os.PathLike[str] | None = None,
            tools: Sequence[str] = (), **facts: Any) -> RunDir:
    """Create ``<base or profiles/>/<run_id>/`` (or exactly *path*) and write its first
    provenance.json: the first half of :func:`open_run` (which every run of profkit goes
    through: a run made here alone gets no final status unless :meth:`RunDir.finish`
    writes one).

    *kind* names the experiment or tool (``bench``, ``perf``...; recorded as ``kind`` and,
    for collectors, ``tool``). *path* may name an existing empty directory (``--out``);
    a directory holding anything is refused: runs are never overwritten (:func:`place`).
    *tools*: programs whose ``--version`` is recorded. *facts*: anything else. A full
    disk raises :class:`RunDiskFull`.
    """
    run_id, p = place(kind, build.name if build is not None else None, workload, mode,
                      path=path, base=base, run_id=run_id)
    prov: dict[str, Any] = {
        "run_id": run_id, "kind": kind, "tool": kind, "started_at": now(),
        # a single-build run (a collector's) names its build; multi-build experiments
        # record theirs under "builds"
        **({"build": build.provenance(), "build_name": build.name} if build is not None
           else {}),
        **{k: v for k, v in (("workload", workload), ("mode", mode)) if v is not None},
        "machine": machine_info(),
        "tools": {t: v for t in dict.fromkeys([kind, *tools])
                  if (v := tool_version(t)) or t != kind},
        "profkit": _profkit_version(), "argv": list(sys.argv),
        "artifacts": {},
    }
    prov.update(facts)
    rd = RunDir(run_id, p, prov)
    try:
        p.mkdir(parents=True, exist_ok=True)
        rd.save()
    except OSError as e:
        if is_disk_full(e):
            with contextlib.suppress(OSError):
                (p / (PROVENANCE_FILE + ".tmp")).unlink()
            raise RunDiskFull(_full_message(p, e), run_dir=p, oserror=e) from None
        raise
    return rd


@contextlib.contextmanager
def open_run(kind: str, *, words: Sequence[str | None] = (), build: Build | None = None,
             workload: str | None = None, mode: str | None = None,
             run_id: str | None = None, base: str | os.PathLike[str] | None = None,
             path: str | os.PathLike[str] | None = None, tools: Sequence[str] = (),
             latest: bool = False, **facts: Any) -> Iterator[RunDir]:
    """THE run lifecycle: ``with open_run("bench", workload=w) as rd: ...``.

    Before the body: the folder is named and checked (:func:`place`; *words* name it
    beside *kind*, else the build, workload and mode do) and provenance.json is written
    with ``status: running``. After it, one final status is written with ``ended_at``,
    the load average and the error (if any): ``complete`` when the body returns,
    ``interrupted`` on Ctrl-C (KeyboardInterrupt, SystemExit), ``failed`` on anything
    else; a full disk anywhere becomes :class:`RunDiskFull` (the files written before are
    kept). With *latest*, ``<folder's parent>/latest`` is pointed at the run when it
    completes (the bench and the imported profiles: what a notebook opens by default).
    The final status is this function's word; the body adds facts with
    :meth:`RunDir.update`.
    """
    if words:
        run_id, path = place(kind, *words, path=path, base=base, run_id=run_id)
    rd = new_run(kind, build=build, workload=workload, mode=mode, run_id=run_id,
                 base=base, path=path, tools=tools, status=RUNNING,
                 loadavg_start=loadavg(), **facts)
    status, error = FAILED, None
    try:
        yield rd
        status = COMPLETE
    except (KeyboardInterrupt, SystemExit) as e:
        status, error = INTERRUPTED, type(e).__name__
        raise
    except OSError as e:
        error = f"{type(e).__name__}: {e}"
        if is_disk_full(e):
            raise RunDiskFull(_full_message(rd.path, e), run_dir=rd.path, oserror=e) from None
        raise
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        _take_disk_facts(rd)
        try:
            rd.update(status=status, error=error, ended_at=now(), loadavg_end=loadavg())
        except OSError:  # a full disk: the provenance written before stays
            with contextlib.suppress(OSError):
                (rd.path / (PROVENANCE_FILE + ".tmp")).unlink()
        if status == COMPLETE and latest:
            update_latest(rd.path)


def _take_disk_facts(rd: RunDir) -> None:
    """Before the final status: what another handle on the same run wrote meanwhile (a
    collector folding it through ``load_run``) joins *rd*'s provenance, so writing the
    status does not put an older copy back."""
    try:
        disk = json.loads((rd.path / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return
    if isinstance(disk, dict):
        mine = rd.provenance
        rd.provenance = {**mine, **disk}
        for k in ("artifacts",):
            if isinstance(mine.get(k), dict) and isinstance(disk.get(k), dict):
                rd.provenance[k] = {**mine[k], **disk[k]}


def list_runs(root: str | os.PathLike[str] | None = None, *, kind: str | None = None
              ) -> list[RunDir]:
    """Every run under *root* (default profiles/), oldest first; *kind* filters.

    A folder without a readable provenance.json is not a run and is left out; ``latest``
    (a symlink) is not listed twice.
    """
    base = Path(root) if root is not None else paths.profiles_dir()
    if not base.is_dir():
        return []
    out = []
    for d in base.iterdir():
        if d.is_symlink() or not d.is_dir() or d.name.startswith("."):
            continue
        try:
            rd = load_run(d)
        except RunDirError:
            continue
        if kind is None or rd.kind == kind:
            out.append(rd)
    return sorted(out, key=lambda r: (str(r.provenance.get("started_at") or ""), r.run_id))


def resolve(path_or_id: str | os.PathLike[str] | None = None,
            root: str | os.PathLike[str] | None = None) -> Path:
    """The directory of a run: a path, a run id under *root* (profiles/), or latest."""
    base = Path(root) if root is not None else paths.profiles_dir()
    if path_or_id is None:
        return base / LATEST
    p = Path(path_or_id)
    if p.is_dir() or p.is_absolute():
        return p
    return base / str(path_or_id)


def load_run(path_or_id: str | os.PathLike[str] | None = None, *,
             root: str | os.PathLike[str] | None = None) -> RunDir:
    """THE loader: any run written by profkit, read back exactly as written.

    *path_or_id*: a directory, a run id under profiles/ (or *root*), or None for
    ``latest``. A directory without provenance.json (not a run, or one that failed before
    it began) and a damaged provenance.json are refused with a message saying so.
    """
    p = resolve(path_or_id, root)
    if not p.is_dir():
        raise RunDirError(f"no run directory {p}: pass a directory written by profkit or a "
                          f"run id under {p.parent}")
    f = p / PROVENANCE_FILE
    try:
        prov = json.loads(f.read_text())
    except FileNotFoundError:
        raise RunDirError(f"no run at {p}: {PROVENANCE_FILE} is missing (pass a directory "
                          "written by profkit, or a run id under profiles/)") from None
    except ValueError as e:
        raise RunDirError(f"{f} is not valid JSON ({e}); the run is damaged (its tables are "
                          "still there to read by hand)") from None
    if not isinstance(prov, dict):
        raise RunDirError(f"{f} does not hold a JSON object; the run is damaged")
    return RunDir(str(prov.get("run_id") or p.resolve().name), p.resolve(), prov)


def update_latest(run_dir: str | os.PathLike[str]) -> Path:
    """Point ``<parent>/latest`` at *run_dir* (a relative symlink, replaced atomically)."""
    run_dir = Path(run_dir)
    root = run_dir.parent
    link = root / LATEST
    if link.exists() and not link.is_symlink():
        raise RunDirError(f"{link} exists and is not a symlink: move it away so profkit can "
                          "point 'latest' at the newest run")
    tmp = root / f".latest.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(run_dir.name, tmp)
    os.replace(tmp, link)
    return link


def check_comparable(a: Mapping[str, Any], b: Mapping[str, Any], *, force: bool = False,
                     fields: Sequence[str] = CHECKED_FIELDS) -> dict[str, tuple[Any, Any]]:
    """Differences of the checked provenance fields of two runs (provenance dicts).

    Raises :class:`ComparisonError` listing them unless *force* (then returns them). A
    field missing from one run counts as different: an old run is never completed with
    this machine's values.
    """
    diff = {f: (get_field(a, f), get_field(b, f)) for f in fields
            if get_field(a, f) != get_field(b, f)}
    if diff and not force:
        lines = "; ".join(f"{k}: {x!r} vs {y!r}" for k, (x, y) in diff.items())
        raise ComparisonError(f"runs {a.get('run_id')} and {b.get('run_id')} are not "
                              f"comparable ({lines}); pass force=True to compare anyway")
    return diff


def compare_provenance(a: RunDir, b: RunDir, fields: Sequence[str] = CHECKED_FIELDS
                       ) -> dict[str, tuple[Any, Any]]:
    """The checked fields whose values differ between two runs (empty: comparable)."""
    return check_comparable(a.provenance, b.provenance, force=True, fields=fields)


# --------------------------------------------------------------------------- row files

def is_disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


class RowWriter:
    """Append-only CSV (with header) with one ``write`` + ``fsync`` per row.

    A write that fails (disk full) is truncated back to the last whole row, so the file
    always parses and holds every row that was reported written. :meth:`json_line`
    appends a JSON record instead, for files of plans (no header: ``columns=()``).
    """

    def __init__(self, path: str | os.PathLike[str], columns: Sequence[str] = ()) -> None:
        self.path = Path(path)
        self.columns = tuple(columns)
        self.rows = 0
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        if self.columns:
            try:
                self._append(self._line(self.columns))
            except BaseException:
                self.close()
                raise

    @staticmethod
    def _line(values: Sequence[Any]) -> bytes:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(values)
        return buf.getvalue().encode()

    @staticmethod
    def _cell(v: Any) -> Any:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        if isinstance(v, float):
            return repr(v)
        return v

    def _append(self, data: bytes) -> None:
        pos = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            n = os.write(self._fd, data)
            if n != len(data):  # a short write to a regular file means the disk filled up
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
            os.fsync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, pos)
            raise

    def write(self, row: Mapping[str, Any]) -> None:
        self._append(self._line([self._cell(row.get(c)) for c in self.columns]))
        self.rows += 1

    def json_line(self, obj: Mapping[str, Any]) -> None:
        self._append((json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode())
        self.rows += 1

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
