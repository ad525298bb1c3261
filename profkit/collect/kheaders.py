"""Make bcc work on a machine without kernel headers, and importable from a venv.

bcc compiles its BPF C text with clang against the running kernel's headers,
which it looks for in ``/lib/modules/$(uname -r)/build`` (or wherever
``BCC_KERNEL_SOURCE`` points).  A VM kernel often comes without them (this
machine: kernel 6.18, no /lib/modules at all).  The programs profkit loads
only use uprobes, ``bpf_probe_read_user`` and maps, so the headers of *any*
recent kernel of the same architecture compile them correctly.  We take the
newest ``linux-headers-<ver>-common`` + ``linux-headers-<ver>-<arch>`` pair
the machine's configured apt sources offer (``apt-get download``, never
``apt-get install``: the package depends on a kernel image and would pull a
systemd upgrade), unpack both with ``dpkg -x`` and merge them (the arch tree's
``include/``, ``arch/``, ``.config`` and ``Module.symvers`` over the common
tree: pointing bcc at the arch tree alone fails on ``kconfig.h``).  The tree
is cached under ``~/.cache/profkit/kheaders/<ver>-<arch>/``.

On a machine with real headers for ``uname -r`` (Ubuntu with
``linux-headers-$(uname -r)``) nothing is downloaded.

Debian's ``python3-bpfcc`` installs the ``bcc`` package into
``/usr/lib/python3/dist-packages``, which a venv does not see.  Putting all of
dist-packages on ``sys.path`` would shadow the venv's numpy/pandas with
Debian's older ones, so :func:`import_bcc` loads *only* the ``bcc`` package
from there (an explicit module spec for ``bcc`` whose submodule search path is
that one directory).
"""
from __future__ import annotations

import fcntl
import importlib.util
import os
import platform
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

from profkit import paths
from profkit.errors import ProbeError, ProfkitError
from profkit.processes import run, which

BCC_DIRS = (
    Path("/usr/lib/python3/dist-packages/bcc"),
    Path("/usr/lib/python3/site-packages/bcc"),
    Path("/usr/share/bcc/python/bcc"),
)
TRACEFS = Path("/sys/kernel/tracing")


class BccUnavailable(ProbeError):
    """bcc cannot be used here (not installed, or its programs do not compile)."""


# ---------------------------------------------------------------------------
# import bcc from the system's dist-packages without the rest of it


def import_bcc() -> ModuleType:
    """Import Debian's ``bcc`` package into this interpreter (venv or not).

    bcc's own source has an invalid escape sequence (``'\\.'`` in a regex, line 749 of
    Debian 12's bcc/__init__.py): compiling it warns (SyntaxWarning from Python 3.12,
    DeprecationWarning before), and under ``-W error`` or ``PYTHONWARNINGS=error`` the
    import failed. That warning is about bcc's code, not the caller's: it is silenced for
    the import only."""
    if "bcc" in sys.modules:
        return sys.modules["bcc"]
    with warnings.catch_warnings():
        for cat in (SyntaxWarning, DeprecationWarning):
            warnings.filterwarnings("ignore", message="invalid escape sequence", category=cat)
        return _import_bcc()


def _import_bcc() -> ModuleType:
    try:
        import bcc  # already importable (system python, or a .pth)
        return bcc
    except ImportError:
        pass
    for d in BCC_DIRS:
        init = d / "__init__.py"
        if init.exists():
            break
    else:
        raise BccUnavailable(
            "the bcc Python package is not installed: apt-get install python3-bpfcc bpfcc-tools "
            "(Debian/Ubuntu); profkit falls back to bpftrace")
    spec = importlib.util.spec_from_file_location("bcc", init,
                                                  submodule_search_locations=[str(d)])
    if spec is None or spec.loader is None:
        raise BccUnavailable(f"cannot load bcc from {d}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bcc"] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001 - libbcc.so missing, ctypes errors...
        sys.modules.pop("bcc", None)
        for k in [k for k in sys.modules if k.startswith("bcc.")]:
            sys.modules.pop(k, None)
        raise BccUnavailable(f"bcc from {d} failed to import: {e}; is libbpfcc installed?"
                             ) from None
    return mod


# ---------------------------------------------------------------------------
# tracefs


def tracefs_mounted(mounts: str | None = None) -> bool:
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return False
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "tracefs" and parts[1] in (
                str(TRACEFS), "/sys/kernel/debug/tracing"):
            return True
    return False


def ensure_tracefs() -> None:
    """Mount tracefs: without it detaching uprobes fails when bcc exits."""
    if tracefs_mounted():
        return
    if os.geteuid() != 0:
        raise ProbeError(f"tracefs is not mounted at {TRACEFS} and we are not root: "
                         f"run `sudo mount -t tracefs nodev {TRACEFS}`")
    run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], timeout=30, what="mount tracefs")


# ---------------------------------------------------------------------------
# kernel headers


def running_kernel_build_dir() -> Path:
    return Path("/lib/modules") / platform.release() / "build"


def deb_arch() -> str:
    try:
        return run(["dpkg", "--print-architecture"], timeout=30).stdout.strip()
    except ProfkitError:
        m = platform.machine()
        return {"x86_64": "amd64", "aarch64": "arm64"}.get(m, m)


