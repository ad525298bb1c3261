"""Build names with modifiers: ``@clang`` (the compiler) and ``@layoutN`` (a code layout).

No build here: names resolve, flags and cache keys differ where they must and only there.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from profkit.errors import BuildError
from profkit.pg import build as B
from profkit.pg.source import Source


def _src() -> Source:
    return Source(kind="tarball", spec="tarball:/x", version="18.6", detail="test",
                  identity="abc", path="/nonexistent")


def test_modifiers_resolve_on_any_preset():
    s = B.resolve_spec("step5@clang")
    assert (s.name, s.cc, s.layout) == ("step5@clang", "clang", 0)
    # DWARF 4: valgrind 3.19 cannot read clang 14's default DWARF 5
    assert s.cflags.split()[-1] == "-gdwarf-4" and "-gdwarf-4" not in B.resolve_spec("step5").cflags
    assert s.patches == B.resolve_spec("step5").patches
    assert s.cflags == f"{B.BASE_CFLAGS} -gdwarf-4" and s.ldflags == B.BASE_LDFLAGS
    v = B.resolve_spec("vanilla@layout2")
    assert (v.name, v.cc, v.layout) == ("vanilla@layout2", "gcc", 2)
    assert v.cflags == f"{B.BASE_CFLAGS} -ffunction-sections"
    assert v.ldflags == f"{B.BASE_LDFLAGS} -fuse-ld=lld -Wl,--shuffle-sections=.text*=2"
    both = B.resolve_spec("pg19/step5@clang@layout3")
    assert (both.name, both.cc, both.layout) == ("pg19/step5@clang@layout3", "clang", 3)
    assert both.description.startswith("PostgreSQL 19")
    # a +gprof twin takes modifiers too, and keeps its configure option
    g = B.resolve_spec("step3+gprof@clang")
    assert "--enable-profiling" in g.configure_opts and g.cc == "clang"
    # @gcc is the default compiler: the same spec as without it
    assert B.resolve_spec("step5@gcc") == B.resolve_spec("step5")


def test_make_flags_leave_configure_as_the_plain_build_has_it():
    """-pg and -ffunction-sections reach the server's code only (make's COPT): configure
    sees what the build without them sees, so every other object is a ccache hit."""
    plain = B.resolve_spec("step3")
    for name, copt in (("gprof", "-pg -DPROFILE_PID_DIR"),
                       ("step3+gprof", "-pg -DPROFILE_PID_DIR"),
                       ("step3@layout2", "-ffunction-sections"),
                       ("step3+gprof@layout1", "-pg -DPROFILE_PID_DIR -ffunction-sections")):
        f = B.make_flags(B.resolve_spec(name))
        opts, cflags, got = f.configure_opts, f.cflags, f.server_copt
        assert got == copt, name
        assert f.server_vars == [*f.make_vars, f"COPT={copt}"], name
        assert "--enable-profiling" not in opts and "-ffunction-sections" not in cflags
        assert (opts, cflags) == (plain.configure_opts, plain.cflags), name
    # a build with neither: configure gets its options and CFLAGS unchanged, no COPT
    clang = B.resolve_spec("step5@clang")
    assert B.make_flags(clang) == (clang.configure_opts, clang.cflags, clang.ldflags, [], [],
                                   "")
    # -ffunction-sections in a build's own CFLAGS (no layout) is the user's: kept whole
    own = B.BuildSpec("mine", cflags=f"{B.BASE_CFLAGS} -ffunction-sections")
    assert B.make_flags(own)[:3] == ((), own.cflags, own.ldflags)
    assert B.make_flags(own).server_copt == ""
    # a layout: its seed and lld go to every make (LDFLAGS_EX), never to configure
    lay = B.make_flags(B.resolve_spec("vanilla@layout3"))
    assert "--shuffle-sections" not in lay.ldflags and "-fuse-ld=lld" not in lay.ldflags
    (ex,) = lay.make_vars
    assert ex.startswith("LDFLAGS_EX=") and "-fuse-ld=lld" in ex and "=3" in ex
    assert lay.server_vars == [ex, "COPT=-ffunction-sections"]
    # the spec (cache key, provenance) keeps saying what the build is
    assert "--enable-profiling" in B.resolve_spec("gprof").configure_opts
    assert "-ffunction-sections" in B.resolve_spec("vanilla@layout1").cflags


def test_modified_names_are_known_wherever_presets_are_checked():
    known = B.presets()
    for name in ("vanilla@layout7", "pg19/step5@clang", "tsc_clock@clang@layout1"):
        assert name in known and known[name].name == name
    assert "vanilla@layout0" not in known and "nope@clang" not in known
    assert "vanilla@icc" not in known
    # iteration lists the presets only (one modified name per seed would be endless)
    assert not any("@" in n for n in known)


@pytest.mark.parametrize("bad,msg", [
    ("vanilla@icc", "unknown modifier @icc"),
    ("vanilla@layout", "unknown modifier @layout"),
    ("vanilla@clang@gcc", "two compiler modifiers"),
    ("vanilla@layout1@layout2", "two @layout modifiers"),
    ("nope@clang", "unknown build 'nope'"),
])
def test_bad_modifiers_are_one_clear_error(bad, msg):
    with pytest.raises(BuildError, match=msg):
        B.resolve_spec(bad)


def test_cache_key_carries_compiler_and_layout_only_when_set(tmp_path):
    src = _src()
    pf = tmp_path / "x.patch"
    pf.write_text("header\ndiff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    files: list[Path] = []
    gcc = "gcc (Debian 12.2.0-14) 12.2.0"
    k_default = B.cache_key(B.resolve_spec("vanilla"), src, files, gcc)
    assert B.cache_key(B.resolve_spec("vanilla@gcc"), src, files, gcc) == k_default
    k_clang = B.cache_key(B.resolve_spec("vanilla@clang"), src, files, gcc)
    k_l1 = B.cache_key(B.resolve_spec("vanilla@layout1"), src, files, gcc)
    k_l2 = B.cache_key(B.resolve_spec("vanilla@layout2"), src, files, gcc)
    assert len({k_default, k_clang, k_l1, k_l2}) == 4
