"""A cluster is a copy of its build's initdb template: made once per build, on first use,
and the same files initdb makes."""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from profkit import paths
from profkit.pg import cluster as C
from profkit.pg.cluster import Cluster

pytestmark = [pytest.mark.pg, pytest.mark.builds("vanilla")]


@pytest.fixture
def scratch():
    """A directory in profkit's cache (which postgres's unprivileged user can reach when
    we are root, unlike pytest's tmp_path), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="test-template-", dir=paths.sub("scratch")))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _fresh_build(vanilla_build, scratch: Path):
    """vanilla in a directory of its own (its install linked in), with no template yet."""
    (scratch / "install").symlink_to(vanilla_build.dir / "install")
    return dataclasses.replace(vanilla_build, dir=scratch)


def _files(datadir: Path) -> set[str]:
    """The catalog's files: every relation initdb wrote, by path."""
    return {str(p.relative_to(datadir)) for sub in ("base", "global")
            for p in (datadir / sub).rglob("*") if p.is_file()}


def test_template_made_once_and_each_cluster_is_its_own_copy(vanilla_build, scratch):
    b = _fresh_build(vanilla_build, scratch)
    template = b.dir / C.TEMPLATE_NAME / "data"
    with Cluster(b, name="tpl-a") as a:
        assert (template / "PG_VERSION").is_file()
        made = (template / "PG_VERSION").stat().st_ino
        with Cluster(b, name="tpl-b") as bb, a.connect() as ca, bb.connect() as cb:
            assert (template / "PG_VERSION").stat().st_ino == made  # not made again
            assert a.datadir != bb.datadir and a.port != bb.port
            ca.execute("CREATE TABLE only_in_a (i int)")
            assert cb.execute("SELECT to_regclass('only_in_a')").fetchone()[0] is None
            # the cluster's own settings went into its copy, not the template
            for conn, cl in ((ca, a), (cb, bb)):
                assert conn.execute("SHOW port").fetchone()[0] == str(cl.port)
                assert conn.execute("SHOW shared_buffers").fetchone()[0] == "256MB"
                assert conn.execute("SHOW unix_socket_directories").fetchone()[0] == \
                    str(cl.socket_dir)
    conf = (template / "postgresql.conf").read_text()
    assert "profkit benchmark settings" not in conf
    assert not [ln for ln in conf.splitlines() if ln.startswith(("port", "unix_socket"))]
    assert not list(b.dir.glob(".cluster-template-*"))  # no half-made one left


def test_template_holds_what_initdb_makes(vanilla_build, scratch):
    b = _fresh_build(vanilla_build, scratch)
    with Cluster(b, name="tpl-copy") as copied, \
            Cluster(b, name="tpl-initdb", from_template=False) as made:
        assert _files(copied.datadir) == _files(made.datadir)
        assert len(_files(made.datadir)) > 500
        q = "SELECT count(*) FROM pg_class"
        with copied.connect() as c1, made.connect() as c2:
            assert c1.execute(q).fetchone()[0] == c2.execute(q).fetchone()[0]
            assert c1.execute("SHOW server_encoding").fetchone()[0] == "UTF8"
            assert c1.execute("SELECT datcollate FROM pg_database WHERE datname = "
                              "current_database()").fetchone()[0] == "C"


def test_first_use_from_two_threads_makes_one_template(vanilla_build, scratch):
    b = _fresh_build(vanilla_build, scratch)
    errors: list[BaseException] = []
    ports: list[int] = []

    def start(name: str) -> None:
        try:
            with Cluster(b, name=name) as cl, cl.connect() as conn:
                ports.append(int(conn.execute("SHOW port").fetchone()[0]))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=start, args=(f"tpl-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(set(ports)) == 2
    assert [p.name for p in b.dir.iterdir() if "template" in p.name] == [C.TEMPLATE_NAME]


def test_build_directory_that_cannot_hold_a_template_runs_initdb(vanilla_build, scratch,
                                                                 monkeypatch):
    # root writes through any mode bits, so the refusal is simulated: mkdtemp in the
    # build's directory fails as it does for a user on a read-only or foreign cache
    b = _fresh_build(vanilla_build, scratch)
    real = tempfile.mkdtemp

    def refuse(*args, **kwargs):
        if kwargs.get("prefix", "").startswith(".cluster-template-"):
            raise PermissionError(13, "Permission denied")
        return real(*args, **kwargs)

    monkeypatch.setattr(C.tempfile, "mkdtemp", refuse)
    with Cluster(b, name="tpl-ro") as cl, cl.connect() as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1
        assert len(_files(cl.datadir)) > 500
    assert not (b.dir / C.TEMPLATE_NAME).exists()
