"""The wheel is the product: ``pip wheel`` of the clone, checked against what the code
loads, installed into a fresh venv outside the clone; then profkit runs from an empty
folder — its files land in that folder, never in site-packages —, the command line works
without the jupyter extra (IPython is not imported by it), every build preset of both
PostgreSQL majors resolves and its patches apply (``profkit build --check``: no compiling),
and ``profkit record-script`` writes the capture script."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "profkit"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    build_log: str
    venv: Path
    site: Path
    tmp: Path

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def profkit(self) -> str:
        return str(self.venv / "bin" / "profkit")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("install")
    # from a copy of the source: pip builds in the tree it is given (build/, *.egg-info),
    # and a stale build/lib in the clone could slip old modules into the wheel
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "profiles", "flamegraphs", ".hypothesis",
        "*_cache", "__pycache__", "gmon.out", "*.so"))
    wheels = tmp / "wheels"
    # -v: the build backend's warnings are part of the output (a deprecation shows there)
    cp = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w",
                         str(wheels), str(src)], capture_output=True, text=True, timeout=1200)
    assert cp.returncode == 0, cp.stderr[-3000:]
    (wheel,) = wheels.glob("profkit-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    # --no-compile: this venv lives for one module; pip's byte-compiling of pandas & co.
    # (~10 CPU-s: benchmarks/results/venv_setup-20261205.txt) would outweigh compiling
    # the few modules its commands import
    inst = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-compile", str(wheel)],
                          capture_output=True, text=True, timeout=1200)
    assert inst.returncode == 0, inst.stderr[-3000:]
    site = Path(subprocess.run([str(py), "-c", "import profkit, os; print(os.path.dirname("
                                "os.path.dirname(profkit.__file__)))"], capture_output=True,
                               text=True, check=True, timeout=60, cwd=tmp).stdout.strip())
    return Installed(wheel, cp.stdout + cp.stderr, venv, site, tmp)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("PROFKIT_PROFILES", "PROFKIT_FLAMEGRAPHS", "PROFKIT_HOME")}


@pytest.mark.slow
def test_pip_install_outside_the_clone(installed: Installed) -> None:
    site, py = installed.site, installed.python
    assert site.name == "site-packages" and ROOT not in site.parents
    # the extras stay out of a plain install, and the command line does not need them
    for mod in ("IPython", "gprof2dot", "hypothesis"):
        found = subprocess.run([py, "-c", f"import {mod}"], capture_output=True,
                               timeout=60, cwd=installed.tmp).returncode == 0
        assert not found, f"{mod} is installed by a plain `pip install .`"
    cp = subprocess.run([py, "-c", "import sys, profkit.cli; "
                         "print('IPython' in sys.modules)"], capture_output=True, text=True,
                        timeout=60, check=True, cwd=installed.tmp)
    assert cp.stdout.strip() == "False"

    work = installed.tmp / "empty"
    work.mkdir()
    folded = work / "some.folded"
    folded.write_text((ROOT / "tests/fixtures/perf/expected_clockloop.folded").read_text())
    cp = subprocess.run([installed.profkit, "flamegraph", "some.folded"], cwd=work, env=_env(),
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    assert (work / "flamegraphs" / "some.svg").exists()
    assert not (site / "flamegraphs").exists() and not (site / "profiles").exists()
    cp = subprocess.run([installed.profkit, "--version"], capture_output=True, text=True,
                        timeout=60)
    assert cp.stdout.startswith("profkit ")


# ------------------------------------------------------------ what the code loads


def loaded_files() -> dict[str, str]:
    """Package-relative path -> why the code needs it, derived from the code and the
    package tree (a file the code starts loading that the wheel lacks fails the test)."""
    from profkit import patches, paths
    from profkit.collect import clock, vcpu
    from profkit.pg import workloads

    need: dict[str, str] = {}

    def add(p: Path, why: str) -> None:
        need[p.resolve().relative_to(PKG.parent).as_posix()] = why

    for major in patches.versions():
        for preset, names in patches.PRESETS.items():
            for n in names:
                if patches.has_patch(n, major):
                    add(patches.patch_file(n, major), f"preset {preset} of PostgreSQL {major}")
        for f in patches.patch_dir(major).iterdir():     # notes and patches no preset names
            if f.is_file():
                add(f, f"patches/pg{major}/")
    for f in workloads.WORKLOAD_DIR.glob("*.toml"):
        add(f, "a seed workload")
    for mod in (clock, vcpu):
        add(mod.HELPER_SRC, f"the C helper {mod.__name__} compiles on first use")
    for f in (PKG / "collect").glob("*.c"):
        add(f, "a C helper")
    add(paths.RECORD_SCRIPT, "profkit record-script")
    return need


def test_loaded_files_cover_the_package_data_the_tree_has() -> None:
    """Every file of the package tree that is not Python source is in loaded_files(),
    except the folding core's C source (compiled into profkit._fold at install)."""
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "profkit"],
                             capture_output=True, text=True, check=True).stdout.split()
    data = {t for t in tracked if not t.endswith(".py") and t != "profkit/_fold.c"}
    assert data, "git ls-files found nothing"
    assert data <= set(loaded_files()), sorted(data - set(loaded_files()))
    need = loaded_files()
    assert "profkit/scripts/pk-record.sh" in need
    assert {"profkit/patches/pg19/step5.patch", "profkit/patches/pg18/step5.patch"} <= set(need)


