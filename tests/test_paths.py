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
