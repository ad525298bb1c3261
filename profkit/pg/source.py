"""PostgreSQL source trees: Debian source package (default), git checkout, tarball.

A source is named by a spec string:

- ``debian:postgresql-18`` (default) — the newest ``postgresql-18`` source
  package of Debian's ``sid`` suite.  ``debian:postgresql-19`` is derived the
  same way from the ``experimental`` suite, where Debian carries the next major
  version before its release (:data:`DEBIAN_SUITES`).  The archive URI is read from the
  machine's own apt configuration; a deb-src entry for it lives in a private
  apt directory under the cache, so the machine's binary package sources are
  untouched.  The pristine ``.orig.tar.*`` is used (its sha256 is checked
  against the ``.dsc``), not the Debian-patched tree.
- ``git:/path/to/postgresql`` — a local checkout as a hacker on master has it
  (committed state plus uncommitted changes).
- ``tarball:/path/to/postgresql-18.6.tar.bz2`` — a release tarball (or a
  ``git archive`` of upstream, which lacks the generated files: bison and flex
  make them).  A relative path is taken from the current directory, else from
  the project root.

Every source knows its major version (:attr:`Source.major`: 18, 19, ...), which
selects the patch library's ``patches/pg<major>/`` folder.  The default source
of a major version is :func:`default_source_for_major`:
``$PROFKIT_PG<major>_SOURCE``, else ``debian:postgresql-<major>``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from profkit import paths
from profkit.errors import CommandFailed, ProfkitError
from profkit.processes import run

DEFAULT_SOURCE = "debian:postgresql-18"
# Debian carries a PostgreSQL major version in sid once it is released, and the
# next one (beta) in experimental; packages not listed here come from sid.
DEBIAN_SUITES = {"postgresql-19": "experimental"}
APT_LISTS_MAX_AGE_S = 24 * 3600


class SourceError(ProfkitError):
    pass


@dataclass(frozen=True)
class Source:
    kind: str  # debian | git | tarball
    spec: str
    version: str  # upstream PostgreSQL version, e.g. "18.6"
    detail: str  # debian package version, git describe, tarball name
    identity: str  # content hash that keys the build cache
    path: str  # pristine source tree

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def major(self) -> str:
        """The major version: '18' for 18.6, '19' for 19beta1 or 19devel."""
        return major_version(self.version)


def major_version(version: str) -> str:
    """'18.6' -> '18', '19beta1' -> '19', '19devel' -> '19', '9.6.24' -> '9.6'."""
    m = re.match(r"^(\d+)(?:\.(\d+))?", version or "")
    if not m:
        raise SourceError(f"cannot tell the PostgreSQL major version from {version!r}")
    if int(m.group(1)) < 10 and m.group(2) is not None:  # 9.6 and older: two-part majors
        return f"{m.group(1)}.{m.group(2)}"
    return m.group(1)


def default_source_for_major(major: str) -> str:
    """The source spec used for ``pg<major>/...`` builds: ``$PROFKIT_PG<major>_SOURCE``,
    else ``debian:postgresql-<major>``."""
    if not re.fullmatch(r"\d+", major):
        raise SourceError(f"bad PostgreSQL major version {major!r}: use e.g. 18 or 19")
    return os.environ.get(f"PROFKIT_PG{major}_SOURCE") or f"debian:postgresql-{major}"


def get_source(spec: str | None = None, *, refresh: bool = False) -> Source:
    spec = spec or os.environ.get("PROFKIT_SOURCE") or DEFAULT_SOURCE
    kind, sep, arg = spec.partition(":")
    if not sep:
        # a bare path is accepted for convenience
        p = Path(spec)
        if p.is_dir():
            kind, arg = "git", spec
        elif p.is_file():
            kind, arg = "tarball", spec
    if kind == "debian":
        return debian_source(arg or "postgresql-18", refresh=refresh)
    if kind == "git":
        return git_source(Path(arg))
    if kind == "tarball":
        return tarball_source(_project_relative(arg))
    raise SourceError(
        f"unknown PostgreSQL source {spec!r}: use 'debian:postgresql-18', "
        "'git:/path/to/checkout' or 'tarball:/path/to/postgresql-X.Y.tar.bz2'"
    )


def _project_relative(arg: str) -> Path:
    """A path as given (relative to the current directory) if it exists, else relative to the
    project root (``tarball:../shared/...`` names the same file from any directory)."""
    p = Path(arg).expanduser()
    if p.is_absolute() or p.exists():
        return p
    alt = paths.PROJECT_ROOT / p
    return alt if alt.exists() else p


# ---------------------------------------------------------------------------
# Debian source package


def _read_os_release() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            k, _, v = line.partition("=")
            out[k] = v.strip('"')
    except OSError:
        pass
    return out


def _deb822_stanzas(text: str) -> list[dict[str, str]]:
    stanzas, cur = [], {}
    key = None
    for line in text.splitlines():
        if not line.strip():
            if cur:
                stanzas.append(cur)
            cur, key = {}, None
            continue
        if line.startswith("#"):
            continue
        if line[0].isspace() and key:
            cur[key] += " " + line.strip()
            continue
        k, _, v = line.partition(":")
        key = k.strip()
        cur[key] = v.strip()
    if cur:
        stanzas.append(cur)
    return stanzas


def archive_entry(etc_apt: Path = Path("/etc/apt")) -> tuple[str, str]:
    """(URI, Signed-By keyring) of the distribution's main archive, from apt's config.

    Security and updates suites are skipped; the first plain suite's URI wins.
    """
    candidates: list[tuple[str, str]] = []
    for f in sorted((etc_apt / "sources.list.d").glob("*.sources")):
        for st in _deb822_stanzas(f.read_text(errors="replace")):
            if st.get("Enabled", "yes").lower() == "no":
                continue
            suites = st.get("Suites", "").split()
            if not suites or all("-" in s for s in suites):
                continue
            for uri in st.get("URIs", "").split():
                if "security" in uri:
                    continue
                candidates.append((uri, st.get("Signed-By", "")))
    one_line = [etc_apt / "sources.list", *sorted((etc_apt / "sources.list.d").glob("*.list"))]
    for f in one_line:
        if not f.is_file():
            continue
        for line in f.read_text(errors="replace").splitlines():
            m = re.match(r"^\s*deb(?:-src)?\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
            if m and "security" not in m.group(2) and "-" not in m.group(3):
                signed = ""
                if m.group(1):
                    sm = re.search(r"signed-by=(\S+?)[\s\]]", m.group(1))
                    signed = sm.group(1) if sm else ""
                candidates.append((m.group(2), signed))
    osr = _read_os_release()
    distro = osr.get("ID", "debian")
    for uri, signed in candidates:
        if distro in uri or "debian" in uri or "ubuntu" in uri:
            return uri, signed
    if candidates:
        return candidates[0]
    raise SourceError(
        "could not find the distribution archive in /etc/apt (sources.list or "
        "sources.list.d/*.sources); configure apt, or use a tarball/git source"
    )


class _PrivateApt:
    """apt-get/apt-cache with a private deb-src list and state directory."""

    def __init__(self, root: Path, uri: str, suite: str, keyring: str) -> None:
        self.root = root
        (root / "sources.list.d").mkdir(parents=True, exist_ok=True)
        (root / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (root / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (root / "empty.list").touch()
        entry = f"Types: deb-src\nURIs: {uri}\nSuites: {suite}\nComponents: main\n"
        if keyring:
            entry += f"Signed-By: {keyring}\n"
        f = root / "sources.list.d" / "profkit-src.sources"
        if not f.exists() or f.read_text() != entry:
            f.write_text(entry)
            for old in (root / "lists").glob("*_Sources*"):
                old.unlink()
        self.opts = [
            "-o",
            f"Dir::Etc::SourceList={root / 'empty.list'}",
            "-o",
            f"Dir::Etc::SourceParts={root / 'sources.list.d'}",
            "-o",
            f"Dir::State::Lists={root / 'lists'}",
            "-o",
            f"Dir::Cache={root / 'cache'}",
            "-o",
            "Debug::NoLocking=1",
        ]

    def update(self, force: bool = False) -> None:
        stamp = self.root / "updated"
        if (
            not force
            and stamp.exists()
            and time.time() - stamp.stat().st_mtime < APT_LISTS_MAX_AGE_S
        ):
            return
        run(["apt-get", *self.opts, "update"], timeout=300, what="apt-get update (private deb-src)")
        if not any((self.root / "lists").glob("*_Sources*")):
            # no stamp: the next call updates again instead of trusting an empty index
            raise SourceError(
                f"apt-get update left no deb-src index in {self.root / 'lists'}; check the "
                "archive in /etc/apt and the network, or use a tarball/git source")
        stamp.touch()

    def _lists_signature(self) -> list[list]:
        """The deb-src index files' names, sizes and mtimes: what apt-cache answers from."""
        return sorted([p.name, st.st_size, st.st_mtime_ns]
                      for p in (self.root / "lists").glob("*_Sources*")
                      for st in (p.stat(),))

    def newest_version(self, package: str) -> str:
        """The newest version of source *package* in the index.  Kept in ``versions.json``
        beside the index, for as long as the index files are the ones it was read from:
        a build's name resolves its source on every command (apt-cache showsrc took 50 ms
        of CPU, ~310 times in a make test)."""
        memo = self.root / "versions.json"
        sig = self._lists_signature()
        try:
            kept = json.loads(memo.read_text())
            if kept.get("lists") == sig and isinstance(kept["versions"].get(package), str):
                return kept["versions"][package]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            kept = {}
        version = self._newest_version(package)
        versions = kept.get("versions", {}) if kept.get("lists") == sig else {}
        tmp = memo.with_name(f".versions-{os.getpid()}.json")
        tmp.write_text(json.dumps({"lists": sig, "versions": {**versions, package: version}}))
        os.replace(tmp, memo)
        return version

    def _newest_version(self, package: str) -> str:
        cp = run(["apt-cache", *self.opts, "showsrc", package], timeout=60, check=False)
        versions = re.findall(r"^Version:\s*(\S+)", cp.stdout, flags=re.MULTILINE)
        if not versions:
            raise SourceError(
                f"source package {package!r} not found in the archive's deb-src index "
                f"({self.root}); check the package name or use a tarball/git source"
            )
        # apt-cache lists candidates; pick the highest by dpkg's comparison
        best = versions[0]
        for v in versions[1:]:
            if run(["dpkg", "--compare-versions", v, "gt", best], check=False).returncode == 0:
                best = v
        return best

    def download(self, package: str, version: str, dest: Path, suite: str = "") -> None:
        dest.mkdir(parents=True, exist_ok=True)
        try:
            run(
                ["apt-get", *self.opts, "source", "--download-only", f"{package}={version}"],
                cwd=dest,
                timeout=900,
                what=f"apt-get source {package}={version}",
            )
        except CommandFailed as e:
            tail = "\n".join(e.output_tail.strip().splitlines()[-4:])
            major = package.rpartition("-")[2]
            raise SourceError(
                f"the archive's {suite or 'deb-src'} index lists {package} {version}, but "
                f"downloading it failed:\n{tail}\nThe mirror does not serve that source "
                f"package (experimental is often listed but not mirrored). Use a release "
                f"tarball or a git checkout instead: --source tarball:/path/to/"
                f"postgresql-{major}.tar.bz2 or --source git:/path/to/postgresql, or set "
                f"PROFKIT_PG{major}_SOURCE to one of them for pg{major}/... builds."
            ) from None


