"""Cached PostgreSQL builds.

A build is a source + an ordered list of patches + configure options + CFLAGS.
Its cache key is the sha256 of all of those plus the compiler's identity, so
an unchanged build is never rebuilt.  Each build gets its own patched copy of
the source and its own VPATH build tree under ``<cache>/builds/<name>-<key>``;
compilation goes through ccache with ``CCACHE_BASEDIR`` at the cache root and
``CCACHE_NOHASHDIR``, so a patched build recompiles only the translation units
whose source or headers its patch changes (everything else is a ccache hit; depend
mode, see :func:`ccache_env`).
``--enable-depend`` is always on: without it a changed header (instrument.h!)
recompiles nothing and the binary silently goes stale.

A build directory is trusted only when its ``COMPLETE`` marker exists; the
marker is written last.  A failed step removes the directory (the log is kept
under ``<cache>/logs``), so no half-made entry is ever reused.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import html
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from profkit import paths, patches
from profkit.errors import BuildError, CommandFailed, PatchError
from profkit.pg.source import Source, default_source_for_major, get_source
from profkit.processes import install_handlers, run, stop_commands_of, which

RECIPE_VERSION = "3"
# Every build is configured with the same (never used) prefix and installed
# with DESTDIR: PostgreSQL's installs are relocatable (paths are computed from
# the binary's location), and a constant prefix keeps pg_config_paths.h — and
# so libpq, src/port, src/common — identical across variants: ccache hits.
CONFIGURED_PREFIX = "/opt/profkit/pgsql"
PATCH_ROOT = Path(__file__).resolve().parent.parent / "patches"

# -O2 with frame pointers everywhere (leaf functions too) so perf's frame
# pointer call graphs are whole; -g for DWARF (probes read struct offsets).
BASE_CFLAGS = "-O2 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer"
# Lazy binding so ltrace sees PLT calls (Ubuntu's toolchain defaults to BIND_NOW).
BASE_LDFLAGS = "-Wl,-z,lazy"
BASE_CONFIGURE = ("--enable-depend",)
# postgres_fdw: the same-answers corpus runs an async Foreign Scan on a loopback server.
# (CONTRIB is part of every build's cache key: changing it rebuilds every variant.)
CONTRIB = ("pg_stat_statements", "auto_explain", "postgres_fdw")

# What a build makes and installs: the server and what a cluster needs, nothing else.
# PostgreSQL's full `make` also builds ecpg, pg_dump, pgbench, pg_basebackup, pg_upgrade,
# the replication plugins and the regression programs, which profkit never runs; skipping
# them cuts a cold build's objects by about a third (see build.json "objects").  Order
# matters only for speed: each directory's Makefile makes its own prerequisites
# (submake-libpq, submake-libpgport...), and each `make -C DIR` runs at MAKELEVEL 0, so
# the generated headers are made first.  `profkit regress` makes the rest on demand.
#   timezone: initdb and the server read share/timezone and share/timezonesets
#   conversion_procs, snowball, plpgsql: initdb creates their functions (C functions are
#     loaded when created), so their libraries must be installed
#   pg_config: profkit reads the build's configuration; pg_test_timing: `clock-cost`
#   src/backend comes first (after src/port, src/common and zic, made before these):
#     its make also compiles src/timezone's objects (the server's), with the server's
#     COPT when the build has one (see make_flags)
BUILD_DIRS = (
    "src/backend",
    "src/timezone",
    "src/backend/utils/mb/conversion_procs",
    "src/backend/snowball",
    "src/pl/plpgsql",
    "src/interfaces/libpq",
    "src/bin/initdb",
    "src/bin/pg_ctl",
    "src/bin/psql",
    "src/bin/pg_config",
    "src/bin/pg_test_timing",
)


# installed as well, nothing to compile: the server's headers (pg_config --includedir-server)
INSTALL_ONLY_DIRS = ("src/include",)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildSpec:
    name: str
    patches: tuple[str, ...] = ()
    configure_opts: tuple[str, ...] = ()
    cflags: str = BASE_CFLAGS
    ldflags: str = BASE_LDFLAGS
    description: str = ""
    #: the source this build is made from (``git:/path``…); None: the command's --source
    #: or the default (Debian's postgresql-18)
    source: str | None = None
    #: the C compiler, run through ccache: "gcc" (default) or "clang" (name suffix @clang)
    cc: str = "gcc"
    #: code layout: 0 = the linker's own function order; N > 0 = the same code with every
    #: function of the server in its own section (-ffunction-sections) placed in an order
    #: shuffled by lld with seed N (name suffix @layoutN)
    layout: int = 0


def _patch_presets() -> dict[str, tuple[tuple[str, ...], str]]:
    """Preset name -> (patch names, description) from the patch library."""
    presets = getattr(patches, "PRESETS", {})
    descr = getattr(patches, "DESCRIPTIONS", {})
    return {k: (tuple(v), descr.get(k, "")) for k, v in presets.items()}


def _base_presets() -> dict[str, BuildSpec]:
    out = {
        "vanilla": BuildSpec("vanilla", description="unpatched, -O2 -g, frame pointers"),
        "gprof": BuildSpec(
            "gprof",
            configure_opts=("--enable-profiling",),
            description="unpatched, --enable-profiling (gprof: gmon.out per backend)",
        ),
    }
    for name, (patch_names, descr) in _patch_presets().items():
        if name in out:
            continue
        out[name] = BuildSpec(name, patches=patch_names, description=descr)
    for name, spec in custom_specs().items():
        out.setdefault(name, spec)
        # every patched variant also exists with gprof: "<name>+gprof"
    for name in list(out):
        if name != "gprof" and out[name].patches:
            out[f"{name}+gprof"] = BuildSpec(
                f"{name}+gprof",
                patches=out[name].patches,
                configure_opts=(*out[name].configure_opts, "--enable-profiling"),
                cflags=out[name].cflags,
                ldflags=out[name].ldflags,
                description=out[name].description + " + --enable-profiling",
                source=out[name].source,
                cc=out[name].cc,
                layout=out[name].layout,
            )
    return out


# ---------------------------------------------------------------------------------------
# named builds of the user's own patches: <cache>/specs/NAME.json + NAME/<patch files>

_CUSTOM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$")


def specs_dir() -> Path:
    """Where named builds are defined: ``$PROFKIT_SPECS``, else ``<cache>/specs``.  The
    test suite points it elsewhere, so the builds its tests define never show up among a
    user's own (their compiled trees are still cached under ``<cache>/builds``)."""
    env = os.environ.get("PROFKIT_SPECS")
    if env:
        d = Path(env)
        d.mkdir(parents=True, exist_ok=True)
        return d
    return paths.sub("specs")


