"""Every external command profkit and its tests run is installed by the set-up.

A tool installed by hand on the development machine once made CI green there and red on
a fresh machine (shellcheck).  This test finds the commands the code runs — the first
element of an argv list literal passed as a call's first argument, and every
``which("X")`` — and checks that each is installed here and comes from a package that
``scripts/setup-system.sh`` installs, from the venv, or from Debian's essential base
system (which every Debian/Ubuntu machine has).
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "setup-system.sh"

# Packages of the base system every Debian 12 / Ubuntu 24.04 machine has (Priority:
# required/important, or pulled in by them): not listed in the set-up script.
BASE_PACKAGES = {
    "coreutils", "bash", "dash", "util-linux", "mount", "passwd", "procps", "dpkg", "apt",
    "findutils", "sed", "grep", "tar", "gzip", "hostname", "debianutils", "diffutils",
    "systemd", "login", "sysvinit-utils", "bsdutils", "libc-bin", "util-linux-extra",
}
# Packages setup-system.sh installs under another name than the command's package (a
# dependency of a listed one): command's package -> the listed package that brings it.
BROUGHT_BY = {
    "gcc-12": "build-essential", "gcc": "build-essential", "cpp-12": "build-essential",
    "make": "build-essential", "patch": "build-essential", "binutils-x86-64-linux-gnu": "binutils",
    "linux-perf": "linux-perf", "git": "git", "perl-base": "perl", "perl": "perl",
    "ruby3.1": "ruby", "chromium": "chromium", "valgrind": "valgrind",
    "bpftrace": "bpftrace", "postgresql-client-15": "postgresql", "clang-14": "clang",
    "lld-14": "lld", "xz-utils": "xz-utils", "bzip2": "bzip2",
}
# Words that look like argv[0] but are profkit's own subcommands or test data, never run
# as programs.
NOT_COMMANDS = {"ltrace-not-a-tool"}
# Another name of the same program, tried when the first is absent (Ubuntu's chromium).
ALTERNATIVE_OF = {"chromium-browser": "chromium"}
# The functions that start a program from an argv list (profkit.processes's and subprocess's).
RUNNERS = {"run", "Popen", "check_output", "check_call", "call", "_run", "in_tree", "Background",
           "spawn", "run_bg", "start"}


def _setup_packages() -> set[str]:
    text = SETUP.read_text()
    m = re.search(r"^pkgs=\((.*?)^\)", text, re.S | re.M)
    assert m, "setup-system.sh has no pkgs=( ... ) list"
    pkgs = set(m.group(1).split())
    pkgs |= set(re.findall(r"pkgs\+=\(([^)]*)\)", text)[0].split()) if "pkgs+=" in text else set()
    return {p for p in pkgs if re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", p)}


def _python_files() -> list[Path]:
    out: list[Path] = []
    for d in ("profkit", "tests", "benchmarks"):
        out += [p for p in (ROOT / d).rglob("*.py") if ".venv" not in p.parts]
    return out


def _word(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(
        r"[a-z][A-Za-z0-9_.+-]*", node.value
    ):
        return node.value
    return None


def commands_in_code() -> dict[str, str]:
    """command -> one place that runs it."""
    found: dict[str, str] = {}
    for path in _python_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                fname = node.func.attr if isinstance(node.func, ast.Attribute) else (
                    node.func.id if isinstance(node.func, ast.Name) else "")
                if fname == "which" and node.args:
                    w = _word(node.args[0])
                    if w:
                        found.setdefault(w, where)
                elif (fname in RUNNERS and node.args and isinstance(node.args[0], (ast.List, ast.Tuple))
                      and node.args[0].elts):
                    w = _word(node.args[0].elts[0])
                    if w:
                        found.setdefault(w, where)
            elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple)) \
                    and node.value.elts and any(
                        isinstance(t, ast.Name) and re.search(r"argv|cmd|command", t.id)
                        for t in node.targets):
                w = _word(node.value.elts[0])
                if w:
                    found.setdefault(w, where)
            elif isinstance(node, ast.FunctionDef) and "which" in ast.dump(node):
                # def gprof_path(gprof: str = "gprof"): ... which(gprof)
                for d in node.args.defaults + node.args.kw_defaults:
                    w = _word(d) if d is not None else None
                    if w and re.search(rf"which\(\s*{re.escape(w)}\b", ast.unparse(node)):
                        found.setdefault(w, where)
                for a, d in zip(node.args.args[-len(node.args.defaults):] if node.args.defaults else [],
                                node.args.defaults, strict=True):
                    w = _word(d)
                    if w and re.search(rf"which\(\s*{a.arg}\b", ast.unparse(node)):
                        found.setdefault(w, where)
            elif isinstance(node, ast.For) and isinstance(node.iter, (ast.Tuple, ast.List)):
                # for tool in ("make", "patch", ...): which(tool)
                body = ast.dump(ast.Module(body=node.body, type_ignores=[]))
                if "which" in body:
                    for e in node.iter.elts:
                        w = _word(e)
                        if w:
                            found.setdefault(w, where)
    return {k: v for k, v in found.items() if k not in NOT_COMMANDS}


def _candidates(exe: str) -> list[str]:
    real = str(Path(exe).resolve())
    out = [exe, real]
    for a, b in (("/usr/bin/", "/bin/"), ("/usr/sbin/", "/sbin/")):
        out += [exe.replace(a, b), real.replace(a, b)]
    return list(dict.fromkeys(out))


def packages_of(exes: list[str]) -> dict[str, str]:
    """path -> package, with one ``dpkg -S`` for all (it takes a second per call)."""
    cands = sorted({c for e in exes for c in _candidates(e)})
    cp = subprocess.run(["dpkg", "-S", *cands], capture_output=True, text=True)
    owner: dict[str, str] = {}
    for line in cp.stdout.splitlines():
        if line.startswith("diversion by") or ": " not in line:
            continue
        pkgs, path = line.split(": ", 1)
        owner[path.strip()] = pkgs.split(",")[0].split(":")[0].strip()
    return {e: next((owner[c] for c in _candidates(e) if c in owner), "") for e in exes}


def test_finder_sees_the_known_commands():
    cmds = commands_in_code()
    # a few the code certainly runs: if the finder misses these, it misses others too
    for c in ("perf", "valgrind", "gprof", "ltrace", "bpftrace", "make", "gcc", "shellcheck",
              "chromium", "git"):
        assert c in cmds, f"{c} not found in the code by the finder"


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="needs a Debian-family system")
def test_every_command_is_installed_by_the_setup():
    pkgs = _setup_packages()
    assert {"shellcheck", "valgrind", "ltrace", "bpftrace"} <= pkgs
    venv_bin = Path(sys.executable).parent
    problems: list[str] = []
    to_check: dict[str, tuple[str, str]] = {}
    for cmd, where in sorted(commands_in_code().items()):
        if (venv_bin / cmd).exists() or (cmd in ALTERNATIVE_OF and shutil.which(ALTERNATIVE_OF[cmd])):
            continue
        exe = shutil.which(cmd)
        if exe is None:
            problems.append(f"{cmd} (run in {where}) is not installed: add its package to "
                            f"scripts/setup-system.sh")
        elif not exe.startswith(str(ROOT)):
            to_check[exe] = (cmd, where)
    owners = packages_of(list(to_check))
    for exe, (cmd, where) in to_check.items():
        pkg = owners[exe]
        if not pkg:
            problems.append(f"{cmd} ({exe}, run in {where}) belongs to no package: install it "
                            f"from a package listed in scripts/setup-system.sh")
        elif not (pkg in pkgs or pkg in BASE_PACKAGES or BROUGHT_BY.get(pkg) in pkgs):
            problems.append(f"{cmd} ({exe}, package {pkg}, run in {where}) is not installed by "
                            f"scripts/setup-system.sh: add {pkg} there")
    assert not problems, "\n".join(problems)


def test_the_venv_carries_the_bytecode_of_what_it_installed():
    """make's venv step leaves pip to byte-compile what it installs: with
    PYTHONDONTWRITEBYTECODE set, a venv without bytecode would compile pandas & co. from
    source in every process the suite starts (docs/testing.md).  Checked on every module
    of two packages, most of which no test imports."""
    import importlib.util

    import matplotlib
    import pandas

    for pkg in (pandas, matplotlib):
        sources = list(Path(pkg.__file__).parent.rglob("*.py"))
        assert len(sources) > 100, (pkg.__name__, len(sources))
        missing = [p for p in sources if not Path(importlib.util.cache_from_source(p)).exists()]
        assert not missing, (f"{len(missing)} of {len(sources)} modules of {pkg.__name__} "
                             f"have no bytecode, e.g. {missing[:3]}")
