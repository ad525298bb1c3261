"""Two processes resolving the Debian source into one empty cache at once (two xdist
workers on a fresh machine did): both get it, and the private apt state stays usable."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.source


def test_two_processes_on_an_empty_cache_both_get_the_source(tmp_path):
    code = "from profkit.pg.source import debian_source; print(debian_source().version)"
    env = {**os.environ, "PROFKIT_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    versions = {out.strip() for out, _ in outs}
    assert len(versions) == 1 and versions.pop().startswith("18.")
    apt = tmp_path / "cache" / "apt"
    assert list((apt / "lists").glob("*_Sources*")) and (apt / "updated").is_file()
    assert (apt / "sources.list.d" / "profkit-src.sources").is_file()
    # the newest version is kept beside the index: while the index files are unchanged, a
    # build's name resolves without apt-cache (here: a PATH where no program is found)
    import json

    memo = json.loads((apt / "versions.json").read_text())
    got = outs[0][0].strip()
    deb = memo["versions"]["postgresql-18"]  # the Debian version: 18.6-3 for 18.6
    assert list(memo["versions"]) == ["postgresql-18"] and \
        deb.split(":")[-1].startswith(got + "-"), memo
    no_tools = {**env, "PATH": str(tmp_path / "nobin")}
    (tmp_path / "nobin").mkdir()
    cp = subprocess.run([sys.executable, "-c", code], env=no_tools, text=True,
                        capture_output=True, timeout=120)
    assert cp.returncode == 0 and cp.stdout.strip() == got, cp.stderr[-2000:]
    # an index file changed (apt-get update wrote it again): apt-cache is asked again
    lists = sorted((apt / "lists").glob("*_Sources*"))
    os.utime(lists[0], ns=(lists[0].stat().st_atime_ns, lists[0].stat().st_mtime_ns + 10**9))
    cp = subprocess.run([sys.executable, "-c", code], env=no_tools, text=True,
                        capture_output=True, timeout=120)
    assert cp.returncode != 0 and "apt-cache" in cp.stderr, cp.stderr[-2000:]
    cp = subprocess.run([sys.executable, "-c", code], env=env, text=True,
                        capture_output=True, timeout=120)
    assert cp.returncode == 0 and cp.stdout.strip() == got, cp.stderr[-2000:]
    again = json.loads((apt / "versions.json").read_text())
    assert again["versions"] == {"postgresql-18": deb} and again["lists"] != memo["lists"]
