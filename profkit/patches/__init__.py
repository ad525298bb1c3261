"""The PostgreSQL patch library: instrumentation-overhead variants of PostgreSQL 18.6.

Each ``pg18/<name>.patch`` is a unified diff for ``patch -p1`` from the source
root, preceded by a header (the lines before the first ``diff``/``---`` line,
which ``patch`` ignores) saying what it does and why.  Some patches are
cumulative: :data:`PRESETS` maps a build preset to the ordered list of patches
it applies.

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
from profkit.run import run

PATCH_DIR = Path(__file__).resolve().parent / "pg18"

# The PostgreSQL version the patches were written and tested against.
TARGET_VERSION = "18.6"

# preset -> patches, in the order they are applied (step2/step3 build on step1).
PRESETS: dict[str, list[str]] = {
    "vanilla": [],
    "step1": ["step1"],
    "step2": ["step1", "step2"],
    "step3": ["step1", "step2", "step3"],
    "coarse_clock": ["coarse_clock"],
    "tsc_clock": ["tsc_clock"],
    "sampled_timing": ["sampled_timing"],
}

DESCRIPTIONS: dict[str, str] = {
    "vanilla": "unpatched PostgreSQL",
    "step1": "InstrStartNode/StopNode/UpdateTupleCount/EndLoop always-inline in instrument.h",
    "step2": "step1 + ExecProcNodeInstrLite when only rows are counted",
    "step3": "step2 + rows counted inside every node's ExecProcNode function (no wrapper)",
    "coarse_clock": "instr_time reads CLOCK_MONOTONIC_COARSE (4 ms ticks here)",
    "tsc_clock": "instr_time reads the TSC (GUC instr_clock_source, default auto = rdtsc)",
    "sampled_timing": "EXPLAIN ANALYZE times 1 of N calls per node "
                      "(GUC explain_timing_sample_rate, default 100)",
}

# GUCs a patch adds: patch -> {name: default}.  Lets callers record them in provenance.
PATCH_GUCS: dict[str, dict[str, str]] = {
    "tsc_clock": {"instr_clock_source": "auto"},
    "sampled_timing": {"explain_timing_sample_rate": "100"},
}

_DIFF_START = re.compile(r"^(diff |--- )")


def list_patches() -> list[str]:
    """Names (file stems) of the patches in :data:`PATCH_DIR`, sorted."""
    return sorted(p.stem for p in PATCH_DIR.glob("*.patch"))


def patch_file(name: str) -> Path:
    """Path of the patch *name*, or :class:`PatchError` listing the known ones."""
    path = PATCH_DIR / f"{name}.patch"
    if not path.is_file():
        raise PatchError(
            f"no patch named {name!r} in {PATCH_DIR}; known patches: "
            f"{', '.join(list_patches()) or 'none'}", step="patch")
    return path


def read_patch(name: str) -> str:
    """Full text of the patch *name* (header included)."""
    return patch_file(name).read_text()


def split_header(patch_text: str) -> str:
    """The header of a patch text: the lines before its first ``diff``/``---`` line."""
    lines = []
    for line in patch_text.splitlines():
        if _DIFF_START.match(line):
            break
        lines.append(line)
    return "\n".join(lines).strip()


def patch_header(name: str) -> str:
    """The header of the patch *name* (what it does and why)."""
    return split_header(read_patch(name))


def preset_patches(preset: str) -> list[str]:
    """The ordered patch list of *preset*, or :class:`PatchError` listing the presets."""
    if preset not in PRESETS:
        raise PatchError(
            f"unknown patch preset {preset!r}; known presets: {', '.join(PRESETS)}",
            step="patch")
    return list(PRESETS[preset])


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


def failure_message(name: str, earlier: list[str], output: str, patch_text: str,
                    patch_path: Path | None = None) -> str:
    """Say which patch failed, on top of what, which hunks were rejected, and what to do."""
    problems = parse_patch_output(output, patch_text)
    where = f" on top of {', '.join(earlier)}" if earlier else ""
    if problems:
        parts = []
        for h in problems:
            if h.number is None:
                parts.append(f"{h.file}: {h.reason}")
            else:
                parts.append(f"{h.file} hunk #{h.number}"
                             + (f" (at line {h.line})" if h.line is not None else "")
                             + (f" {h.header}" if h.header else ""))
        detail = "; ".join(parts)
    else:
        tail = output.strip().splitlines()
        detail = tail[-1] if tail else "patch gave no output"
    return (f"patch {name!r} does not apply{where}: {detail}. "
            f"The patches were written for PostgreSQL {TARGET_VERSION}: build from that "
            f"source, or rebase the patch onto this one (see the header of "
            f"{patch_path or PATCH_DIR / (name + '.patch')}); cumulative patches must be applied in "
            f"the order of PRESETS, e.g. step3 = {' + '.join(PRESETS['step3'])}.")


def check_applies(source_dir: str | Path, patch_names: list[str] | tuple[str, ...]) -> None:
    """Check that *patch_names* apply, in order, to the tree at *source_dir*.

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
    texts = {name: read_patch(name) for name in patch_names}  # unknown names fail early
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
                    "-i", str(patch_file(name))]
            dry = run([*base, "--dry-run"], check=False, timeout=120,
                      what=f"patch --dry-run {name}")
            output = (dry.stdout or "") + (dry.stderr or "")
            if dry.returncode != 0:
                raise PatchError(failure_message(name, list(patch_names[:i]), output,
                                                  texts[name]), step="patch")
            if i + 1 < len(patch_names):
                run(base, timeout=120, what=f"patch {name}")
