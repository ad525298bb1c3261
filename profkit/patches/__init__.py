"""The PostgreSQL patch library: instrumentation-overhead variants of PostgreSQL.

The library is version-aware: ``pg<major>/<name>.patch`` is the variant *name*
for PostgreSQL <major> (``pg18/`` was written against 18.6, ``pg19/`` against
19beta1, :data:`TARGET_VERSIONS`).  A preset resolves to the patches of the
source's major version; a variant with no patch for that version is a
:class:`PatchError` naming the versions that have it.

Each patch is a unified diff for ``patch -p1`` from the source root, preceded by
a header (the lines before the first ``diff``/``---`` line, which ``patch``
ignores) saying what it does and why.  Some patches are cumulative:
:data:`PRESETS` maps a build preset to the ordered list of patches it applies.

>>> PRESETS["step3"]
['step1', 'step2', 'step3']
"""
from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from profkit.errors import PatchError
from profkit.pg.source import major_version, upstream_version
from profkit.processes import run

PATCH_ROOT = Path(__file__).resolve().parent
DEFAULT_MAJOR = "18"

# The PostgreSQL version each folder's patches were written and tested against.
TARGET_VERSIONS: dict[str, str] = {"18": "18.6", "19": "19beta1"}
TARGET_VERSION = TARGET_VERSIONS[DEFAULT_MAJOR]

# preset -> patches, in the order they are applied (step2/step3 build on step1).
PRESETS: dict[str, list[str]] = {
    "vanilla": [],
    "step1": ["step1"],
    "step2": ["step1", "step2"],
    "step3": ["step1", "step2", "step3"],
    # step4 replaces step2/step3 (it does not build on them): the plain path stays vanilla's
    "step4": ["step1", "step4"],
    "step5": ["step1", "step4", "step5"],
    # step6: step5 + buffer usage counted where it happens (BUFFERS on without the wrapper)
    "step6": ["step1", "step4", "step5", "step6"],
    "coarse_clock": ["coarse_clock"],
    "tsc_clock": ["tsc_clock"],
    "sampled_timing": ["sampled_timing"],
    # lean TIMING wrappers: pg19/ on upstream's TSC clock, pg18/ on clock_gettime (or on
    # tsc_clock's TSC when built on top of it)
    "fast_timing": ["fast_timing"],
    # the running plan node published for samplers (GUC track_executor_node, default off)
    "node_marker": ["node_marker"],
}

DESCRIPTIONS: dict[str, str] = {
    "vanilla": "unpatched PostgreSQL",
    "step1": "InstrStartNode/StopNode/UpdateTupleCount/EndLoop always-inline in instrument.h",
    "step2": "step1 + ExecProcNodeInstrLite when only rows are counted",
    "step3": "step2 + rows counted inside every node's ExecProcNode function (no wrapper)",
    "step4": "step1 + a row-counting twin of every node function, installed only under "
             "EXPLAIN ANALYZE rows-only; rows in one integer word",
    "step5": "step4 + the row word in PlanState: the per-row path never reads instrument",
    "step6": "step5 + each plan node's buffer usage counted where it happens (no snapshot per "
             "call): EXPLAIN ANALYZE's default BUFFERS on takes the counting twins too",
    "coarse_clock": "instr_time reads CLOCK_MONOTONIC_COARSE (4 ms ticks here)",
    "tsc_clock": "instr_time reads the TSC (GUC instr_clock_source, default auto = rdtsc)",
    "sampled_timing": "EXPLAIN ANALYZE times ~1 of N calls per node (bursts of 8 at geometric "
                      "gaps, exact first and heavy calls), Horvitz-Thompson estimate minus the "
                      "calibrated clock and "
                      "bookkeeping cost "
                      "(GUC explain_timing_sample_rate, default 100)",
    "fast_timing": "lean ExecProcNode wrappers for TIMING (BUFFERS/WAL too): start time in a "
                   "register, choices made once per node; on 19 RDTSC read directly",
    "node_marker": "the running plan node's EXPLAIN number in a global (pg_node_marker) for "
                   "samplers, with GUC track_executor_node on (default off)",
}

# GUCs a patch adds: patch -> {name: default}.  Lets callers record them in provenance.
PATCH_GUCS: dict[str, dict[str, str]] = {
    "tsc_clock": {"instr_clock_source": "auto"},
    "sampled_timing": {"explain_timing_sample_rate": "100"},
    "node_marker": {"track_executor_node": "off"},
}

_DIFF_START = re.compile(r"^(diff |--- )")


def versions() -> list[str]:
    """Major versions the library has a ``pg<major>/`` folder for, ascending."""
    out = [d.name[2:] for d in PATCH_ROOT.glob("pg*") if d.is_dir() and d.name[2:].isdigit()]
    return sorted(out, key=int)


def patch_dir(major: str = DEFAULT_MAJOR) -> Path:
    return PATCH_ROOT / f"pg{major}"