def custom_specs() -> dict[str, BuildSpec]:
    """The named builds made by ``profkit build NAME --patch FILE`` (read from the cache)."""
    out: dict[str, BuildSpec] = {}
    try:
        files = sorted(specs_dir().glob("*.json"))
    except OSError:
        return out
    for f in files:
        try:
            d = json.loads(f.read_text())
            out[d["name"]] = BuildSpec(
                d["name"], patches=tuple(d.get("patches", ())),
                configure_opts=tuple(d.get("configure_opts", ())),
                cflags=d.get("cflags", BASE_CFLAGS), ldflags=d.get("ldflags", BASE_LDFLAGS),
                description=d.get("description", ""), source=d.get("source"),
                cc=d.get("cc", "gcc"), layout=int(d.get("layout", 0)))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged spec file is not a build; `profkit build NAME` rewrites it
    return out


def define_build(
    name: str,
    patch_files: Sequence[str | Path],
    *,
    base: str = "vanilla",
    configure_opts: Sequence[str] = (),
    cflags: str = "",
    source: str | None = None,
) -> BuildSpec:
    """Save a named build of *base* + the user's *patch_files* (copied into the cache, so
    NAME keeps meaning the patch text it was made from; defining it again with a changed
    file makes a new build), usable wherever a preset name is. Raises before any build."""
    if not _CUSTOM_NAME.match(name) or "+" in name:
        raise BuildError(f"build name {name!r}: use letters, digits and _.- (at most 63)",
                         step="spec")
    library = {k for k in presets() if k not in custom_specs()}
    if name in library:
        raise BuildError(f"build name {name!r} is a library preset: choose another name",
                         step="spec")
    if base not in presets():
        raise BuildError(f"unknown base build {base!r}; known: {', '.join(sorted(presets()))}",
                         step="spec")
    base_spec = presets()[base]
    if base_spec.name == name:
        raise BuildError(f"build {name!r} cannot be its own base", step="spec")
    if not patch_files:
        raise BuildError("give at least one --patch FILE (a unified diff, applied with -p1)",
                         step="spec")
    # a named base's own patch copies are copied too: redefining the base later must not
    # change this build
    lib_patches = tuple(p for p in base_spec.patches if not Path(p).is_absolute())
    inherited = [Path(p) for p in base_spec.patches if Path(p).is_absolute()]
    srcs: list[Path] = []
    for pf in patch_files:
        p = Path(pf).expanduser()
        if not p.is_file():
            raise PatchError(f"patch file {str(pf)!r} not found: give the path of a unified "
                             "diff (git diff > my.patch)", step="patch")
        if not _looks_like_a_diff(p):
            raise PatchError(f"patch file {str(pf)!r} is not a unified diff (no ---/+++/@@ "
                             "lines): make it with `git diff > my.patch` or `diff -u`",
                             step="patch")
        srcs.append(p.resolve())
    stems = [p.stem for p in (*inherited, *srcs)]
    if len(set(stems)) != len(stems):
        dup = sorted({s for s in stems if stems.count(s) > 1})
        raise BuildError(f"two patch files named {', '.join(dup)}: rename one", step="spec")
    if source is not None:
        get_source(source)  # a bad --source fails now, not at build time
    d = specs_dir()
    pdir = d / name
    tmp = d / f".{name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    copied: list[str] = []
    for p in (*inherited, *srcs):
        dest = tmp / f"{p.stem}.patch"
        shutil.copyfile(p, dest)
        copied.append(str(pdir / dest.name))
    spec = BuildSpec(
        name,
        patches=(*lib_patches, *copied),
        configure_opts=(*base_spec.configure_opts, *configure_opts),
        cflags=(base_spec.cflags + " " + cflags).strip() if cflags else base_spec.cflags,
        ldflags=base_spec.ldflags,
        description=f"{base} + {', '.join(p.name for p in srcs)}"
        + (f" (configure {' '.join(configure_opts)})" if configure_opts else "")
        + (f" (CFLAGS + {cflags})" if cflags else ""),
        source=source if source is not None else base_spec.source,
    )
    shutil.rmtree(pdir, ignore_errors=True)
    tmp.rename(pdir)
    doc = asdict(spec)
    doc["origin"] = [{"file": str(p), "sha256": _sha256(p)} for p in srcs]
    doc["base"] = base
    (d / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return spec


def _looks_like_a_diff(p: Path) -> bool:
    """A unified diff has a ``--- a/...`` / ``+++ b/...`` pair and at least one hunk."""
    try:
        lines = p.read_text(errors="replace").splitlines()
    except OSError:
        return False
    return (any(ln.startswith("--- ") for ln in lines) and any(ln.startswith("+++ ")
                                                              for ln in lines)
            and any(ln.startswith("@@ ") for ln in lines))


# "step5@clang", "vanilla@layout2", "pg19/step5@clang@layout3": a build with modifiers
COMPILERS = ("gcc", "clang")
_MODIFIER = re.compile(r"^(gcc|clang|layout([1-9]\d{0,5}))$")
# -ffunction-sections puts every function in a section of its own, which lld places in
# an order shuffled with the seed: the same code, another layout (Mytkowicz et al. 2009)
LAYOUT_CFLAGS = "-ffunction-sections"
# clang 14 writes DWARF 5 by default, whose forms valgrind 3.19 (Debian 12's) cannot read:
# callgrind gives up on the binary ("unhandled dwarf2 abbrev form code 0x25"). DWARF 4
# keeps every tool (valgrind, perf, gdb, gprof) reading a clang build's symbols.
CLANG_CFLAGS = "-gdwarf-4"


def layout_ldflags(seed: int) -> str:
    return f"-fuse-ld=lld -Wl,--shuffle-sections=.text*={seed}"


# configure writes its arguments, LDFLAGS too, into pg_config.h (CONFIGURE_ARGS), which
# every file includes: a seed given to configure would make vanilla@layout2 miss every
# object vanilla@layout1 left in ccache (1,016 of 1,233 in a cold make test), and lld
# named there would make a layout miss every object of the build without it.  Both go to
# make instead, as LDFLAGS_EX: the flags PostgreSQL links its executables (postgres,
# initdb, psql ...) with, which pg_config still reports.  (Its shared libraries are linked
# by the default linker, unshuffled: a layout is the executable's.)
_SHUFFLE = re.compile(r"^-Wl,--shuffle-sections=")
_LLD = "-fuse-ld=lld"


def split_link_flags(ldflags: str) -> tuple[str, str]:
    """(configure's LDFLAGS, make's LDFLAGS_EX): the layout's --shuffle-sections seed and
    the linker that reads it moved out of what configure sees."""
    words = ldflags.split()
    if not any(_SHUFFLE.match(w) for w in words):
        return " ".join(words), ""
    to_make = [w for w in words if _SHUFFLE.match(w) or w == _LLD]
    return " ".join(w for w in words if w not in to_make), " ".join(to_make)


def link_make_vars(ldflags: str) -> list[str]:
    """The variables every make in a build's tree needs on its command line (none unless
    the build has a code layout)."""
    ex = split_link_flags(ldflags)[1]
    return [f"LDFLAGS_EX={ex}"] if ex else []


# Two kinds of flags matter only in the server, and go to its own code only: -pg
# (--enable-profiling: gprof profiles the postgres executable; its loadable modules' arcs
# land outside the text it profiles, and a -pg psql or initdb writes a gmon.out of its own
# into whatever folder it exits in) and -ffunction-sections (a code layout: lld shuffles
# the sections of the executables it links).  configure sees the options and CFLAGS of the
# same build without them, and make gets them as COPT in SERVER_DIRS and for the server's
# copies of src/port and src/common (SERVER_LIBS): every other object is the one the build
# without them compiles, a ccache hit.  PROFILE_PID_DIR is what --enable-profiling defines
# in pg_config.h (every backend writes $PGDATA/gprof/<pid>/gmon.out); only ipc.c reads it.
PROFILING_COPT = "-pg -DPROFILE_PID_DIR"
PROFILING_OPT = "--enable-profiling"
SERVER_DIRS = ("src/backend", "src/timezone")
# (folder, its client programs' library, the server's): the server's objects (x_srv.o)
# depend on the client's (x.o), which must be made first, without COPT
SERVER_LIBS = (("src/port", "libpgport.a", "libpgport_srv.a"),
               ("src/common", "libpgcommon.a", "libpgcommon_srv.a"))


class ConfigureAndMake(NamedTuple):
    """A build's flags split by who may see them: configure's options, CFLAGS and LDFLAGS
    (what pg_config.h records, so what every object depends on), the variables every make
    in the tree gets, and those the server's folders get (the same plus COPT)."""
    configure_opts: tuple[str, ...]
    cflags: str
    ldflags: str
    make_vars: list[str]
    server_vars: list[str]
    server_copt: str


def make_flags(spec: BuildSpec) -> ConfigureAndMake:
    """What configure must not see moved to make: the layout's link flags (LDFLAGS_EX,
    every executable) and the flags that matter only in the server (COPT, SERVER_DIRS and
    SERVER_LIBS)."""
    opts, words, copt = spec.configure_opts, spec.cflags.split(), []
    if PROFILING_OPT in opts:
        opts = tuple(o for o in opts if o != PROFILING_OPT)
        copt.append(PROFILING_COPT)
    if spec.layout and LAYOUT_CFLAGS in words:  # a layout's, not the user's own CFLAGS
        words = [w for w in words if w != LAYOUT_CFLAGS]
        copt.append(LAYOUT_CFLAGS)
    conf_ldflags = split_link_flags(spec.ldflags)[0]
    make_vars = link_make_vars(spec.ldflags)
    server_copt = " ".join(copt)
    server_vars = [*make_vars, f"COPT={server_copt}"] if server_copt else make_vars
    return ConfigureAndMake(opts, " ".join(words), conf_ldflags, make_vars, server_vars,
                            server_copt)


def split_modifiers(name: str) -> tuple[str, str | None, int | None]:
    """'step5@clang@layout2' -> ('step5', 'clang', 2); 'step5' -> ('step5', None, None).
    An unknown modifier is a BuildError naming the known ones."""
    base, *mods = name.split("@")
    cc: str | None = None
    layout: int | None = None
    for m in mods:
        mm = _MODIFIER.match(m)
        if not mm:
            raise BuildError(f"build {name!r}: unknown modifier @{m}; known: @gcc, @clang, "
                             "@layoutN (N = 1 ... 999999: the code layout's seed)", step="spec")
        if mm.group(2):
            if layout is not None:
                raise BuildError(f"build {name!r}: two @layout modifiers", step="spec")
            layout = int(mm.group(2))
        else:
            if cc is not None:
                raise BuildError(f"build {name!r}: two compiler modifiers", step="spec")
            cc = m
    return base, cc, layout


def with_modifiers(spec: BuildSpec, cc: str | None, layout: int | None) -> BuildSpec:
    """*spec* compiled by *cc* and/or linked in code layout *layout*; its name carries the
    modifiers (``step5@clang@layout2``), its flags, compiler and layout go into the cache
    key and the build's provenance."""
    if cc is None and layout is None:
        return spec
    cc = cc or spec.cc
    layout = layout if layout is not None else spec.layout
    suffix = ("" if cc == "gcc" else f"@{cc}") + (f"@layout{layout}" if layout else "")
    base_name = spec.name.split("@")[0]
    cflags, ldflags = spec.cflags, spec.ldflags
    if cc == "clang" and CLANG_CFLAGS not in cflags.split():
        cflags = f"{cflags} {CLANG_CFLAGS}"
    if layout and not spec.layout:
        cflags = f"{cflags} {LAYOUT_CFLAGS}"
        ldflags = f"{ldflags} {layout_ldflags(layout)}"
    elif layout and spec.layout and layout != spec.layout:
        ldflags = ldflags.replace(layout_ldflags(spec.layout), layout_ldflags(layout))
    descr = spec.description + (f" (compiled with {cc})" if cc != "gcc" else "") + \
        (f" (code layout {layout}: functions shuffled by lld)" if layout else "")
    return replace(spec, name=base_name + suffix, cflags=cflags, ldflags=ldflags,
                   description=descr, cc=cc, layout=layout)


class Presets(dict):
    """The listed presets; ``name in presets()`` and ``presets()[name]`` also accept a
    listed name with modifiers (``vanilla@layout2``, ``pg19/step5@clang``), which
    iteration does not list (there is one per seed)."""

    def _modified(self, key: object) -> BuildSpec | None:
        if not isinstance(key, str) or "@" not in key:
            return None
        try:
            base, cc, layout = split_modifiers(key)
        except BuildError:
            return None
        if not dict.__contains__(self, base):
            return None
        return with_modifiers(dict.__getitem__(self, base), cc, layout)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self._modified(key) is not None

    def __missing__(self, key: str) -> BuildSpec:
        spec = self._modified(key)
        if spec is None:
            raise KeyError(key)
        return spec

    def get(self, key, default=None):  # type: ignore[override]
        return self[key] if key in self else default


# "pg19/step3": the preset step3 built from PostgreSQL 19's source (see split_major)
_MAJOR_PREFIX = re.compile(r"^pg(\d+)/(.+)$")


def split_major(name: str) -> tuple[str | None, str]:
    """'pg19/step3' -> ('19', 'step3'); 'step3' -> (None, 'step3')."""
    m = _MAJOR_PREFIX.match(name)
    return (m.group(1), m.group(2)) if m else (None, name)


def _major_spec(major: str, spec: BuildSpec) -> BuildSpec:
    return BuildSpec(f"pg{major}/{spec.name}", patches=spec.patches,
                     configure_opts=spec.configure_opts, cflags=spec.cflags, ldflags=spec.ldflags,
                     description=f"PostgreSQL {major}: {spec.description}", cc=spec.cc,
                     layout=spec.layout)


def presets() -> Presets:
    """Every build preset: the base ones (built from the default source, or from the
    ``source=`` given) and ``pg<major>/<preset>`` for every major version the patch library
    has a folder for besides the default one (18), limited to the presets whose patches all
    exist for that version: the preset built from that major's default source
    (:func:`profkit.pg.source.default_source_for_major`).  ``pg18/<preset>`` is accepted
    too (:func:`resolve_spec`) but not listed."""
    out = Presets(_base_presets())
    for major in patches.versions():
        if major == patches.DEFAULT_MAJOR:
            continue
        for spec in list(out.values()):
            if "/" not in spec.name and all(patches.has_patch(p, major) for p in spec.patches):
                out[f"pg{major}/{spec.name}"] = _major_spec(major, spec)
    return out


def resolve_spec(name_or_spec: str | BuildSpec) -> BuildSpec:
    if isinstance(name_or_spec, BuildSpec):
        return name_or_spec
    p = presets()
    if dict.__contains__(p, name_or_spec):
        return p[name_or_spec]
    if "@" in name_or_spec:  # step5@clang, pg18/vanilla@layout2: modifiers on a build
        base_name, cc, layout = split_modifiers(name_or_spec)
        return with_modifiers(resolve_spec(base_name), cc, layout)
    major, base = split_major(name_or_spec)
    if major is not None and base in p:
        missing = [x for x in p[base].patches if not patches.has_patch(x, major)]
        if missing:
            raise PatchError(patches.missing_message(base, missing, major), step="spec")
        return _major_spec(major, p[base])
    raise BuildError(
        f"unknown build {name_or_spec!r}; known presets: {', '.join(sorted(p))}", step="spec"
    )


def resolve_source(name_or_spec: str | BuildSpec, source: str | None = None) -> Source:
    """The source a build is made from: *source* if given, else the default source of the
    preset's ``pg<major>/`` prefix, else profkit's default (``$PROFKIT_SOURCE``, Debian's
    postgresql-18).  A ``pg<major>/`` preset with a source of another major is an error."""
    name = name_or_spec.name if isinstance(name_or_spec, BuildSpec) else name_or_spec
    name = name.split("@")[0]  # the modifiers do not choose the source
    # a named build made with --source keeps it (the command's --source still wins)
    own = name_or_spec.source if isinstance(name_or_spec, BuildSpec) else None
    major, _ = split_major(name)
    if major is None:
        return get_source(source or own)
    src = get_source(source or default_source_for_major(major))
    if src.major != major:
        raise BuildError(
            f"build {name!r} is a PostgreSQL {major} build but its source {src.spec} is "
            f"PostgreSQL {src.version}: drop the pg{major}/ prefix or pass a PostgreSQL "
            f"{major} source (--source / $PROFKIT_PG{major}_SOURCE)", step="source")
    return src


def patch_path(name: str, major: str) -> Path:
    p = Path(name)
    if p.suffix == ".patch" and p.exists():
        return p.resolve()
    if not patches.has_patch(name, major):
        raise PatchError(patches.missing_message(name, [name], major), step="patch")
    return patches.patch_file(name, major)


@dataclass
class Build:
    name: str
    key: str
    dir: Path
    source: dict
    spec: dict
    patches: list[dict] = field(default_factory=list)
    pg_config: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    compiler: str = ""
    built_at: str = ""

    @property
    def prefix(self) -> Path:
        return self.dir / "install" / CONFIGURED_PREFIX.lstrip("/")

    @property
    def bindir(self) -> Path:
        return self.prefix / "bin"

    @property
    def libdir(self) -> Path:
        return self.prefix / "lib"

    @property
    def postgres(self) -> Path:
        return self.bindir / "postgres"

    def client_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment for this build's client programs (psql, pgbench): the install
        sits under DESTDIR, so its RUNPATH (the configured prefix) does not exist and
        the loader would take the system's libpq instead of this build's."""
        env = dict(os.environ if base is None else base)
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = str(self.libdir) + (f":{old}" if old else "")
        return env

    @property
    def build_tree(self) -> Path:
        return self.dir / "build"

    @property
    def src_tree(self) -> Path:
        return self.dir / "src"

    @property
    def log_path(self) -> Path:
        return self.dir / "build.log"

    @property
    def version(self) -> str:
        return self.pg_config.get("VERSION", self.source.get("version", "?"))

    @property
    def profiling(self) -> bool:
        return "--enable-profiling" in self.spec.get("configure_opts", [])

    def provenance(self) -> dict:
        return {
            "build": self.name,
            "key": self.key,
            "source": self.source,
            "patches": self.patches,
            "configure_opts": self.spec.get("configure_opts"),
            "cflags": self.spec.get("cflags"),
            "ldflags": self.spec.get("ldflags"),
            "compiler": self.compiler,
            "cc": self.spec.get("cc", "gcc"),
            "layout": self.spec.get("layout", 0),
            "pg_config": self.pg_config,
            "built_at": self.built_at,
            "postgres": str(self.postgres),
        }

    def to_json(self) -> str:
        d = asdict(self)
        d["dir"] = str(self.dir)
        return json.dumps(d, indent=1, sort_keys=True)

    @classmethod
    def from_dir(cls, d: Path) -> Build:
        data = json.loads((d / "build.json").read_text())
        data["dir"] = Path(data["dir"])
        return cls(**data)

    def _repr_html_(self) -> str:
        rows = [
            ("build", self.name),
            ("PostgreSQL", self.version),
            ("source", self.source.get("detail")),
            (
                "patches",
                ", ".join(f"{p['name']} ({p['sha256'][:10]})" for p in self.patches) or "none",
            ),
            ("configure", " ".join(self.spec.get("configure_opts", []))),
            ("CFLAGS", self.pg_config.get("CFLAGS", self.spec.get("cflags"))),
            ("key", self.key[:16]),
            ("install", str(self.prefix)),
        ]
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>"
            for k, v in rows
        )
        return f"<table>{body}</table>"

    def __repr__(self) -> str:
        return f"<Build {self.name} PostgreSQL {self.version} key={self.key[:12]} at {self.dir}>"


def compiler_identity(cc: str = "gcc") -> str:
    """The first line of ``CC --version`` (part of the cache key and the provenance)."""
    cp = run([which(cc), "--version"], timeout=30)
    return cp.stdout.splitlines()[0].strip()


def cache_key(spec: BuildSpec, source: Source, patch_files: Sequence[Path], compiler: str) -> str:
    h = hashlib.sha256()
    for part in (
        RECIPE_VERSION,
        source.identity,
        spec.cflags,
        spec.ldflags,
        " ".join(BASE_CONFIGURE + spec.configure_opts),
        compiler,
        ",".join(CONTRIB),
    ):
        h.update(part.encode() + b"\0")
    # a non-default compiler or layout (the default builds keep the keys they had)
    if spec.cc != "gcc":
        h.update(f"cc={spec.cc}".encode() + b"\0")
    if spec.layout:
        # layout-seed-at-make: the seed is given to make, not configure (split_link_flags)
        h.update(f"layout={spec.layout};layout-seed-at-make".encode() + b"\0")
    if make_flags(spec).server_copt:
        # -pg and -ffunction-sections in the server's code only (make_flags); the
        # builds made before had them everywhere
        h.update(b"server-copt\0")
    for pf in patch_files:
        h.update(patch_body(pf.read_bytes()) + b"\0")
    return h.hexdigest()


def patch_body(data: bytes) -> bytes:
    """A patch file without its header: from the first ``diff `` line, else the first
    ``--- ``/``+++ `` pair.  patch(1) ignores the text above it, so rewording a header
    must not invalidate every build of the variant; any change to a hunk does."""
    lines = data.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(b"diff ") or (
            line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ ")
        ):
            return b"".join(lines[i:])
    return data


# The C library's version macros: ccache's depend mode keys an object on the headers the
# compiler's -MMD lists, which leaves out system headers; this file puts the C library's
# version in every key instead.
SYSTEM_HEADER_ID = "/usr/include/features.h"


def ccache_env() -> dict[str, str]:
    """ccache's settings for a build.  Depend mode (``CCACHE_DEPEND``): a miss runs the
    compiler once, without ccache's own preprocessor pass, since PostgreSQL's
    ``--enable-depend`` makes the compiler write the list of headers ccache keys on (a
    cold vanilla build: 0.855 times the CPU, two rounds of
    ``benchmarks/ccache_modes.py``).  ``CCACHE_NODEPEND`` in the environment turns it
    off."""
    env = {
        "CCACHE_DIR": os.environ.get("CCACHE_DIR", str(paths.sub("ccache"))),
        "CCACHE_BASEDIR": str(paths.cache_dir()),
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_MAXSIZE": os.environ.get("CCACHE_MAXSIZE", "8G"),
    }
    if "CCACHE_NODEPEND" not in os.environ:
        env["CCACHE_DEPEND"] = "1"
        if Path(SYSTEM_HEADER_ID).is_file():
            env["CCACHE_EXTRAFILES"] = SYSTEM_HEADER_ID
    return env


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def find_build(name_or_spec: str | BuildSpec, source: str | None = None) -> Build | None:
    """The cached build, or None (never builds)."""
    spec = resolve_spec(name_or_spec)
    src = resolve_source(spec, source)
    files = [patch_path(p, src.major) for p in spec.patches]
    key = cache_key(spec, src, files, compiler_identity(spec.cc))
    d = paths.sub("builds") / f"{_safe_name(spec.name)}-{key[:12]}"
    if (d / "COMPLETE").exists():
        return Build.from_dir(d)
    return None


def get_build(
    name_or_spec: str | BuildSpec,
    *,
    source: str | None = None,
    progress: Progress | None = None,
    jobs: int | None = None,
    _turn: _Turn | None = None,
) -> Build:
    """Return the build, building it first if it is not cached."""
    spec = resolve_spec(name_or_spec)
    say = progress or (lambda s: None)
    src = resolve_source(spec, source)
    files = [patch_path(p, src.major) for p in spec.patches]
    compiler = compiler_identity(spec.cc)
    key = cache_key(spec, src, files, compiler)
    root = paths.sub("builds")
    d = root / f"{_safe_name(spec.name)}-{key[:12]}"
    lock_path = root / f".{d.name}.lock"
    with open(lock_path, "w") as lock:
        _flock(lock, _turn, "spec")  # another process may be making this very build
        if (d / "COMPLETE").exists():
            say(f"{spec.name}: cached ({d.name})")
            return Build.from_dir(d)
        return _do_build(spec, src, files, compiler, key, d, say, jobs or os.cpu_count() or 2,
                         _turn)


@contextlib.contextmanager
def _compile_slot(root: Path, name: str, say: Progress, turn: _Turn | None):
    """One compile at a time per cache: each already uses every core (make -jN), and two
    at once only make both finish later.  The steps before it (source copy, patches,
    configure) and after it (make install) are single-threaded and run outside it, beside
    another build's compile (:func:`get_builds`).  *turn*: this build's place in a
    get_builds list, whose earlier builds compile first."""
    try:
        if turn is not None:
            turn.turns.wait("make", turn.index)
        with open(root / ".compile.lock", "w") as compile_lock:
            if not _flock(compile_lock, turn, "make", wait=False):
                say(f"{name}: waiting for another build in {root} to finish compiling")
                _flock(compile_lock, turn, "make")
            yield
    finally:
        if turn is not None:  # the next build of the list compiles while this one installs
            turn.turns.end(turn.index, ("make",))


def _flock(f, turn: _Turn | None, step: str, wait: bool = True) -> bool:
    """An exclusive flock on *f*; with *wait* False only if free now (the result says
    whether it was taken).  A build of a get_builds list waits polling, so that a list
    cancelled meanwhile (Ctrl-C, a failure) stops its threads' waiting too."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        if not wait:
            return False
    if turn is None:
        fcntl.flock(f, fcntl.LOCK_EX)
        return True
    while True:
        turn.turns.check(step)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.5)


