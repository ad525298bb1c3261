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