def list_patches(major: str = DEFAULT_MAJOR) -> list[str]:
    """Names (file stems) of the patches for PostgreSQL *major*, sorted."""
    return sorted(p.stem for p in patch_dir(major).glob("*.patch"))


def has_patch(name: str, major: str = DEFAULT_MAJOR) -> bool:
    return (patch_dir(major) / f"{name}.patch").is_file()


def versions_with(name: str) -> list[str]:
    """The major versions that have a patch *name*."""
    return [v for v in versions() if has_patch(name, v)]


def missing_message(variant: str, missing: list[str], major: str) -> str:
    """Say that *variant* cannot be built for PostgreSQL *major*, and what exists instead."""
    where = ", ".join(f"{m} (exists for: {', '.join('pg' + v for v in versions_with(m)) or 'none'})"
                      for m in missing)
    have = [p for p in PRESETS if all(has_patch(x, major) for x in PRESETS[p])]
    return (f"variant {variant!r} has no patch for PostgreSQL {major}: missing {where}. "
            f"{patch_dir(major)} has: {', '.join(list_patches(major)) or 'nothing'}; "
            f"presets buildable for PostgreSQL {major}: {', '.join(have)}. Build it from a "
            f"source of a version that has it, or port the patch.")


def patch_file(name: str, major: str = DEFAULT_MAJOR) -> Path:
    """Path of the patch *name* for *major*, or :class:`PatchError` listing the known ones."""
    path = patch_dir(major) / f"{name}.patch"
    if not path.is_file():
        other = versions_with(name)
        also = f"; {name!r} exists for: {', '.join('pg' + v for v in other)}" if other else ""
        raise PatchError(
            f"no patch named {name!r} in {patch_dir(major)}; known patches for PostgreSQL "
            f"{major}: {', '.join(list_patches(major)) or 'none'}{also}", step="patch")
    return path


def read_patch(name: str, major: str = DEFAULT_MAJOR) -> str:
    """Full text of the patch *name* (header included)."""
    return patch_file(name, major).read_text()


def split_header(patch_text: str) -> str:
    """The header of a patch text: the lines before its first ``diff``/``---`` line."""
    lines = []
    for line in patch_text.splitlines():
        if _DIFF_START.match(line):
            break
        lines.append(line)
    return "\n".join(lines).strip()


def patch_header(name: str, major: str = DEFAULT_MAJOR) -> str:
    """The header of the patch *name* (what it does and why)."""
    return split_header(read_patch(name, major))


def preset_patches(preset: str, major: str | None = None) -> list[str]:
    """The ordered patch list of *preset*, or :class:`PatchError` listing the presets.

    With *major*, also checks that every patch exists for that PostgreSQL version."""
    if preset not in PRESETS:
        raise PatchError(
            f"unknown patch preset {preset!r}; known presets: {', '.join(PRESETS)}",
            step="patch")
    names = list(PRESETS[preset])
    if major is not None:
        missing = [n for n in names if not has_patch(n, major)]
        if missing:
            raise PatchError(missing_message(preset, missing, major), step="patch")
    return names


@dataclass(frozen=True)
class FailedHunk:
    """A hunk (or a whole file's hunks) ``patch`` did not apply.

    ``number`` is the hunk number as ``patch`` counts them within the file and
    ``header`` its ``@@`` line in the patch file; both are None/"" when the whole
    file was skipped (``reason`` says why).
    """

    file: str
    number: int | None
    line: int | None
    header: str
    reason: str = "FAILED"