@dataclass(frozen=True)
class _Turn:
    turns: _Turns
    index: int


# why a get_builds list was cancelled when Ctrl-C or SIGTERM stopped it
INTERRUPTED = "interrupted"


class _Turns:
    """The builds of a get_builds list take two steps in the list's order: build i runs
    configure once every build before it has configured, and compiles once every build
    before it has compiled (a build that ended, cached or failed, has done both).  So a
    build that fails before compiling (its patch, its configure) stops the next one
    before that one configures."""

    STEPS = ("configure", "make")

    def __init__(self) -> None:
        self._done: dict[str, set[int]] = {s: set() for s in self.STEPS}
        self._cv = threading.Condition()
        self.cancelled: str | None = None

    def wait(self, step: str, i: int) -> None:
        with self._cv:
            self._cv.wait_for(lambda: self.cancelled is not None
                              or self._done[step].issuperset(range(i)))
        self.check(step)

    def check(self, step: str) -> None:
        """A BuildError at *step* once the list is cancelled."""
        if self.cancelled is not None:
            raise BuildError(f"stopped before {step}: {self.cancelled}", step=step)

    def end(self, i: int, steps: Sequence[str] = STEPS) -> None:
        with self._cv:
            for step in steps:
                self._done[step].add(i)
            self._cv.notify_all()

    def cancel(self, why: str) -> None:
        with self._cv:
            self.cancelled = self.cancelled or why
            self._cv.notify_all()


