"""Where outputs land (issue 14): under the current directory, PROFKIT_HOME, or the
clone when run inside it — never inside the installed package."""
from __future__ import annotations

from pathlib import Path

import pytest

from profkit import paths


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for v in ("PROFKIT_HOME", "PROFKIT_PROFILES", "PROFKIT_FLAMEGRAPHS"):
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def test_outputs_go_under_the_current_directory(no_env, tmp_path: Path) -> None:
    no_env.chdir(tmp_path)
    assert paths.profiles_dir() == tmp_path / "profiles"
    assert paths.flamegraphs_dir() == tmp_path / "flamegraphs"
    assert (tmp_path / "profiles").is_dir() and (tmp_path / "flamegraphs").is_dir()


def test_profkit_home_and_the_per_folder_variables_win(no_env, tmp_path: Path) -> None:
    no_env.chdir(tmp_path)
    no_env.setenv("PROFKIT_HOME", str(tmp_path / "home"))
    assert paths.profiles_dir() == tmp_path / "home" / "profiles"
    no_env.setenv("PROFKIT_FLAMEGRAPHS", str(tmp_path / "fg"))
    assert paths.flamegraphs_dir() == tmp_path / "fg"


def test_inside_the_clone_outputs_go_to_the_clones_folders(no_env) -> None:
    root = paths.clone_root()
    assert root == Path(__file__).resolve().parent.parent  # these tests run from a clone
    no_env.chdir(root / "notebooks")
    assert paths.home() == root  # a notebook's runs land in the clone's profiles/


def test_an_installed_copy_never_writes_into_site_packages(no_env, tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "profkit").mkdir(parents=True)
    no_env.setattr(paths, "PROJECT_ROOT", site)
    assert paths.clone_root() is None
    no_env.chdir(tmp_path)
    assert paths.home() == tmp_path
    no_env.chdir(site)  # even when run from there, it is just the current folder
    assert paths.home() == site


def test_unwritable_folder_is_a_clear_error(no_env, tmp_path: Path) -> None:
    from profkit.errors import ProfkitError

    no_env.setenv("PROFKIT_HOME", "/proc/profkit-cannot-be-here")
    with pytest.raises(ProfkitError, match="PROFKIT_HOME"):
        paths.profiles_dir()


def _attrs(p: Path) -> str:
    """The flags field lsattr (e2fsprogs) prints for the folder *p* itself ('' where its
    filesystem keeps no such flags: lsattr then fails)."""
    import subprocess

    cp = subprocess.run(["lsattr", "-d", str(p)], capture_output=True, text=True)
    return cp.stdout.split()[0] if cp.returncode == 0 and cp.stdout.strip() else ""


def test_the_cache_folders_that_churn_spread_their_subfolders(tmp_path, monkeypatch):
    """clusters/, tmp/ and builds/ carry ext2/3/4's "top directory" flag (chattr +T), so each
    new cluster or build tree lands on a block group of its own; the other folders do not.
    The oracle is e2fsprogs: chattr +T on a scratch folder says whether this filesystem
    keeps the flag at all, and lsattr reads it back."""
    import subprocess

    monkeypatch.setenv("PROFKIT_CACHE", str(tmp_path / "cache"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    keeps = (subprocess.run(["chattr", "+T", str(scratch)], capture_output=True).returncode == 0
             and "T" in _attrs(scratch))
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True,
                        text=True, check=True).stdout.strip()
    if fs.startswith("ext"):  # ext2/ext3 is how stat names ext4 too: it keeps the flag
        assert keeps, fs
    for name in sorted(paths.SPREAD):
        p = paths.sub(name)
        assert ("T" in _attrs(p)) == keeps, (name, _attrs(p))
        assert paths.topdir_flag(p) in ((True,) if keeps else (False, None)), name
    logs = paths.sub("logs")
    assert "T" not in _attrs(logs)
    assert paths.topdir_flag(logs) in (False, None)
    # asked again (a second process, say), the flag stays and nothing fails
    assert paths.spread_subfolders(paths.cache_dir() / "clusters") is keeps
