"""Static checks of the PostgreSQL patch library (no build, no cluster).

The apply checks run on a pristine PostgreSQL 18.6 source tree: PROFKIT_PG_SRC
if set, else profkit's default source (Debian's postgresql-18, fetched and
cached on first use like every build does).
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from profkit import patches
from profkit.errors import PatchError

ALL = patches.list_patches()


def _source() -> Path:
    src = os.environ.get("PROFKIT_PG_SRC")
    if not src:
        from profkit.pg.source import get_source

        src = get_source().path
    path = Path(src)
    assert (path / "configure").is_file() and (path / "src" / "include").is_dir(), \
        f"PROFKIT_PG_SRC={src} is not a PostgreSQL source tree"
    return path


def test_library_has_every_variant():
    assert ALL == sorted(["step1", "step2", "step3", "step4", "step5", "step6", "coarse_clock",
                          "tsc_clock", "sampled_timing", "fast_timing", "node_marker"])
    # every preset names patches that exist for some version, cumulative chains in order
    every = {n for v in patches.versions() for n in patches.list_patches(v)}
    for preset, names in patches.PRESETS.items():
        assert set(names) <= every, preset
    # the timing variant exists for both versions
    assert patches.PRESETS["fast_timing"] == ["fast_timing"]
    assert patches.versions_with("fast_timing") == ["18", "19"]
    assert patches.PRESETS["step3"] == ["step1", "step2", "step3"]
    assert patches.PRESETS["step6"] == ["step1", "step4", "step5", "step6"]
    assert patches.versions_with("step6") == ["18", "19"]
    assert patches.PRESETS["vanilla"] == []


@pytest.mark.parametrize("name", ALL)
def test_patch_has_header(name):
    text = patches.read_patch(name)
    header = patches.split_header(text)
    # a real explanation, naming the variant, before the first diff line
    assert len(header.splitlines()) >= 5, header
    assert name in header.splitlines()[0]
    assert "Files:" in header
    assert re.search(r"^diff --git a/\S+ b/\S+$", text, re.MULTILINE)
    # the header must not look like diff syntax to patch(1)
    for line in header.splitlines():
        assert not line.startswith(("--- ", "+++ ", "*** ", "@@", "Index:")), line


@pytest.mark.parametrize("name", ["step2", "step3", "step4", "step5", "step6"])
def test_cumulative_patches_say_so(name):
    assert "CUMULATIVE" in patches.patch_header(name)


def test_step3_adds_rather_than_assigns():
    text = patches.read_patch("step3")
    added = [ln[1:] for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert not any(re.search(r"tuplecount\s*=\s*1\.0", ln) for ln in added)
    assert any(re.search(r"tuplecount\s*\+=\s*1\.0", ln) for ln in added)


def test_step3_counts_every_tuple_returning_node():
    """Every ExecProcNode function of a node*.c file step3 touches goes through the helper."""
    text = patches.read_patch("step3")
    wrapped = set(re.findall(r"return PostExecProcNodeInstr\(pstate, (Exec\w+)Impl\(pstate\)\)",
                             text))
    in_place_files = set(re.findall(r"^\+\+\+ b/src/backend/executor/(node\w+)\.c", text,
                                    re.MULTILINE))
    assert len(wrapped) == 20
    assert {"ExecNestLoop", "ExecMergeJoin", "ExecMaterial", "ExecLimit", "ExecGather",
            "ExecGatherMerge", "ExecModifyTable", "ExecWindowAgg"} <= wrapped
    # 38 node files: every tuple-returning node type (not Hash/BitmapAnd/Or/IndexScan)
    assert len(in_place_files) == 38
    assert not in_place_files & {"nodeHash", "nodeBitmapAnd", "nodeBitmapOr",
                                 "nodeBitmapIndexscan"}
    # the five PG18 SeqScan variants
    seq = text.split("+++ b/src/backend/executor/nodeSeqscan.c", 1)[1].split("diff --git", 1)[0]
    assert seq.count("+\treturn PostExecProcNodeInstr(pstate,") == 5


def test_unknown_names_give_clear_errors(tmp_path):
    with pytest.raises(PatchError, match="known patches for PostgreSQL 18: coarse_clock"):
        patches.read_patch("step9")
    with pytest.raises(PatchError, match="known presets"):
        patches.preset_patches("nope")
    with pytest.raises(PatchError, match="not a PostgreSQL source tree"):
        patches.check_applies(tmp_path, ["step1"])


@pytest.mark.source
@pytest.mark.parametrize("preset", [p for p in patches.PRESETS if patches.PRESETS[p]
                                    and all(patches.has_patch(n, "18")
                                            for n in patches.PRESETS[p])])
def test_presets_apply_in_order(preset):
    src = _source()
    patches.check_applies(src, patches.PRESETS[preset])


@pytest.mark.source
def test_patch_dry_run_applies_to_fresh_copy(tmp_path):
    """The cumulative chain applies with plain `patch -p1` (what the build does)."""
    src = _source()
    tree = tmp_path / "pg"
    shutil.copytree(src / "src" / "backend" / "executor", tree / "src/backend/executor")
    shutil.copytree(src / "src" / "include", tree / "src/include")
    from profkit.processes import run

    for name in ["step1", "step2", "step3"]:
        argv = ["patch", "-p1", "--batch", "--forward", "-d", str(tree),
                "-i", str(patches.patch_file(name))]
        dry = run([*argv, "--dry-run"], check=False)
        assert dry.returncode == 0, dry.stdout + dry.stderr
        run(argv)
    helper = (tree / "src/include/executor/executor.h").read_text()
    assert "PostExecProcNodeInstr" in helper


@pytest.mark.source
def test_broken_patch_names_patch_file_and_hunk(tmp_path, monkeypatch):
    """A patch whose context no longer matches is reported with its @@ line."""
    src = _source()
    broken_dir = tmp_path / "pg18"
    broken_dir.mkdir()
    for v in patches.versions():
        if v != "18":
            shutil.copytree(patches.patch_dir(v), tmp_path / f"pg{v}")
    for name in ALL:
        shutil.copy(patches.patch_file(name), broken_dir)
    step2 = (broken_dir / "step2.patch").read_text()
    # corrupt a context line of step2's second hunk (inside ExecProcNodeFirst)
    needle = " \t * have ExecProcNode() directly call the relevant function from now on.\n"
    assert step2.count(needle) == 1
    (broken_dir / "step2.patch").write_text(
        step2.replace(needle, " \t * have ExecProcNode() call something else entirely.\n"))
    real_root = patches.PATCH_ROOT
    monkeypatch.setattr(patches, "PATCH_ROOT", tmp_path)

    with pytest.raises(PatchError) as exc:
        patches.check_applies(src, ["step1", "step2", "step3"])
    msg = str(exc.value)
    assert "patch 'step2' does not apply on top of step1" in msg
    assert "src/backend/executor/execProcnode.c hunk #2" in msg
    assert "@@ -460,9 +461,21 @@ ExecProcNodeFirst(PlanState *node)" in msg
    assert "rebase the patch" in msg and "18.6" in msg

    # applied to the wrong base (step2 without step1 is fine, step3 without step2 is not)
    monkeypatch.setattr(patches, "PATCH_ROOT", real_root)
    with pytest.raises(PatchError) as exc:
        patches.check_applies(src, ["step3"])
    msg = str(exc.value)
    assert msg.startswith("patch 'step3' does not apply: ")
    assert "execProcnode.c: looks already applied (or reversed)" in msg
    # step3's instrument.h hunks need step1's inlined functions: at least one is
    # rejected, named with its @@ line from the patch file
    hdrs = patches.hunk_headers(patches.read_patch("step3"))["src/include/executor/instrument.h"]
    m = re.search(r"src/include/executor/instrument\.h hunk #(\d+) \(at line \d+\) (@@[^@]*@@)", msg)
    assert m, msg
    assert hdrs[int(m.group(1)) - 1].startswith(m.group(2))
    assert "step3 = step1 + step2 + step3" in msg


def test_library_is_version_aware():
    assert patches.versions() == ["18", "19"]
    assert patches.list_patches("19") == ["fast_timing", "node_marker", "step1", "step2",
                                          "step3", "step4", "step5", "step6"]
    # PostgreSQL 19's step1 only moves the functions (19 already inlines them in instrument.c)
    pg19 = patches.read_patch("step1", "19")
    assert "NodeInstrumentation" in pg19 and "PostgreSQL 19" in patches.patch_header("step1", "19")
    assert patches.read_patch("step1", "19") != patches.read_patch("step1", "18")
    # a preset resolves to the patches of the version; missing ones are named with what exists
    assert patches.preset_patches("step3", "19") == ["step1", "step2", "step3"]
    with pytest.raises(PatchError) as exc:
        patches.preset_patches("tsc_clock", "19")
    msg = str(exc.value)
    assert "variant 'tsc_clock' has no patch for PostgreSQL 19" in msg
    assert "tsc_clock (exists for: pg18)" in msg
    assert "fast_timing, node_marker, step1, step2, step3, step4, step5, step6" in msg
    assert "vanilla, step1, step2, step3, step4, step5, step6, fast_timing" in msg
    with pytest.raises(PatchError, match=r"'tsc_clock' exists for: pg18"):
        patches.patch_file("tsc_clock", "19")


def test_build_presets_resolve_per_version():
    from profkit.errors import BuildError
    from profkit.pg import build

    p = build.presets()
    assert {"pg19/vanilla", "pg19/step3"} <= set(p)
    assert "pg19/tsc_clock" not in p and "pg19/step5" in p
    assert p["pg19/step3"].patches == ("step1", "step2", "step3")
    assert build.resolve_spec("pg18/step5").patches == ("step1", "step4", "step5")
    with pytest.raises(PatchError, match="variant 'coarse_clock' has no patch for PostgreSQL 19"):
        build.resolve_spec("pg19/coarse_clock")
    with pytest.raises(BuildError, match="unknown build 'pg19/nope'"):
        build.resolve_spec("pg19/nope")
    assert build.split_major("pg19/step3") == ("19", "step3")
    assert build.split_major("step3+gprof") == (None, "step3+gprof")
    path = build.patch_path("step3", "19")
    assert path == patches.PATCH_ROOT / "pg19" / "step3.patch"
    with pytest.raises(PatchError, match="no patch for PostgreSQL 19: missing tsc_clock"):
        build.patch_path("tsc_clock", "19")


def test_major_versions_of_sources(monkeypatch):
    from profkit.pg.source import SourceError, default_source_for_major, major_version

    assert major_version("18.6") == "18"
    assert major_version("19beta1") == "19"
    assert major_version("19devel") == "19"
    assert major_version("9.6.24") == "9.6"
    with pytest.raises(SourceError, match="major version"):
        major_version("devel")
    monkeypatch.delenv("PROFKIT_PG19_SOURCE", raising=False)
    assert default_source_for_major("19") == "debian:postgresql-19"
    monkeypatch.setenv("PROFKIT_PG19_SOURCE", "tarball:/x/postgresql-19beta1.tar.bz2")
    assert default_source_for_major("19") == "tarball:/x/postgresql-19beta1.tar.bz2"


def test_debian_suite_for_the_next_major(monkeypatch):
    from profkit.pg import source

    monkeypatch.delenv("PROFKIT_SRC_SUITE", raising=False)
    monkeypatch.setattr(source, "_read_os_release", lambda: {"ID": "debian"})
    assert source.debian_suite("postgresql-18") == "sid"
    assert source.debian_suite("postgresql-19") == "experimental"
    monkeypatch.setenv("PROFKIT_SRC_SUITE", "trixie")
    assert source.debian_suite("postgresql-19") == "trixie"


def test_parse_patch_output_without_failures():
    assert patches.parse_patch_output("", "") == []
    out = "checking file src/x.c\nHunk #1 succeeded at 12 (offset 2 lines).\n"
    assert patches.parse_patch_output(out, "") == []


@pytest.mark.source
@pytest.mark.parametrize("preset", ["step1", "step2", "step3", "step4", "step5", "step6"])
def test_pg19_presets_apply_to_pg19_source(preset):
    """The pg19/ patches apply, in order, to the PostgreSQL 19 source (major read from it)."""
    from profkit.pg.build import resolve_source

    src = resolve_source(f"pg19/{preset}")
    assert src.major == "19", src
    patches.check_applies(src.path, patches.preset_patches(preset, "19"))
    # the pg18 patches do not apply to 19: the error says which version they were written for
    with pytest.raises(PatchError, match=r"patch 'step1' does not apply: .*pg18 patches were "
                                         r"written for PostgreSQL 18\.6"):
        patches.check_applies(src.path, ["step1"], major="18")


# ---------------------------------------------------------------------------------------
# step6: every plan node counts its buffer usage where it happens.  If an increment of
# pgBufferUsage were left as it was, EXPLAIN would miss that usage in every node (only
# the totals would have it); if an init function set ExecProcNodeCounted without the
# buffer twin, that node would silently take the generic wrapper under BUFFERS.

_INCREMENT = re.compile(r"pgBufferUsage\.\w+\s*(\+\+|\+=)|"
                        r"INSTR_TIME_(ADD|ACCUM_DIFF)\(pgBufferUsage\.")


@pytest.mark.parametrize("major", ["18", "19"])
def test_step6_gives_every_counting_twin_a_buffer_twin(major):
    def added(name: str, pattern: str) -> list[str]:
        return [m.group(1) for m in re.finditer(pattern, patches.read_patch(name, major))]

    counted = sorted(added("step4", r"(?m)^\+\s*\S+\.ExecProcNodeCounted = (\w+)Counted;$"))
    buf = sorted(added("step6", r"(?m)^\+\s*\S+\.ExecProcNodeCountedBuf = (\w+)CountedBuf;$"))
    assert len(counted) >= 40 and buf == counted
    text = patches.read_patch("step6", major)
    # the third instance of every node function sets pgBufferUsageNode around the body
    assert "fn##CountedBuf(PlanState *pstate)" in text
    assert "+\tpgBufferUsageNode = pstate; \\" in text
    assert "+\tpgBufferUsageNode = pstate->instr_parent; \\" in text
    # no pgBufferUsage increment is removed without its replacement
    removed = [ln for ln in text.splitlines() if ln.startswith("-") and not ln.startswith("---")
               and _INCREMENT.search(ln)]
    replaced = [ln for ln in text.splitlines() if ln.startswith("+")
                and re.search(r"INSTR_BUFUSAGE_(INCR|ADD|TIME_ADD|TIME_ACCUM_DIFF)\((?!fld\b)\w+", ln)]
    assert len(removed) == len(replaced) >= 20, (removed, replaced)


@pytest.mark.source
@pytest.mark.parametrize("major", ["18", "19"])
def test_step6_leaves_no_buffer_increment_uncounted(major, tmp_path):
    """Applied to the real source, step6 leaves no direct increment of pgBufferUsage in
    the backend outside instrument.c (every one also counts for the running node)."""
    from profkit.pg.build import resolve_source
    from profkit.processes import run

    src = Path(resolve_source("step6" if major == "18" else f"pg{major}/step6").path)
    sites = {}
    for f in sorted((src / "src" / "backend").rglob("*.c")):
        rel = str(f.relative_to(src))
        if rel.endswith("executor/instrument.c"):
            continue
        n = sum(1 for ln in f.read_text(errors="replace").splitlines() if _INCREMENT.search(ln))
        if n:
            sites[rel] = n
    assert sum(sites.values()) >= 20, sites
    touched = {f for name in patches.PRESETS["step6"]
               for f in patches.target_files(patches.read_patch(name, major))}
    assert set(sites) <= touched, sorted(set(sites) - touched)
    tree = tmp_path / "src"
    for rel in touched:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, tree / rel)
    for name in patches.PRESETS["step6"]:
        run(["patch", "-p1", "--batch", "--forward", "-d", str(tree),
             "-i", str(patches.patch_file(name, major))])
    left = {rel: [ln for ln in (tree / rel).read_text().splitlines() if _INCREMENT.search(ln)]
            for rel in sites}
    assert not any(left.values()), left