def get_builds(names: Sequence[str | BuildSpec], *, source: str | None = None,
               progress: Progress | None = None, jobs: int | None = None,
               on_built: Callable[[Build], None] | None = None) -> list[Build]:
    """The builds *names*, cached or made in the order given, and what :func:`get_build`
    says of each.  Compiles stay one at a time, in that order (a variant finds the
    objects of the builds before it in ccache), but the single-threaded steps of the next
    build (copying its source, patching, configure) run while this one compiles, and this
    one's make install while the next compiles: on 2 cores a list of builds does not
    leave one core idle at each build's ends.  Configure runs in the list's order too
    (the builds of the same options share autoconf's answers).

    The first failure stops the list: the build after it is neither configured (when
    the failure came first) nor compiled, its tree is removed, and no later one starts;
    the error raised is the first build's own.  On Ctrl-C or SIGTERM the commands of
    both builds are stopped and their trees removed.  *on_built* is called with each
    build, in the list's order, as soon as it and the builds before it are ready."""
    names = list(names)
    if len(names) < 2:
        out = []
        for n in names:
            out.append(get_build(n, source=source, progress=progress, jobs=jobs))
            if on_built is not None:
                on_built(out[-1])
        return out
    from concurrent.futures import ThreadPoolExecutor

    install_handlers()  # from the main thread: SIGTERM unwinds it
    turns = _Turns()
    threads: set[int] = set()

    def one(i: int) -> Build:
        threads.add(threading.get_ident())
        try:
            turns.check("copy source")
            return get_build(names[i], source=source, progress=progress, jobs=jobs,
                             _turn=_Turn(turns, i))
        except BaseException:
            turns.cancel(f"{_label(names[i])} did not build")
            raise
        finally:
            turns.end(i)

    out: list[Build] = []
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="profkit-build") as ex:
        futures = [ex.submit(one, i) for i in range(len(names))]
        try:
            for f in futures:
                out.append(f.result())
                if on_built is not None:
                    on_built(out[-1])
        except BaseException as e:
            turns.cancel("an earlier build failed" if isinstance(e, Exception)
                         else INTERRUPTED)
            for f in futures:
                f.cancel()
            if not isinstance(e, Exception):  # Ctrl-C, SIGTERM: stop both builds now
                stop_commands_of(threads)
            raise
    return out


