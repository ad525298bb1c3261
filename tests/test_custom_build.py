"""Issue 15, part 1: your own patch as a named build (``profkit build NAME --patch FILE``).

The real test builds a one-line patch of instrument.c (a second clock read in InstrStopNode,
written for this test) through the CLI — the shared ccache makes it a ~2 min build — and
benchmarks it against vanilla through the CLI at a tiny scale. The bad-input tests need no
build: they fail before anything is compiled.
"""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from profkit import paths
from profkit.errors import BuildError, PatchError
from profkit.pg import build as B

FIXTURES = Path(__file__).parent / "fixtures" / "patches"
PATCH = FIXTURES / "instrstop-double-clock.patch"


def _cli(*argv: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "profkit", *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


@pytest.fixture
def unique_name():
    """A build name of this test only; its spec files are removed afterwards."""
    name = f"test-pk15-{uuid.uuid4().hex[:8]}"
    yield name
    import shutil

    (B.specs_dir() / f"{name}.json").unlink(missing_ok=True)
    shutil.rmtree(B.specs_dir() / name, ignore_errors=True)
    # and the log of a build of it that failed on purpose (the user's cache keeps none)
    for log in paths.sub("logs").glob(f"{name}-*-failed-*.log"):
        log.unlink()


# --------------------------------------------------------------------------- bad input


def test_missing_patch_file_is_one_line(tmp_path, unique_name):
    cp = _cli("build", unique_name, "--patch", str(tmp_path / "nope.patch"))
    assert cp.returncode == 1
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1, cp.stderr
    assert "nope.patch" in lines[0] and "not found" in lines[0]
    assert not (B.specs_dir() / f"{unique_name}.json").exists()


@pytest.mark.parametrize("argv, text", [
    (["vanilla", "--patch", str(PATCH)], "is a library preset"),
    (["step3", "--patch", str(PATCH)], "is a library preset"),
    (["bad/name", "--patch", str(PATCH)], "use letters, digits"),
    (["x1", "x2", "--patch", str(PATCH)], "make one named build"),
    (["{name}", "--patch", str(PATCH), "--base", "nosuch"], "unknown base build 'nosuch'"),
])
def test_bad_names_refused_before_building(argv, text, unique_name):
    cp = _cli("build", *[a.replace("{name}", unique_name) for a in argv])
    assert cp.returncode in (1, 2), cp.stderr
    assert text in cp.stderr, cp.stderr
    assert "Traceback" not in cp.stderr


@pytest.mark.source  # the cache key reads the source identity (downloads it once)
def test_define_build_persists_spec_and_key_follows_patch_text(tmp_path, unique_name):
    mine = tmp_path / "mine.patch"
    mine.write_text(PATCH.read_text())
    spec = B.define_build(unique_name, [mine], base="step3", configure_opts=["--with-openssl"],
                          cflags="-DPK15")
    doc = json.loads((B.specs_dir() / f"{unique_name}.json").read_text())
    assert doc["base"] == "step3" and doc["origin"][0]["file"] == str(mine.resolve())
    lib = B.presets()["step3"]
    # the base's patches first, then the user's copy (kept in the cache, not the user's file)
    assert spec.patches[:len(lib.patches)] == lib.patches
    assert spec.patches[-1] == str(B.specs_dir() / unique_name / "mine.patch")
    assert Path(spec.patches[-1]).read_text() == PATCH.read_text()
    assert spec.configure_opts == ("--with-openssl",)
    assert spec.cflags == B.BASE_CFLAGS + " -DPK15"
    # usable wherever a preset name is, with its +gprof twin
    known = B.presets()
    assert known[unique_name] == spec
    assert known[f"{unique_name}+gprof"].patches == spec.patches
    assert "--enable-profiling" in known[f"{unique_name}+gprof"].configure_opts
    assert B.resolve_spec(unique_name) == spec
    listing = _cli("build", "--list", timeout=120)
    assert listing.returncode == 0
    assert any(line.startswith(unique_name) and "(yours)" in line
               for line in listing.stdout.splitlines()), listing.stdout
    # cached by content: the same text is the same key, a changed patch a new one
    src = B.get_source(None)
    comp = B.compiler_identity()
    files = [Path(p) if p.startswith("/") else B.patch_path(p, "18") for p in spec.patches]
    k1 = B.cache_key(spec, src, files, comp)
    mine.write_text(PATCH.read_text().replace("second clock read", "2nd clock read"))
    spec2 = B.define_build(unique_name, [mine], base="step3", configure_opts=["--with-openssl"],
                           cflags="-DPK15")
    k2 = B.cache_key(spec2, src, files, comp)
    assert k1 != k2
    assert B.custom_specs()[unique_name] == spec2


def test_duplicate_patch_names_and_own_base(tmp_path, unique_name):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.patch").write_text(PATCH.read_text())
    (tmp_path / "x.patch").write_text(PATCH.read_text())
    with pytest.raises(BuildError, match="two patch files named x"):
        B.define_build(unique_name, [tmp_path / "x.patch", tmp_path / "a" / "x.patch"])
    with pytest.raises(PatchError, match="not found"):
        B.define_build(unique_name, [tmp_path / "missing.diff"])
    (tmp_path / "notes.patch").write_text("I meant to paste the diff here\n")
    cp = _cli("build", unique_name, "--patch", str(tmp_path / "notes.patch"))
    assert cp.returncode == 1 and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
    assert "is not a unified diff" in cp.stderr and "git diff > my.patch" in cp.stderr
    assert not (B.specs_dir() / f"{unique_name}.json").exists()


# --------------------------------------------------------------------------- real builds


@pytest.mark.pg
def test_patch_that_does_not_apply_names_the_hunk(unique_name):
    cp = _cli("build", unique_name, "--patch", str(FIXTURES / "broken.patch"), timeout=1800)
    assert cp.returncode == 1, cp.stderr
    lines = cp.stderr.strip().splitlines()
    # progress lines ("• NAME: copying source ...") then the error, on one line
    assert all(ln.startswith("•") for ln in lines[:-1]), lines
    err = lines[-1]
    assert err.startswith("profkit: build ") and "your patch broken.patch" in err
    assert "src/backend/executor/execProcnode.c" in err
    assert "hunk #2" in err and "@@ -455,6 +456,7 @@" in err
    # what to do, for a patch of one's own (not the library's advice about presets)
    assert "Rebase it onto that source" in err and "--source git:" in err
    assert "PRESETS" not in err
    assert "Traceback" not in cp.stderr


@pytest.mark.pg
def test_custom_build_benched_against_vanilla(tmp_path, vanilla_build):
    name = "test-pk15-double-clock"  # fixed name: reruns reuse the cached build
    cp = _cli("build", name, "--patch", str(PATCH), timeout=3600)
    assert cp.returncode == 0, cp.stderr[-3000:]
    built = B.find_build(name)
    assert built is not None and built.patches[-1]["name"] == "instrstop-double-clock"
    assert built.patches[-1]["text"] == PATCH.read_text()
    nm = subprocess.run(["nm", str(built.postgres)], capture_output=True, text=True).stdout
    assert " T InstrStopNode" in nm
    out = tmp_path / "profiles"
    cp = _cli("bench", "--builds", f"vanilla,{name}", "--workload", "nested_loop", "--scale",
              "0.01", "--reps", "3", "--instructions", "none", "--seed", "7", "--out", str(out))
    assert cp.returncode == 0, cp.stderr[-3000:]
    run = (out / "latest").resolve()
    prov = json.loads((run / "provenance.json").read_text())
    blob = json.dumps(prov)
    assert B._sha256(PATCH) in blob, "the patch's hash is in the run's provenance"
    assert "a deliberate second clock read per stop" in blob, "and its text"
    import pandas as pd

    summary = pd.read_csv(run / "summary.csv")
    assert set(summary["build"]) == {"vanilla", name}
    q3 = summary[summary["mode"] == "analyze_timing"].set_index("build")
    # two clock reads per InstrStopNode instead of one: Query-3 costs more than vanilla's,
    # both measured against vanilla's plain Query-1 (vs_ref_pct), so a disturbed plain
    # median of the patched build cannot flip the comparison
    assert (q3["ref_build"] == "vanilla").all(), summary.to_string()
    assert q3.loc[name, "vs_ref_pct"] > q3.loc["vanilla", "vs_ref_pct"], summary.to_string()
    assert q3.loc[name, "median_ms"] > q3.loc["vanilla", "median_ms"], summary.to_string()
    report = (run / "report.md").read_text()
    assert f"`{name}`" in report and "instrstop-double-clock" in report
    # the user's own `profkit build --list` (no PROFKIT_SPECS) shows no build a test defined
    import os

    user_env = {k: v for k, v in os.environ.items() if k != "PROFKIT_SPECS"}
    cp = subprocess.run([sys.executable, "-m", "profkit", "build", "--list"], capture_output=True,
                        text=True, timeout=120, env=user_env)
    assert cp.returncode == 0, cp.stderr
    assert "test-pk15" not in cp.stdout, cp.stdout
    assert "cached build" in cp.stdout and "of names not defined here" in cp.stdout, cp.stdout


def test_a_named_base_is_copied_not_referenced(tmp_path, unique_name):
    base = unique_name + "-base"
    try:
        one = tmp_path / "one.patch"
        one.write_text(PATCH.read_text())
        B.define_build(base, [one])
        two = tmp_path / "two.patch"
        two.write_text(PATCH.read_text().replace("second clock", "other clock"))
        spec = B.define_build(unique_name, [two], base=base)
        assert [Path(p).name for p in spec.patches] == ["one.patch", "two.patch"]
        assert all(str(B.specs_dir() / unique_name) in p for p in spec.patches)
        one.write_text(PATCH.read_text().replace("second clock", "third clock"))
        B.define_build(base, [one])  # redefining the base leaves this build as it was
        assert Path(spec.patches[0]).read_text() == PATCH.read_text()
    finally:
        import shutil

        (B.specs_dir() / f"{base}.json").unlink(missing_ok=True)
        shutil.rmtree(B.specs_dir() / base, ignore_errors=True)


# --------------------------------------------------------------------------- --source git:PATH

_GIT_ENV = {"GIT_AUTHOR_NAME": "profkit test", "GIT_AUTHOR_EMAIL": "test@profkit.invalid",
            "GIT_COMMITTER_NAME": "profkit test", "GIT_COMMITTER_EMAIL": "test@profkit.invalid",
            # fixed dates: the same tree is the same commit on every run, so the build's
            # cache key (which holds the commit) is too, and a rerun finds the build cached
            "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


def _git(d: Path, *args: str) -> str:
    import os

    cp = subprocess.run(["git", "-C", str(d), *args], capture_output=True, text=True,
                        timeout=300, env={**os.environ, **_GIT_ENV})
    assert cp.returncode == 0, cp.stderr
    return cp.stdout.strip()


def _commit_tree(d: Path, message: str) -> str:
    _git(d, "init", "-q", "-b", "master")
    _git(d, "add", "-A")
    _git(d, "commit", "-q", "-m", message)
    return _git(d, "rev-parse", "HEAD")


def test_git_source_is_identified_by_commit_and_content(tmp_path):
    """A checkout is its commit plus uncommitted changes: the same content at another path
    is the same source (one cache entry); an edit, committed or not, is another."""
    from profkit.pg.source import SourceError, get_source

    a = tmp_path / "a"
    (a / "src").mkdir(parents=True)
    (a / "configure").write_text("#!/bin/sh\nPACKAGE_VERSION='19devel'\n")
    (a / "src" / "x.c").write_text("int x;\n")
    head = _commit_tree(a, "one")
    s1 = get_source(f"git:{a}")
    assert (s1.kind, s1.version, s1.major) == ("git", "19devel", "19")
    assert head in s1.detail and s1.path == str(a.resolve())
    assert get_source(f"git:{a}").identity == s1.identity
    b = tmp_path / "b"
    _git(tmp_path, "clone", "-q", str(a), str(b))
    assert get_source(f"git:{b}").identity == s1.identity  # by content, not by path
    (a / "src" / "x.c").write_text("int x = 1;\n")  # uncommitted work counts
    s2 = get_source(f"git:{a}")
    assert s2.identity != s1.identity and s2.detail.startswith(_git(a, "describe", "--always",
                                                                    "--dirty"))
    (a / "src" / "new.c").write_text("int y;\n")  # so do untracked files
    assert get_source(f"git:{a}").identity not in (s1.identity, s2.identity)
    _git(a, "checkout", "-q", "--", ".")
    (a / "src" / "new.c").unlink()
    assert get_source(f"git:{a}").identity == s1.identity
    # not a checkout / configured in-tree: one line saying what to do
    with pytest.raises(SourceError, match="is not a git checkout"):
        get_source(f"git:{tmp_path}")
    (b / "GNUmakefile").write_text("")
    with pytest.raises(SourceError, match="run `make distclean` there first"):
        get_source(f"git:{b}")


@pytest.mark.pg
@pytest.mark.slow
@pytest.mark.builds("pg19/vanilla")  # its objects are this build's ccache hits
def test_build_from_a_git_checkout(tmp_path_factory):
    """`profkit build NAME --patch P --source git:CHECKOUT` on a checkout of PostgreSQL 19
    (the shared 19beta1 tarball committed to git; the patch made with `git diff` there, as
    a hacker does). Same objects as pg19/vanilla but instrument.c: ccache hits."""
    import os
    import shutil

    from conftest import PG19_TARBALL

    from profkit.pg.source import get_source

    d = tmp_path_factory.mktemp("pg-git") / "postgresql"
    # the tarball as profkit extracted it once (cheaper than decompressing it again)
    tree = get_source(f"tarball:{PG19_TARBALL}").path
    cp = subprocess.run(["cp", "-a", tree, str(d)], capture_output=True, text=True, timeout=600)
    assert cp.returncode == 0, cp.stderr
    head = _commit_tree(d, "postgresql-19beta1")
    c = d / "src" / "backend" / "executor" / "instrument.c"
    once = "\t\tINSTR_TIME_SET_CURRENT_FAST(endtime);\n"
    text = c.read_text()
    assert text.count(once) == 1
    c.write_text(text.replace(once, once + "\t\t/* profkit test: a second clock read per stop */\n"
                              + once))
    patch = d.parent / "double-clock-19.patch"
    patch.write_text(_git(d, "diff") + "\n")
    _git(d, "checkout", "-q", "--", ".")
    name = "test-pk15-git19"
    try:
        cp = _cli("build", name, "--patch", str(patch), "--source", f"git:{d}", timeout=3600)
        assert cp.returncode == 0, cp.stderr[-3000:]
        built = B.find_build(name)
        assert built is not None
        assert built.source["kind"] == "git" and head in built.source["detail"]
        assert built.version.endswith("19beta1"), built.version
        assert "a second clock read" in (built.src_tree / c.relative_to(d)).read_text()
        hits = (built.timings["ccache"]["direct_cache_hit"]
                + built.timings["ccache"]["preprocessed_cache_hit"])
        print(f"the build took {sum(v for k, v in built.timings.items() if k.endswith('_s')):.0f}"
              f" s when made: ccache hits {hits}, misses {built.timings['ccache']['cache_miss']}")
        assert hits > 10 * built.timings["ccache"]["cache_miss"]
        v = subprocess.run([str(built.postgres), "--version"], capture_output=True, text=True)
        assert v.stdout.strip() == "postgres (PostgreSQL) 19beta1"
        # cached by content: a clone of the checkout elsewhere finds the same build
        clone = d.parent / "clone"
        _git(d.parent, "clone", "-q", str(d), str(clone))
        again = B.find_build(B.resolve_spec(name), source=f"git:{clone}")
        assert again is not None and again.dir == built.dir
        assert os.path.samefile(again.postgres, built.postgres)
    finally:
        (B.specs_dir() / f"{name}.json").unlink(missing_ok=True)
        shutil.rmtree(B.specs_dir() / name, ignore_errors=True)