def hunk_headers(patch_text: str) -> dict[str, list[str]]:
    """Target file -> its hunks' ``@@ ... @@`` lines, in order, as ``patch`` numbers them."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    for line in patch_text.splitlines():
        if line.startswith("+++ "):
            current = _strip_prefix(line[4:])
            out.setdefault(current, [])
        elif line.startswith("@@") and current is not None:
            out[current].append(line.strip())
    return out


def _strip_prefix(name: str) -> str:
    """'b/src/x.c\t2024-...' -> 'src/x.c' (what -p1 does)."""
    name = name.split("\t")[0].strip()
    return name.split("/", 1)[1] if "/" in name else name


def target_files(patch_text: str) -> list[str]:
    """Files a patch reads or writes (paths after -p1), /dev/null excluded."""
    files: list[str] = []
    for line in patch_text.splitlines():
        if line.startswith(("--- ", "+++ ")) and not line[4:].startswith("/dev/null"):
            f = _strip_prefix(line[4:])
            if f not in files:
                files.append(f)
    return files


def parse_patch_output(output: str, patch_text: str) -> list[FailedHunk]:
    """Rejected hunks from the output of ``patch -p1 --batch --forward --dry-run``.

    Input (GNU patch 2.7)::

        checking file src/backend/executor/instrument.c
        Hunk #2 FAILED at 123.

    Output: ``[FailedHunk(file='src/backend/executor/instrument.c', number=2, line=123,
    header='@@ -120,7 +120,6 @@ InstrStartNode(...)', reason='FAILED')]``
    """
    headers = hunk_headers(patch_text)
    failed: list[FailedHunk] = []
    current = ""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(?:checking|patching) file (.+)", line)
        if m:
            current = m.group(1).strip().strip("'\"")
            continue
        m = re.match(r"Hunk #(\d+) FAILED(?: at (\d+))?", line)
        if m:
            n = int(m.group(1))
            hdrs = headers.get(current, [])
            failed.append(FailedHunk(
                file=current, number=n, line=int(m.group(2)) if m.group(2) else None,
                header=hdrs[n - 1] if 0 < n <= len(hdrs) else ""))
        elif line.startswith("Reversed (or previously applied) patch detected"):
            failed.append(FailedHunk(
                file=current, number=None, line=None, header="",
                reason="looks already applied (or reversed), all its hunks skipped"))
        elif line.startswith("can't find file to patch"):
            # patch echoes the diff header lines, prefixed with '|'
            name = "?"
            for echoed in lines[i + 1:i + 12]:
                m2 = re.match(r"\|\+\+\+ (\S+)", echoed)
                if m2:
                    name = _strip_prefix(m2.group(1))
                    break
            failed.append(FailedHunk(file=name, number=None, line=None, header="",
                                     reason="file does not exist in this source"))
    return failed


def rejected_hunks(output: str, patch_text: str) -> str:
    """patch(1)'s *output* for *patch_text* as one clause: each rejected hunk (file, number,
    line, function header) or file problem, else patch's last line."""
    parts = []
    for h in parse_patch_output(output, patch_text):
        if h.number is None:
            parts.append(f"{h.file}: {h.reason}")
        else:
            parts.append(f"{h.file} hunk #{h.number}"
                         + (f" (at line {h.line})" if h.line is not None else "")
                         + (f" {h.header}" if h.header else ""))
    tail = output.strip().splitlines()
    return "; ".join(parts) or (tail[-1] if tail else "patch gave no output")


def failure_message(name: str, earlier: list[str], output: str, patch_text: str,
                    patch_path: Path | None = None, major: str | None = None) -> str:
    """Say which patch failed, on top of what, which hunks were rejected, and what to do."""
    detail = rejected_hunks(output, patch_text)
    where = f" on top of {', '.join(earlier)}" if earlier else ""
    if major is None and patch_path is not None and patch_path.parent.name[2:].isdigit():
        major = patch_path.parent.name[2:]
    major = major or DEFAULT_MAJOR
    target = TARGET_VERSIONS.get(major, major)
    return (f"patch {name!r} does not apply{where}: {detail}. "
            f"The pg{major} patches were written for PostgreSQL {target}: build from that "
            f"source, or rebase the patch onto this one (see the header of "
            f"{patch_path or patch_dir(major) / (name + '.patch')}); cumulative patches must be "
            f"applied in the order of PRESETS, e.g. step3 = {' + '.join(PRESETS['step3'])}.")


def tree_major(source_dir: str | Path) -> str:
    """The major version of the PostgreSQL source tree at *source_dir* (from configure)."""

    return major_version(upstream_version(Path(source_dir)))


def check_applies(source_dir: str | Path, patch_names: list[str] | tuple[str, ...],
                  major: str | None = None) -> None:
    """Check that *patch_names* apply, in order, to the tree at *source_dir*.

    The patches are those of the tree's major version (read from its configure)
    unless *major* is given.

    Works on a scratch copy (the source is never modified): each patch is
    dry-run first, then applied so that the next one sees its result.  Raises
    :class:`PatchError` naming the patch, the file and the rejected hunks (with
    their ``@@`` lines from the patch file), and saying what to do.
    """
    src = Path(source_dir)
    if not (src / "src" / "include").is_dir():
        raise PatchError(
            f"{src} is not a PostgreSQL source tree (no src/include); pass the directory "
            "that holds configure and src/", step="patch")
    major = major or tree_major(src)
    texts = {name: read_patch(name, major) for name in patch_names}  # unknown names fail early
    with tempfile.TemporaryDirectory(prefix="profkit-patchcheck-") as tmp:
        tree = Path(tmp) / "src"
        # patch(1) only touches the files named in the diffs: copying just those
        # keeps this a sub-second check instead of copying the whole tree
        for rel in {f for name in patch_names for f in target_files(texts[name])}:
            if (src / rel).is_file():
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / rel, tree / rel)
        tree.mkdir(exist_ok=True)
        for i, name in enumerate(patch_names):
            base = ["patch", "-p1", "--batch", "--forward", "-d", str(tree),
                    "-i", str(patch_file(name, major))]
            dry = run([*base, "--dry-run"], check=False, timeout=120,
                      what=f"patch --dry-run {name}")
            output = (dry.stdout or "") + (dry.stderr or "")
            if dry.returncode != 0:
                raise PatchError(failure_message(name, list(patch_names[:i]), output,
                                                  texts[name], major=major), step="patch")
            if i + 1 < len(patch_names):
                run(base, timeout=120, what=f"patch {name}")