def _label(name: str | BuildSpec) -> str:
    return name if isinstance(name, str) else name.name


def _check_patches_apply(src: Source, files: Sequence[Path], log_path: Path) -> None:
    """Apply *files* in order to a scratch copy of the source files they touch (what a
    build does first): :class:`PatchError` with the rejected hunks, its log at *log_path*."""
    if not files:
        return
    touched = sorted({f for pf in files
                      for f in patches.target_files(pf.read_text(errors="replace"))})
    log_path.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="profkit-check-") as tmp:
        tree = Path(tmp) / "src"
        tree.mkdir()
        for rel in touched:
            if (Path(src.path) / rel).is_file():
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(src.path) / rel, tree / rel)
        _apply_patches(tree, files, log_path, src)


def _is_users_patch(pf: Path) -> bool:
    """A patch of a named build (copied under <cache>/specs/NAME/), not the library's."""
    try:
        return pf.resolve().is_relative_to(specs_dir().resolve())
    except OSError:
        return False


def _users_patch_message(pf: Path, earlier: list[str], output: str, text: str,
                         source: Source | None) -> str:
    """The library's hunk report, with advice for a patch the user wrote."""

    detail = patches.rejected_hunks(output, text)
    where = f" on top of {', '.join(earlier)}" if earlier else ""
    onto = (f"PostgreSQL {source.version} ({source.spec})" if source is not None
            else "this source")
    return (f"your patch {pf.name} ({pf}) does not apply to {onto}{where}: {detail}. Rebase "
            "it onto that source (a `git diff` against it, applied with patch -p1), or build "
            "from the tree it was made against: profkit build NAME --patch FILE --source "
            "git:/path/to/checkout")


