"""PostgreSQL's own regression suite (``make check``) on a build.

``make check`` makes a temporary install inside the build tree and starts its
own server there, so as root the build tree is handed to the unprivileged OS
user first (postgres refuses root).  A cached build holds only what profkit runs,
so the rest of the tree (regression programs, the other client programs that the
temporary install needs) is made first, as root with the build's ccache; the code
already compiled is not compiled again.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from profkit.errors import CommandFailed, ProfkitError
from profkit.pg.build import Build, ccache_env, link_make_vars
from profkit.pg.cluster import ensure_os_user
from profkit.processes import run


@dataclass(frozen=True)
class RegressResult:
    build: str
    passed: bool
    tests: int
    failed: int
    seconds: float
    log: str
    diffs: str | None


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chown(dirpath, uid, gid)
        for n in filenames:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                os.chown(p, uid, gid)


def regress(build: Build, *, timeout: float = 3600) -> RegressResult:
    user = ensure_os_user()
    tree = build.build_tree
    if not (tree / "GNUmakefile").exists():
        raise ProfkitError(f"build {build.name} has no build tree at {tree}; rebuild it")
    # A build makes only what profkit runs (build.BUILD_DIRS); make check's temporary
    # install needs the whole tree: make the rest first, with the build's ccache.
    make_log = build.dir / "regress-make.log"
    try:
        # a layout build links with its seed given to make (build.link_make_vars)
        run(["make", f"-j{os.cpu_count() or 2}", "-s",
             *link_make_vars(build.spec.get("ldflags") or "")], cwd=tree, timeout=3 * 3600,
            stdout_path=make_log, merge_stderr=True,
            env={**ccache_env(), "LC_ALL": "C"}, what=f"make ({build.name}, for make check)")
    except CommandFailed as e:
        raise ProfkitError(f"making the rest of {build.name}'s tree for make check failed "
                           f"(log: {make_log}):\n{e.output_tail}") from None
    if os.geteuid() == 0:
        _chown_tree(tree, user.uid, user.gid)
    log = build.dir / "regress.log"
    log.unlink(missing_ok=True)
    if os.geteuid() == 0:
        log.touch()
        os.chown(log, user.uid, user.gid)
    t0 = time.monotonic()
    try:
        run(["make", "-s", "check"], cwd=tree, user=user, timeout=timeout, stdout_path=log,
            merge_stderr=True, env={"CCACHE_DISABLE": "1", "LC_ALL": "C"},
            what=f"make check ({build.name})")
        ok = True
    except CommandFailed:
        ok = False
    secs = time.monotonic() - t0
    text = log.read_text(errors="replace")
    m = re.search(r"All (\d+) tests passed", text)
    tests = int(m.group(1)) if m else 0
    failed = 0
    m = re.search(r"(\d+) of (\d+) tests failed", text)
    if m:
        failed, tests = int(m.group(1)), int(m.group(2))
        ok = False
    diffs_src = tree / "src" / "test" / "regress" / "regression.diffs"
    diffs = None
    if diffs_src.exists() and diffs_src.stat().st_size > 0:
        diffs = str(build.dir / "regression.diffs")
        shutil.copy(diffs_src, diffs)
    return RegressResult(build.name, ok and tests > 0, tests, failed, secs, str(log), diffs)
