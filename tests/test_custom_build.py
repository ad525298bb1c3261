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


# --------------------------------------------------------------------------- real builds


@pytest.mark.pg
def test_patch_that_does_not_apply_names_the_hunk(unique_name):
    cp = _cli("build", unique_name, "--patch", str(FIXTURES / "broken.patch"), timeout=1800)
    assert cp.returncode == 1, cp.stderr
    err = " ".join(cp.stderr.split())
    assert "broken.patch" in err and "src/backend/executor/execProcnode.c" in err
    assert "hunk #2" in err and "@@ -455,6 +456,7 @@" in err
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
    q3 = summary[summary["mode"] == "analyze_timing"].set_index("build")["overhead_pct"]
    # two clock reads per InstrStopNode instead of one: TIMING ON costs more than vanilla's
    assert q3[name] > q3["vanilla"], summary.to_string()
    report = (run / "report.md").read_text()
    assert f"`{name}`" in report and "instrstop-double-clock" in report


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
        one.write_text("changed\n")
        B.define_build(base, [one])  # redefining the base leaves this build as it was
        assert Path(spec.patches[0]).read_text() == PATCH.read_text()
    finally:
        import shutil

        (B.specs_dir() / f"{base}.json").unlink(missing_ok=True)
        shutil.rmtree(B.specs_dir() / base, ignore_errors=True)