def _apply_patches(tree: Path, files: Sequence[Path], log_path: Path,
                   source: Source | None = None) -> list[dict]:

    applied: list[dict] = []
    for pf in files:
        base = ["patch", "-p1", "--batch", "--forward", "-d", str(tree), "-i", str(pf)]
        dry = run([*base, "--dry-run"], check=False, timeout=120)
        output = (dry.stdout or "") + (dry.stderr or "")
        with open(log_path, "a") as log:
            log.write(f"$ patch -p1 < {pf.name} (dry run)\n{output}\n")
        if dry.returncode != 0:
            text = pf.read_text(errors="replace")
            if _is_users_patch(pf):
                msg = _users_patch_message(pf, [a["name"] for a in applied], output, text,
                                           source)
            else:
                msg = patches.failure_message(pf.stem, [a["name"] for a in applied], output, text,
                                      patch_path=pf)
            raise PatchError(msg, step="patch", log_path=str(log_path))
        run(base, timeout=120, stdout_path=log_path, merge_stderr=True)
        applied.append({"name": pf.stem, "file": str(pf), "sha256": _sha256(pf),
                        "text": pf.read_text(errors="replace")})
    return applied


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _ccache_statslog(path: Path) -> dict[str, int]:
    """Count this build's own ccache results (CCACHE_STATSLOG: '# file' then result lines)."""
    counts = {"direct_cache_hit": 0, "preprocessed_cache_hit": 0, "cache_miss": 0}
    try:
        with open(path) as f:
            for line in f:
                k = line.strip()
                if k in counts:
                    counts[k] += 1
    except OSError:
        pass
    return counts


