"""Code layout as a build modifier: ``vanilla@layout1`` and ``vanilla@layout2`` are the same
code linked in two function orders (-ffunction-sections, lld --shuffle-sections=SEED).

They must execute the same instructions (callgrind) at different addresses (nm): what
separates their CPU times is layout alone, the variance a benchmark must treat as random.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import headline_module

from profkit.processes import run

ROOT = Path(__file__).resolve().parent.parent
LAYOUTS = ("vanilla@layout1", "vanilla@layout2")
HOT = ("ExecNestLoop", "ExecMaterial", "ExecProcNodeInstr", "InstrStopNode", "ExecAgg",
       "ExecInterpExpr", "heap_getnextslot", "tuplestore_gettupleslot")

pytestmark = [pytest.mark.pg, pytest.mark.alone, pytest.mark.builds(*LAYOUTS)]




def _symbols(postgres: Path) -> dict[str, int]:
    out = {}
    for line in run(["nm", "--defined-only", str(postgres)], timeout=120).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tT":
            out[parts[2]] = int(parts[0], 16)
    return out


@pytest.fixture(scope="module")
def layouts():
    from profkit.pg.build import get_build

    return [get_build(n, progress=print) for n in LAYOUTS]


def test_layouts_are_cached_builds_with_their_seed_in_provenance(layouts):
    keys = {b.key for b in layouts}
    assert len(keys) == 2
    for b, seed in zip(layouts, (1, 2), strict=True):
        prov = b.provenance()
        assert prov["layout"] == seed and prov["cc"] == "gcc"
        assert f"--shuffle-sections=.text*={seed}" in prov["ldflags"]
        assert "-ffunction-sections" in prov["cflags"]
        assert json.loads((b.dir / "build.json").read_text())["spec"]["layout"] == seed
        # pg_config reports what the binary was linked with: the seed went to make as
        # LDFLAGS_EX (PostgreSQL's link flags for its executables), not to configure, and
        # so did the linker that reads it
        assert f"--shuffle-sections=.text*={seed}" in b.pg_config.get("LDFLAGS_EX", "")
        assert "-fuse-ld=lld" in b.pg_config.get("LDFLAGS_EX", "")
        assert "--shuffle-sections" not in b.pg_config.get("LDFLAGS", "")
        assert "-fuse-ld=lld" not in b.pg_config.get("LDFLAGS", "")
        # -ffunction-sections went to the server's code only, as make's COPT
        assert b.timings["server_copt"] == "-ffunction-sections"


def test_a_layout_is_configured_as_its_build_without_it(layouts, vanilla_build):
    """configure saw vanilla's options (build.make_flags): the
    same pg_config.h, which every file includes, so every object outside the server's
    code is vanilla's, a ccache hit."""
    plain = (vanilla_build.dir / "build" / "src" / "include" / "pg_config.h").read_bytes()
    for b in layouts:
        assert (b.dir / "build" / "src" / "include" / "pg_config.h").read_bytes() == plain


def test_the_seed_leaves_the_compiled_objects_alone(layouts):
    """configure writes its arguments into pg_config.h, which every file includes: a seed
    given to configure made the second layout miss 1,016 of ccache's 1,233 objects in a
    cold make test.  The two layouts' pg_config.h are now the same file, and the one built
    second compiles only src/common (whose objects carry the link flags for pg_config:
    141 objects) and what links."""
    h1, h2 = (b.dir / "build" / "src" / "include" / "pg_config.h" for b in layouts)
    assert h1.read_bytes() == h2.read_bytes()
    first, second = sorted((json.loads((b.dir / "build.json").read_text()) for b in layouts),
                           key=lambda d: d["built_at"])
    misses = second["timings"]["ccache"]["cache_miss"]
    assert misses <= 200, (f"{second['name']}, built after {first['name']}, missed {misses} "
                           "objects in ccache (the other layout's objects should hit)")


def test_same_functions_at_other_addresses(layouts):
    a, b = (_symbols(x.postgres) for x in layouts)
    assert set(a) == set(b)  # the same functions ...
    moved = [f for f in HOT if a[f] != b[f]]
    assert len(moved) == len(HOT), moved  # ... each hot one placed elsewhere
    # and not merely shifted together: the order of the hot functions differs
    assert sorted(HOT, key=a.__getitem__) != sorted(HOT, key=b.__getitem__)


def test_same_instructions_under_callgrind(layouts):
    mod = headline_module()
    modes = ("plain", "analyze_notiming")
    mod.measure_many([(n, "nested_loop", 0.01, modes) for n in LAYOUTS])  # side by side
    c1, c2 = (mod.measure_once(n, "nested_loop", 0.01, modes).instructions for n in LAYOUTS)
    # the same code: the counts agree within the scatter of one binary counted twice
    # (paths, pids and the digits EXPLAIN prints differ between clusters: a CI run saw
    # 1,549 of 113.9 M instructions, 0.0014 %, so the bound is 0.01 %)
    for m in modes:
        assert abs(c1[m] - c2[m]) / c1[m] < 1e-4, (m, c1, c2)


def test_bench_with_layouts_runs_each_backend_on_its_layout(layouts, tmp_path, monkeypatch):
    from profkit.experiments import harness
    from profkit.experiments.bench import load_timings, run_bench

    started: list[tuple[str, str]] = []  # (cluster name, build it was started from)
    real_start = harness.Clusters.start

    def spy(self, build, name, *a, **kw):
        started.append((name, build.name))
        return real_start(self, build, name, *a, **kw)

    monkeypatch.setattr(harness.Clusters, "start", spy)
    res = run_bench("vanilla", "nested_loop", scale=0.01, reps=2, modes=("plain",),
                    out_dir=tmp_path / "run", progress=False, instructions="none",
                    layouts=2, calibrate=False, pin_cpu=None)
    prov = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert prov["status"] == "complete" and prov["layouts"] == 2 and prov["backends"] == 2
    assert prov["layout_builds"] == {"vanilla": list(LAYOUTS)}
    t = load_timings(tmp_path / "run")
    assert sorted(t["backend"].unique().tolist()) == [1, 2]
    assert len(t) == 2 and (t["server_ms"] > 0).all()
    # backend 1 ran layout 1's binary, backend 2 layout 2's
    assert started == [("bench-vanilla-b1", "vanilla@layout1"),
                       ("bench-vanilla-b2", "vanilla@layout2")], started
    assert res.summary().loc[0, "backends"] == 2