@pytest.mark.slow
def test_the_wheel_holds_what_the_code_loads(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as zf:
        names = set(zf.namelist())
        mode = zf.getinfo("profkit/scripts/pk-record.sh").external_attr >> 16
        for rel in loaded_files():
            assert zf.read(rel) == (PKG.parent / rel).read_bytes(), rel
    missing = {p: why for p, why in loaded_files().items() if p not in names}
    assert not missing, f"the wheel lacks what the code loads: {missing}"
    assert any(re.fullmatch(r"profkit/_fold\.cpython-.*\.so", n) for n in names)
    assert mode & 0o777 == 0o755
    # setuptools' deprecation of the `project.license` table (or any other) is gone
    for word in ("BuildBackendWarning", "SetuptoolsDeprecationWarning", "is deprecated"):
        assert word not in installed.build_log, installed.build_log[-3000:]


def _library_presets(py: str, cwd: Path) -> list[str]:
    """The presets the installed profkit knows, without the user's named builds (those
    live in the shared cache and are not the package's)."""
    code = ("from profkit.pg.build import custom_specs, presets\n"
            "mine = set(custom_specs())\n"
            "print('\\n'.join(n for n in presets() if n.split('/')[-1].removesuffix('+gprof') "
            "not in mine))")
    return subprocess.run([py, "-c", code], capture_output=True, text=True, check=True,
                          timeout=120, cwd=cwd).stdout.split()


def _cached_pg18_source() -> bool:
    """Is Debian's postgresql-18 source (profkit's default) already in the cache? Sources
    are cached as <cache>/sources/debian-<package>_<version>.json, naming the unpacked tree
    (profkit.pg.source.debian_source)."""
    import json

    from profkit import paths

    for meta in paths.sub("sources").glob("debian-postgresql-18_*.json"):
        try:
            if Path(json.loads(meta.read_text())["path"]).is_dir():
                return True
        except (OSError, ValueError, KeyError):
            continue
    return False


@pytest.mark.slow
@pytest.mark.source
@pytest.mark.builds("pg19/step5")
def test_installed_profkit_resolves_every_preset_and_writes_the_capture_script(
        installed: Installed) -> None:
    from profkit.pg.build import custom_specs, presets

    pg19 = os.environ.get("PROFKIT_PG19_SOURCE", "")
    assert pg19.startswith("tarball:") and Path(pg19[8:]).is_file(), \
        "PROFKIT_PG19_SOURCE must name the shared 19beta1 tarball (tests/conftest.py sets it)"
    work = installed.tmp / "empty-build"
    work.mkdir()
    names = _library_presets(installed.python, work)
    mine = set(custom_specs())
    # the installed package knows every preset the clone does: pg19/... ones exist only
    # when the pg19 patches are there
    assert set(names) == {n for n in presets()
                          if n.split("/")[-1].removesuffix("+gprof") not in mine}
    pg19_names = [n for n in names if n.startswith("pg19/")]
    assert {"pg19/vanilla", "pg19/step5", "pg19/fast_timing"} <= set(pg19_names)
    # PostgreSQL 18's presets are checked against profkit's default source when it is
    # cached here already (Debian's postgresql-18); otherwise only the PostgreSQL 19 ones
    # are: fetching the 18 source is not this test's business
    checked = pg19_names + ([n for n in names if "/" not in n] if _cached_pg18_source() else [])
    cp = subprocess.run([installed.profkit, "build", "--check", *checked], cwd=work, env=_env(),
                        capture_output=True, text=True, timeout=1800)
    assert cp.returncode == 0, (cp.stdout[-3000:], cp.stderr[-2000:])
    lines = {ln.split("\t")[0]: ln.split("\t") for ln in cp.stdout.splitlines()}
    assert set(lines) == set(checked)
    for name in checked:
        row = lines[name]
        assert row[1] == "19beta1" if name.startswith("pg19/") else row[1].startswith("18."), row
        want = presets()[name].patches
        if want:
            applied = row[2].split("(")[1].split(";")[0].split(", ")
            assert applied == list(want), row
        else:
            assert row[2] == "no patches", row
        if name.startswith("pg19/"):
            assert row[3] == pg19, row
    assert not list(work.iterdir()), "a dry run leaves nothing in the current folder"

    # a pip-installed profkit finds the pg19/step5 the clone built (the mark above: the
    # suite builds it first) in the cache: the same patch bytes give the same key
    cp = subprocess.run([installed.profkit, "build", "pg19/step5"], cwd=work, env=_env(),
                        capture_output=True, text=True, timeout=3600)
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert "pg19/step5: cached (pg19_step5-" in cp.stderr, cp.stderr[-3000:]
    name, version, prefix = cp.stdout.strip().split("\t")
    assert (name, version) == ("pg19/step5", "PostgreSQL 19beta1")
    assert Path(prefix, "bin", "postgres").exists()

    cp = subprocess.run([installed.profkit, "record-script", "-o", "pk-record.sh"], cwd=work,
                        env=_env(), capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    out = work / "pk-record.sh"
    assert out.read_bytes() == (PKG / "scripts" / "pk-record.sh").read_bytes()
    assert out.stat().st_mode & 0o777 == 0o755
    cp = subprocess.run(["sh", str(out), "--help"], capture_output=True, text=True, timeout=60)
    assert cp.returncode == 2 and "--query-file FILE.sql" in cp.stderr