def _do_build(
    spec: BuildSpec,
    src: Source,
    files: Sequence[Path],
    compiler: str,
    key: str,
    d: Path,
    say: Progress,
    jobs: int,
    turn: _Turn | None = None,
) -> Build:
    for tool in ("make", "patch", "ccache", "bison", "flex", spec.cc,
                 *(("ld.lld",) if spec.layout else ())):
        which(tool)
    if d.exists():
        shutil.rmtree(d)  # no COMPLETE marker: never trusted
    d.mkdir(parents=True)
    log_path = d / "build.log"
    step = "copy source"
    env = {
        **ccache_env(),
        "CC": f"ccache {spec.cc}",
        "LC_ALL": "C",
        "CCACHE_STATSLOG": str(d / "ccache-stats.log"),
    }
    timings: dict = {"started_at": time.time()}
    try:
        t0 = time.monotonic()
        say(f"{spec.name}: copying source {src.version}")
        shutil.copytree(src.path, d / "src", symlinks=True, ignore=shutil.ignore_patterns(".git"))
        step = "patch"
        applied = []
        if files:
            say(f"{spec.name}: applying {', '.join(f.stem for f in files)}")
            applied = _apply_patches(d / "src", files, log_path, src)
        timings["prepare_s"] = time.monotonic() - t0

        def in_tree(argv: list[str], timeout: float, what: str) -> None:
            """Run a build step in the build tree, its output appended to the build log."""
            run(argv, cwd=d / "build", env=env, timeout=timeout, stdout_path=log_path,
                merge_stderr=True, what=what)

        step = "configure"
        if turn is not None:
            turn.turns.wait(step, turn.index)
        flags = make_flags(spec)
        make_vars, server_vars, server_copt = flags.make_vars, flags.server_vars, flags.server_copt
        timings["server_copt"] = server_copt
        (d / "build").mkdir()
        say(f"{spec.name}: configure")
        configure = [
            str(d / "src" / "configure"),
            f"--prefix={CONFIGURED_PREFIX}",
            *BASE_CONFIGURE,
            *flags.configure_opts,
            f"CFLAGS={flags.cflags}",
            f"LDFLAGS={flags.ldflags}",
            f"CC=ccache {spec.cc}",
        ]
        # autoconf's cache, shared by builds with the same options and compiler (a private
        # copy per build).  One configure at a time per cache: a build that configures
        # beside another of the same options (the first two of a get_builds list) waits
        # for its answers instead of finding them all out again (~11 s against ~4 s).
        conf_key = hashlib.sha256("\0".join([*configure[1:], compiler, src.identity]).encode())
        shared_cache = paths.sub("configure") / f"{conf_key.hexdigest()[:16]}.cache"
        configure.append("--cache-file=config.cache")
        with open(log_path, "a") as log:
            log.write("$ " + " ".join(configure) + "\n")
        with open(shared_cache.with_suffix(".lock"), "w") as conf_lock:
            _flock(conf_lock, turn, step)
            t0 = time.monotonic()  # configure_s: configure's own time, not the wait
            if shared_cache.exists():
                shutil.copy(shared_cache, d / "build" / "config.cache")
            in_tree(configure, 1800, "configure")
            tmp_cache = shared_cache.with_name(f"{shared_cache.name}.{os.getpid()}")
            shutil.copy(d / "build" / "config.cache", tmp_cache)
            os.replace(tmp_cache, shared_cache)
        timings["configure_s"] = time.monotonic() - t0
        timings["configured_at"] = time.time()
        if turn is not None:
            turn.turns.end(turn.index, ("configure",))

        step = "make"
        with _compile_slot(d.parent, spec.name, say, turn):
            say(f"{spec.name}: make -j{jobs} (log: {log_path})")
            t0 = time.monotonic()
            timings["make_started_at"] = time.time()
            # The generated headers first: a directory's `all` lists them beside its
            # objects, so under -jN its first objects would compile before the headers
            # exist (the full make orders them through its recursion targets, `make -C
            # DIR` does not).
            in_tree(["make", "-s", "-C", "src/backend", "generated-headers", *make_vars],
                    1800, "make generated-headers")
            # src/port and src/common, then zic, before src/backend: make passes its
            # command line's variables down to the makes it starts, so src/backend's own
            # make of those folders (all their libraries) must find them made, the
            # server's copies (x_srv.o, which depend on the client's x.o) with COPT when
            # the build has one, the rest without; zic (src/timezone) is a program, made
            # before src/backend's make of that folder's objects
            for sub, client_lib, server_lib in SERVER_LIBS:
                in_tree(["make", f"-j{jobs}", "-s", "-C", sub, client_lib, *make_vars],
                        3600, f"make -C {sub} {client_lib}")
                in_tree(["make", f"-j{jobs}", "-s", "-C", sub, server_lib, *server_vars],
                        3600, f"make -C {sub} {server_lib}")
                in_tree(["make", f"-j{jobs}", "-s", "-C", sub, *make_vars], 3600,
                        f"make -C {sub}")
            in_tree(["make", "-s", "-C", "src/timezone", "zic", *make_vars], 1800,
                    "make -C src/timezone zic")
            for sub in (*BUILD_DIRS, *(f"contrib/{c}" for c in CONTRIB)):
                in_tree(["make", f"-j{jobs}", "-s", "-C", sub,
                         *(server_vars if sub in SERVER_DIRS else make_vars)], 3 * 3600,
                        f"make -C {sub}")
            timings["make_s"] = time.monotonic() - t0
            timings["make_ended_at"] = time.time()
        timings["objects"] = sum(1 for _ in (d / "build").rglob("*.o"))

        step = "install"
        say(f"{spec.name}: make install")
        t0 = time.monotonic()
        env["DESTDIR"] = str(d / "install")
        for sub in (*BUILD_DIRS, *INSTALL_ONLY_DIRS, *(f"contrib/{c}" for c in CONTRIB)):
            in_tree(["make", "-s", "-C", sub, "install",
                     *(server_vars if sub in SERVER_DIRS else make_vars)], 1800,
                    f"make -C {sub} install")
        timings["install_s"] = time.monotonic() - t0
        timings["ended_at"] = time.time()

        step = "pg_config"
        pg_config = read_pg_config(
            d / "install" / CONFIGURED_PREFIX.lstrip("/") / "bin" / "pg_config"
        )
    except CommandFailed as e:
        if turn is not None and turn.turns.cancelled == INTERRUPTED:
            # get_builds stopped this build's commands (Ctrl-C, SIGTERM): nothing failed,
            # so no log is kept as a failure's
            shutil.rmtree(d, ignore_errors=True)
            raise BuildError(f"build {spec.name!r} stopped at step '{step}': {INTERRUPTED}",
                             step=step) from None
        failed_log = _keep_log(d, log_path, spec.name)
        shutil.rmtree(d, ignore_errors=True)
        raise BuildError(
            f"build {spec.name!r} failed at step '{step}' (log: {failed_log}):\n{e.output_tail}",
            step=step,
            log_path=str(failed_log),
        ) from None
    except PatchError as e:
        failed_log = _keep_log(d, log_path, spec.name)
        shutil.rmtree(d, ignore_errors=True)
        raise PatchError(
            f"build {spec.name!r} failed at step 'patch': {e} (log: {failed_log})",
            step="patch",
            log_path=str(failed_log),
        ) from None
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise
    timings["ccache"] = _ccache_statslog(d / "ccache-stats.log")
    b = Build(
        name=spec.name,
        key=key,
        dir=d,
        source=src.to_dict(),
        spec=asdict(spec),
        patches=applied,
        pg_config=pg_config,
        timings=timings,
        compiler=compiler,
        built_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    (d / "build.json").write_text(b.to_json())
    (d / "COMPLETE").write_text(key + "\n")
    total = timings["prepare_s"] + timings["configure_s"] + timings["make_s"] + timings["install_s"]
    say(
        f"{spec.name}: built in {total:.0f} s (make {timings['make_s']:.0f} s, "
        f"ccache hits {timings['ccache']['direct_cache_hit'] + timings['ccache']['preprocessed_cache_hit']}, "
        f"misses {timings['ccache']['cache_miss']})"
    )
    return b


def _keep_log(d: Path, log_path: Path, name: str) -> Path:
    logs = paths.sub("logs")
    dest = logs / f"{d.name}-failed-{time.strftime('%Y%m%d-%H%M%S')}.log"
    if log_path.exists():
        shutil.copy(log_path, dest)
    else:
        dest.write_text(f"(no log written for {name})\n")
    return dest


def read_pg_config(pg_config: Path) -> dict[str, str]:
    cp = run([pg_config], timeout=30)
    out = {}
    for line in cp.stdout.splitlines():
        k, sep, v = line.partition(" = ")
        if sep:
            out[k.strip()] = v.strip()
    return out


def list_builds(*, defined_only: bool = False) -> list[Build]:
    """The cached builds; with *defined_only*, those whose name is a preset or one of the
    named builds defined here (not builds of names defined elsewhere, such as the test
    suite's)."""
    known = presets() if defined_only else None
    out = []
    for d in sorted(paths.sub("builds").iterdir()):
        if (d / "COMPLETE").exists() and (d / "build.json").exists():
            b = Build.from_dir(d)
            base = b.name.split("/", 1)[-1]
            if known is None or b.name in known or base in known:
                out.append(b)
    return out


# ---------------------------------------------------------------------------------------
# a dry run: resolve a build and apply its patches, without compiling


@dataclass(frozen=True)
class PatchCheck:
    """What :func:`check_build` found: the build resolves, its source is known, and its
    patches apply to that source in order."""

    name: str
    version: str          # the source's PostgreSQL version (19beta1, 18.6)
    source: str           # the source spec (tarball:/..., debian:postgresql-18)
    patches: tuple[str, ...]   # patch files applied, in order
    files: int            # source files the patches change
    cached: bool          # a finished build of exactly this is in the cache


def check_build(name_or_spec: str | BuildSpec, *, source: str | None = None) -> PatchCheck:
    """Resolve *name_or_spec* as :func:`get_build` would (preset, ``pg<major>/`` prefix,
    named build; its source, fetched and unpacked into the cache if it is not there yet)
    and apply its patches, in order, to a scratch copy of the files they touch: what a
    build does before it compiles. Raises :class:`PatchError` naming the patch and the
    rejected hunks, or :class:`BuildError` for an unknown build or a source of another
    major version. Never compiles; the source tree is not modified."""
    spec = resolve_spec(name_or_spec)
    src = resolve_source(spec, source)
    files = [patch_path(p, src.major) for p in spec.patches]
    touched = sorted({f for pf in files for f in patches.target_files(pf.read_text(errors="replace"))})
    with tempfile.TemporaryDirectory(prefix="profkit-check-") as tmp:
        _check_patches_apply(src, files, Path(tmp) / "patch.log")
    key = cache_key(spec, src, files, compiler_identity())
    cached = (paths.sub("builds") / f"{_safe_name(spec.name)}-{key[:12]}" / "COMPLETE").exists()
    return PatchCheck(name=spec.name, version=src.version, source=src.spec,
                      patches=tuple(str(f) for f in files), files=len(touched), cached=cached)