def _parse_dsc_sha256(dsc: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    in_block = False
    for line in dsc.read_text(errors="replace").splitlines():
        if line.startswith("Checksums-Sha256:"):
            in_block = True
            continue
        if in_block:
            if not line.startswith(" "):
                break
            parts = line.split()
            if len(parts) == 3:
                out[parts[2]] = parts[0]
    return out


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _extract_tarball(tarball: Path, dest: Path) -> Path:
    """Extract into dest atomically (tmp dir then rename); return the tree root.  Two
    processes asking for the same source at once (two test runs, a build and a probe)
    extract it once: the second waits on a lock beside it and finds it there."""
    if dest.exists():
        return _tree_root(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.with_name(dest.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if dest.exists():
            return _tree_root(dest)
        return _extract_locked(tarball, dest)


def _extract_locked(tarball: Path, dest: Path) -> Path:
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with tarfile.open(tarball) as tf:
            tf.extractall(tmp, filter="tar")
    except (tarfile.TarError, OSError, EOFError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SourceError(f"could not extract {tarball}: {e}") from None
    root = _tree_root(tmp)
    if not (root / "configure").exists():
        shutil.rmtree(tmp, ignore_errors=True)
        raise SourceError(
            f"{tarball} does not look like a PostgreSQL source tarball (no configure)"
        )
    tmp.rename(dest)
    return _tree_root(dest)


def _tree_root(d: Path) -> Path:
    kids = [k for k in d.iterdir() if k.is_dir()]
    if (d / "configure").exists():
        return d
    if len(kids) == 1 and (kids[0] / "configure").exists():
        return kids[0]
    raise SourceError(f"{d} holds no PostgreSQL source tree")


def upstream_version(tree: Path) -> str:
    """PACKAGE_VERSION from configure (e.g. '18.6' or '19devel')."""
    try:
        with open(tree / "configure", errors="replace") as f:
            for line in f:
                m = re.match(r"^PACKAGE_VERSION='([^']+)'", line)
                if m:
                    return m.group(1)
    except OSError:
        pass
    raise SourceError(f"{tree}: cannot read PACKAGE_VERSION from configure")


def debian_suite(package: str) -> str:
    """The suite a Debian source package is taken from: $PROFKIT_SRC_SUITE, else
    :data:`DEBIAN_SUITES` (postgresql-19: experimental), else sid (Ubuntu: devel)."""
    env = os.environ.get("PROFKIT_SRC_SUITE")
    if env:
        return env
    if _read_os_release().get("ID") == "ubuntu":
        return "devel"
    return DEBIAN_SUITES.get(package, "sid")


def debian_source(package: str = "postgresql-18", *, refresh: bool = False) -> Source:
    suite = debian_suite(package)
    uri, keyring = archive_entry()
    # one private apt state per suite, so switching packages does not refetch indexes;
    # one process at a time in it (apt runs unlocked there: two updates at once break
    # each other's lists, as two test workers on an empty cache did)
    root = paths.sub("apt" if suite in ("sid", "devel") else f"apt-{suite}")
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _debian_source_locked(package, suite, _PrivateApt(root, uri, suite, keyring),
                                     refresh)


def _debian_source_locked(package: str, suite: str, apt: _PrivateApt, refresh: bool) -> Source:
    apt.update(force=refresh)
    version = apt.newest_version(package)
    meta_file = paths.sub("sources") / f"debian-{package}_{version}.json"
    if meta_file.exists():
        src = Source(**json.loads(meta_file.read_text()))
        if Path(src.path).is_dir():
            return src
    dl = paths.sub("downloads") / f"{package}_{version}"
    upstream_v = version.split("-")[0].split(":")[-1]
    dsc = dl / f"{package}_{version.split(':')[-1]}.dsc"
    if not dsc.exists():
        apt.download(package, version, dl, suite)
    if not dsc.exists():
        raise SourceError(f"apt-get source did not produce {dsc}")
    sums = _parse_dsc_sha256(dsc)
    origs = [n for n in sums if ".orig.tar." in n and not n.endswith(".asc")]
    if not origs:
        raise SourceError(f"{dsc} names no .orig tarball")
    orig = dl / origs[0]
    got = sha256_file(orig)
    if got != sums[origs[0]]:
        orig.unlink(missing_ok=True)
        raise SourceError(
            f"sha256 of {orig.name} is {got}, the .dsc says {sums[origs[0]]}: download "
            "corrupted; it was removed, run again"
        )
    tree = _extract_tarball(
        orig, paths.sub("sources") / f"debian-{package}_{upstream_v}-{got[:12]}"
    )
    src = Source(
        kind="debian",
        spec=f"debian:{package}",
        version=upstream_version(tree),
        detail=f"{package} {version} (orig sha256 {got})",
        identity=got,
        path=str(tree),
    )
    meta_file.write_text(json.dumps(src.to_dict(), indent=1))
    return src


def tarball_source(tarball: Path) -> Source:
    tarball = tarball.expanduser().resolve()
    if not tarball.is_file():
        raise SourceError(f"tarball {tarball} does not exist")
    digest = sha256_file(tarball)
    tree = _extract_tarball(tarball, paths.sub("sources") / f"tarball-{digest[:16]}")
    return Source(
        kind="tarball",
        spec=f"tarball:{tarball}",
        version=upstream_version(tree),
        detail=tarball.name,
        identity=digest,
        path=str(tree),
    )


def git_source(checkout: Path) -> Source:
    checkout = checkout.expanduser().resolve()
    if not (checkout / ".git").exists():
        raise SourceError(f"{checkout} is not a git checkout (no .git)")
    if (checkout / "config.status").exists() or (checkout / "GNUmakefile").exists():
        raise SourceError(
            f"{checkout} was configured in-tree; profkit builds out of tree (VPATH) and "
            "configure refuses a configured source dir: run `make distclean` there first"
        )
    head = run(["git", "-C", checkout, "rev-parse", "HEAD"]).stdout.strip()
    describe = run(
        ["git", "-C", checkout, "describe", "--always", "--dirty"], check=False
    ).stdout.strip()
    diff = run(["git", "-C", checkout, "diff", "HEAD", "--binary"], text=False).stdout
    untracked = run(["git", "-C", checkout, "ls-files", "--others", "--exclude-standard"]).stdout
    h = hashlib.sha256(head.encode() + b"\0" + diff + b"\0")
    for name in sorted(untracked.split()):
        p = checkout / name
        h.update(name.encode() + b"\0")
        if p.is_file():
            h.update(p.read_bytes())
    return Source(
        kind="git",
        spec=f"git:{checkout}",
        version=upstream_version(checkout),
        detail=f"{describe} ({head})",
        identity=h.hexdigest(),
        path=str(checkout),
    )