def _vkey(v: str) -> tuple:
    # "6.12.117+deb12" > "6.1.0-57": compare number runs numerically
    return tuple(int(x) if x.isdigit() else x for x in re.findall(r"\d+|[a-z]+", v))


def pick_header_version(names: list[str], arch: str) -> str | None:
    """Newest <ver> with both linux-headers-<ver>-common and linux-headers-<ver>-<arch>.

    Input:  ``["linux-headers-6.1.0-57-common", "linux-headers-6.1.0-57-amd64",
    "linux-headers-6.12.117+deb12-amd64", "linux-headers-6.12.117+deb12-common"]``
    Output: ``"6.12.117+deb12"`` (rt/cloud flavours are ignored)
    """
    names_set = set(names)
    cands = []
    pat = re.compile(rf"^linux-headers-(.+)-{re.escape(arch)}$")
    for n in names:
        m = pat.match(n)
        if not m:
            continue
        ver = m.group(1)
        if ver.endswith(("-rt", "-cloud")) or "-rt-" in ver:
            continue
        if f"linux-headers-{ver}-common" in names_set:
            cands.append(ver)
    return max(cands, key=_vkey) if cands else None


def available_header_packages() -> list[str]:
    # apt-cache reads the machine's configured sources; we never name a host.
    cp = run([which("apt-cache"), "search", "--names-only", r"^linux-headers-"], timeout=120,
             what="apt-cache search")
    return [line.split(" ", 1)[0] for line in cp.stdout.splitlines() if line.strip()]


def _merge(common: Path, flavour: Path, dest: Path) -> None:
    shutil.copytree(common, dest, symlinks=True)
    for name in ("include", "arch"):
        src = flavour / name
        if src.exists():
            shutil.copytree(src, dest / name, symlinks=True, dirs_exist_ok=True)
    for name in (".config", "Module.symvers"):
        src = flavour / name
        if src.exists() or src.is_symlink():
            shutil.copy2(src, dest / name, follow_symlinks=True)


def _complete_tree(root: Path, arch: str, version: str | None) -> Path | None:
    """The cached tree of *version* (the newest one if None), if it is complete."""
    if version is not None:
        dest = root / f"{version}-{arch}"
        return dest if (dest / ".profkit-complete").exists() else None
    done = sorted((p for p in root.iterdir() if p.is_dir() and p.name.endswith(f"-{arch}")
                   and (p / ".profkit-complete").exists()), key=lambda p: _vkey(p.name))
    return done[-1] if done else None


def headers_tree(version: str | None = None) -> Path:
    """Cached merged header tree for *version* (newest available if None).

    One process downloads at a time, under a lock in the cache; the others wait and take
    its tree. A complete tree is never replaced: two probes on an empty cache once had
    the second remove the tree the first's bcc was compiling against."""
    arch = deb_arch()
    root = paths.sub("kheaders")
    tree = _complete_tree(root, arch, version)
    if tree is not None:
        return tree
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        tree = _complete_tree(root, arch, version)
        if tree is not None:
            return tree
        if version is None:
            version = pick_header_version(available_header_packages(), arch)
            if version is None:
                raise BccUnavailable(
                    "no linux-headers-<ver>-common/-" + arch + " pair in the configured apt "
                    "sources; install headers for the running kernel or use the bpftrace "
                    "fallback")
        return _download(root, arch, version)


def _download(root: Path, arch: str, version: str) -> Path:
    """Download, unpack and merge the header pair of *version* into the cache (the lock
    held: an incomplete tree left by a process that died is replaced)."""
    dest = root / f"{version}-{arch}"
    with tempfile.TemporaryDirectory(dir=root, prefix=".dl-") as tmp:
        t = Path(tmp)
        pkgs = [f"linux-headers-{version}-common", f"linux-headers-{version}-{arch}"]
        run([which("apt-get"), "download", *pkgs], cwd=t, timeout=600, what="apt-get download")
        x = t / "x"
        for deb in sorted(t.glob("*.deb")):
            run([which("dpkg"), "-x", deb, x], timeout=300, what="dpkg -x")
        src = x / "usr" / "src"
        common = src / f"linux-headers-{version}-common"
        flavour = src / f"linux-headers-{version}-{arch}"
        if not common.is_dir() or not flavour.is_dir():
            found = sorted(p.name for p in src.glob("*"))
            raise BccUnavailable(f"unexpected layout in the header packages: {found}")
        staging = t / "merged"
        _merge(common, flavour, staging)
        (staging / ".profkit-complete").write_text(" ".join(pkgs) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    return dest


def ensure_bcc_env() -> dict[str, str]:
    """Env vars bcc needs here ({} on a machine with real headers); mounts tracefs.

    The caller applies them to ``os.environ`` before compiling: libbcc reads
    ``BCC_KERNEL_SOURCE`` with getenv() in this process.
    """
    ensure_tracefs()
    if running_kernel_build_dir().exists():
        return {}
    given = os.environ.get("BCC_KERNEL_SOURCE")
    if given and (Path(given) / "include" / "linux" / "kconfig.h").exists():
        return {"BCC_KERNEL_SOURCE": given}
    tree = headers_tree()
    return {"BCC_KERNEL_SOURCE": str(tree)}
