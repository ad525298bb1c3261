"""Differentials from repeated recordings: the bootstrap on synthetic folded stacks with
known answers, its false-positive rate and power in simulation, the SVG it colours, and
the command line — none of it needs PostgreSQL (the recorded checks are in
tests/test_flamediff_pg.py)."""
from __future__ import annotations

import re

import numpy as np
import pytest
from click.testing import CliRunner

from profkit.analyze.flamediff import (
    COLUMNS,
    Recording,
    aa_flag_rate,
    bootstrap_diff,
    expanded_levels,
    frame_values,
    mean_profile,
    welch,
)
from profkit.errors import ComparisonError
from profkit.render.flamegraph import NOT_SIGNIFICANT_COLOR, render

# --------------------------------------------------------------------------- frame values


def test_frame_values_four_ways():
    counts = {"main;f;g": 2.0, "main;f": 1.0, "main;h;f;f": 4.0}
    assert frame_values(counts, key="path", basis="self") == counts
    assert frame_values(counts, key="path", basis="total") == {
        "main": 7.0, "main;f": 3.0, "main;f;g": 2.0, "main;h": 4.0, "main;h;f": 4.0,
        "main;h;f;f": 4.0}
    assert frame_values(counts, key="function", basis="self") == {"g": 2.0, "f": 5.0}
    # recursion: f counted once per stack
    assert frame_values(counts, key="function", basis="total") == {
        "main": 7.0, "f": 7.0, "g": 2.0, "h": 4.0}
    assert frame_values({}, key="path", basis="total") == {}
    assert frame_values({"a;b": 0.0}, key="path", basis="total") == {}


def test_mean_profile_is_per_execution():
    r1 = Recording({"m;a": 10.0, "m;b": 4.0}, executions=2, ms_per_sample=1000 / 500)
    r2 = Recording({"m;a": 30.0}, executions=1, ms_per_sample=1000 / 500)
    # r1: a 10 samples × 2 ms / 2 executions = 10 ms; r2: 60 ms -> mean 35
    assert mean_profile([r1, r2]) == pytest.approx({"m;a": 35.0, "m;b": 2.0})


# --------------------------------------------------------------------------- known answers

def _same(counts: dict[str, float], n: int, **kw) -> list[Recording]:
    return [Recording(dict(counts), **kw) for _ in range(n)]


def test_one_frame_changed_is_the_one_flagged():
    """A: 4 identical recordings; B: the same but m has 500 more samples. Only m (and its
    ancestors on the total basis) may be flagged, with the exact change; the sampling
    noise of identical recordings (Poisson) keeps the others grey."""
    a = _same({"main;x": 1000.0, "main;m": 1000.0, "main;y;z": 300.0}, 4)
    b = _same({"main;x": 1000.0, "main;m": 1500.0, "main;y;z": 300.0}, 4)
    d = bootstrap_diff(a, b, n_boot=2000, seed=1)
    assert list(d.table.columns) == list(COLUMNS)
    ps = d.lookup("path", "self")
    assert ps["main;m"]["flag"] == 1 and ps["main;m"]["change"] == 500.0
    assert 0 < ps["main;m"]["low"] < 500 < ps["main;m"]["high"]
    assert ps["main;m"]["change_pct"] == pytest.approx(50.0)
    assert ps["main;m"]["pct_low"] < 50 < ps["main;m"]["pct_high"]
    for f in ("main;x", "main;y;z"):
        assert ps[f]["flag"] == 0 and ps[f]["change"] == 0 and ps[f]["low"] < 0 < ps[f]["high"]
    pt = d.lookup("path", "total")
    assert pt["main"]["flag"] == 1 and pt["main"]["change"] == 500.0
    assert pt["main;y"]["flag"] == 0
    fs = d.lookup("function", "self")
    assert fs["m"]["flag"] == 1 and fs["x"]["flag"] == 0 and fs["z"]["flag"] == 0
    assert d.flag_rate("path", "self") == (1, 3)
    assert d.unit == "samples per recording"
    assert list(d.flagged("path", "self")["frame"]) == ["main;m"]


def test_cheaper_and_new_and_gone_frames():
    a = _same({"main;slow": 800.0, "main;gone": 400.0, "main;same": 500.0}, 3)
    b = _same({"main;slow": 400.0, "main;new": 300.0, "main;same": 500.0}, 3)
    d = bootstrap_diff(a, b, n_boot=2000, seed=2, keys=("path",), bases=("self",))
    ps = d.lookup()
    assert ps["main;slow"]["flag"] == -1 and ps["main;slow"]["change"] == -400
    assert ps["main;slow"]["high"] < 0 and ps["main;slow"]["change_pct"] == pytest.approx(-50)
    assert ps["main;gone"]["flag"] == -1 and ps["main;gone"]["b_present"] == 0
    assert ps["main;new"]["flag"] == 1 and ps["main;new"]["a_present"] == 0
    assert np.isnan(ps["main;new"]["change_pct"])         # new: no % of nothing
    assert ps["main;same"]["flag"] == 0


def test_a_frame_seen_a_handful_of_times_is_not_flagged():
    """One sample in each of B's recordings and none in A's: the recordings agree, but a
    recording could as well have had 0 samples (P = e^-1 each); the Poisson floor of the
    variance keeps the interval over 0, with or without resampling the samples too.
    30 samples in each of B's recordings is a frame B really has."""
    a = _same({"main;x": 1000.0}, 3)
    b = _same({"main;x": 1000.0, "main;rare": 1.0, "main;real": 30.0}, 3)
    for poisson in (False, True):
        d = bootstrap_diff(a, b, n_boot=4000, seed=3, keys=("path",), bases=("self",),
                           poisson=poisson)
        rare, real = d.lookup()["main;rare"], d.lookup()["main;real"]
        assert rare["flag"] == 0 and rare["low"] <= 0 < rare["high"], poisson
        assert real["flag"] == 1 and real["low"] > 0, poisson
        assert d.lookup()["main;x"]["flag"] == 0


def test_units_time_per_execution():
    """Samples × period / executions: a recording of 2 executions with twice the samples
    is the same time per execution as one of 1."""
    a = [Recording({"m;f": 100.0}, executions=1, ms_per_sample=1.0),
         Recording({"m;f": 200.0}, executions=2, ms_per_sample=1.0)]
    b = [Recording({"m;f": 300.0}, executions=2, ms_per_sample=2.0),
         Recording({"m;f": 150.0}, executions=1, ms_per_sample=2.0)]
    d = bootstrap_diff(a, b, n_boot=500, seed=0, keys=("path",), bases=("self",))
    r = d.lookup()["m;f"]
    assert d.unit == "ms per execution"
    assert r["a_mean"] == 100.0 and r["b_mean"] == 300.0 and r["change"] == 200.0
    assert r["flag"] == 1


def test_seed_and_resamples_are_stated_and_repeatable():
    rng = np.random.default_rng(5)
    a = [Recording({"m;a": float(rng.poisson(200)), "m;b": float(rng.poisson(50))})
         for _ in range(4)]
    b = [Recording({"m;a": float(rng.poisson(220)), "m;b": float(rng.poisson(50))})
         for _ in range(4)]
    d1 = bootstrap_diff(a, b, n_boot=1000, seed=7)
    d2 = bootstrap_diff(a, b, n_boot=1000, seed=7)
    d3 = bootstrap_diff(a, b, n_boot=1000, seed=8)
    assert d1.table.equals(d2.table)
    assert not d1.table[["low", "high"]].equals(d3.table[["low", "high"]])
    assert "B = 1000 resamples, seed 7" in d1.describe() and "4 + 4 recordings" in d1.describe()


def test_expansion_widens_small_samples():
    """The tail level of the expanded percentile interval: far in the tail with few
    recordings (Student's t), near the plain 2.5 % with many; a bootstrap narrower than
    the recordings' variance (ratio > 1) moves further out."""
    one = np.array([1.0])
    lev = {}
    for n in (2, 3, 5, 10, 50):
        target, df = welch(one, one, n, n)
        lev[n] = float(expanded_levels(target, target, df, 0.95)[0])
    assert lev[2] < lev[3] < lev[5] < lev[10] < lev[50] < 0.025
    assert lev[2] < 0.005 and 0.02 < lev[50]
    t, df = welch(one, one, 4, 4)
    assert df[0] == pytest.approx(6.0)
    assert expanded_levels(t, t / 2, df, 0.95)[0] < expanded_levels(t, t, df, 0.95)[0]
    z = np.array([0.0])
    tz, dfz = welch(z, z, 4, 4)
    assert dfz[0] == 3 and tz[0] == 0.0


@pytest.mark.parametrize("bad, text", [
    (dict(a=1), "at least 2 recordings"),
    (dict(n_boot=10), "n_boot must be"),
    (dict(confidence=1.0), "confidence"),
    (dict(empty=True), "has no samples"),
])
def test_bad_input_is_one_clear_error(bad, text):
    a = _same({"m": 10.0}, bad.get("a", 3))
    b = _same({"m": 10.0}, 3)
    if bad.get("empty"):
        b = [Recording({}, label="r2"), *b]
    kw = {k: v for k, v in bad.items() if k in ("n_boot", "confidence")}
    with pytest.raises(ComparisonError, match=text):
        bootstrap_diff(a, b, **kw)
    with pytest.raises(ComparisonError, match="executions"):
        Recording({"m": 1.0}, executions=0)
    with pytest.raises(ComparisonError, match="sample period"):
        Recording({"m": 1.0}, ms_per_sample=float("nan"))


# --------------------------------------------------------------------------- simulation

def _sim_recordings(rng: np.random.Generator, means: dict[str, float], n: int,
                    speed_sd: float) -> list[Recording]:
    """Recordings as this VM makes them: a per-recording speed factor that slows every
    frame alike (the vCPU's slow state, lognormal), then Poisson sampling per frame."""
    out = []
    for _ in range(n):
        k = float(np.exp(rng.normal(0.0, speed_sd)))
        out.append(Recording({s: float(rng.poisson(m * k)) for s, m in means.items()},
                             executions=1, ms_per_sample=1.0))
    return out


SIM_FRAMES = {f"main;exec;node{i}": float(m) for i, m in enumerate(
    [400, 250, 120, 80, 60, 40, 25, 15, 10, 6, 4, 2, 1, 0.5])}


def test_aa_false_positive_rate_in_simulation():
    """A/A in simulation (200 pairs of 4 + 4 recordings, 14 frames of 0.5-400 samples,
    a 10 % lognormal speed factor shared by a recording's frames): the share of frames
    flagged stays at or below 5 %; the frames of one comparison move together, so the
    per-comparison rates are printed too."""
    rng = np.random.default_rng(11)
    diffs = []
    for i in range(200):
        a = _sim_recordings(rng, SIM_FRAMES, 4, 0.10)
        b = _sim_recordings(rng, SIM_FRAMES, 4, 0.10)
        diffs.append(bootstrap_diff(a, b, n_boot=1000, seed=i, keys=("path",),
                                    bases=("self",)))
    hits, n = aa_flag_rate(diffs)
    rate = hits / n
    print(f"simulated A/A: {hits} of {n} frames flagged ({rate:.3%})")
    assert rate <= 0.05  # 1.6 % with this seed: small frames are rarely flagged at all
    assert n >= 200 * 12


def test_known_cost_detected_in_simulation():
    """The same noise, B with node3 (80 samples) 50 % dearer: flagged dearer in at least
    80 of 100 comparisons (86 with this seed), the other frames in at most 2 %."""
    rng = np.random.default_rng(12)
    b_means = dict(SIM_FRAMES)
    b_means["main;exec;node3"] *= 1.5
    found = others = n_others = 0
    for i in range(100):
        a = _sim_recordings(rng, SIM_FRAMES, 4, 0.10)
        b = _sim_recordings(rng, b_means, 4, 0.10)
        d = bootstrap_diff(a, b, n_boot=1000, seed=i, keys=("path",), bases=("self",))
        rows = d.lookup()
        found += rows["main;exec;node3"]["flag"] == 1
        for f, r in rows.items():
            if f != "main;exec;node3":
                others += r["flag"] != 0
                n_others += 1
    print(f"simulated known cost: found {found}/100, other frames flagged {others}/{n_others}")
    assert found >= 80
    assert others / n_others <= 0.02


# --------------------------------------------------------------------------- the SVG

def _flagged_diff():
    a = _same({"main;run;x": 1000.0, "main;run;m": 1000.0, "main;run;y": 400.0}, 4,
              executions=2, ms_per_sample=1.0)
    b = _same({"main;run;x": 1000.0, "main;run;m": 1500.0, "main;run;y": 200.0}, 4,
              executions=2, ms_per_sample=1.0)
    return b, bootstrap_diff(a, b, n_boot=1000, seed=0)


def _frame(svg: str, name: str) -> str:
    m = re.search(r'<g class="[^"]*" id="[^"]*" data-n="' + re.escape(name) + r'".*?</g>', svg)
    assert m, name
    return m.group(0)


def test_svg_colours_only_flagged_frames():
    b, d = _flagged_diff()
    svg = render(mean_profile(b), significance=d, min_width_px=0, id_prefix="fd",
                 count_name=d.unit)
    m, x, y, run = (_frame(svg, n) for n in ("m", "x", "y", "run"))
    assert 'data-flag="1"' in m and 'fill="rgb(255,0,0)"' in m       # the largest change
    assert 'data-flag="-1"' in y and 'fill="rgb(' in y and ",255)" in y  # cheaper: blue
    assert 'data-flag="0"' in x and f'fill="{NOT_SIGNIFICANT_COLOR}"' in x
    # no self samples: nothing to test on the self basis, grey
    assert "data-flag" not in run and f'fill="{NOT_SIGNIFICANT_COLOR}"' in run
    # hover text: the change with its interval, per execution and in %
    tip = re.search(r"<title>(.*?)</title>", m).group(1)
    assert "self 500.0 → 750.0 ms/exec, change +250.0 [" in tip and "= +50.0 % [" in tip
    assert "dearer" in tip and "total 500.0 → 750.0" in tip
    assert "no clear change: the interval includes 0" in re.search(r"<title>(.*?)</title>",
                                                                     x).group(1)
    assert 'data-diff="2"' in svg and "bootstrap interval of the self change excludes 0" in svg
    assert "1000 resamples, seed 0" in svg and "&quot;n_boot&quot;: 1000" not in svg
    assert '"n_boot": 1000' in svg  # the metadata JSON


def test_svg_share_based_is_labelled():
    svg = render({"a;b": 3.0}, diff_against={"a;b": 1.0, "a;c": 1.0}, min_width_px=0)
    assert "share-based differential" in svg and "a colour may be noise" in svg
    with pytest.raises(Exception, match="not both"):
        render({"a;b": 3.0}, diff_against={"a;b": 1.0}, significance=_flagged_diff()[1])


def test_svg_counts_what_only_a_had():
    a = _same({"main;x": 500.0, "main;gone;deep": 300.0}, 3)
    b = _same({"main;x": 500.0}, 3)
    d = bootstrap_diff(a, b, n_boot=500, seed=0)
    svg = render(mean_profile(b), significance=d, min_width_px=0)
    assert "300.0 samples/rec only in A, not drawn (1 of those frames flagged)" in \
        re.sub(r"</?tspan[^>]*>", " ", svg).replace("  ", " ")


# --------------------------------------------------------------------------- command line

def _write(folder, recs: list[dict[str, float]]):
    folder.mkdir()
    for i, c in enumerate(recs):
        (folder / f"r{i}.folded").write_text("".join(f"{k} {int(v)}\n" for k, v in c.items()))


def test_cli_diff_of_folders(tmp_path):
    from profkit.cli import main

    _write(tmp_path / "A", [{"main;x": 1000, "main;m": 1000}] * 3)
    _write(tmp_path / "B", [{"main;x": 1000, "main;m": 1600}] * 3)
    out = tmp_path / "d.svg"
    r = CliRunner().invoke(main, ["flamegraph", "--diff", str(tmp_path / "A"),
                                  str(tmp_path / "B"), "-o", str(out), "--resamples", "500"])
    assert r.exit_code == 0, r.output
    assert "3 + 3 recordings, samples per recording" in r.output
    assert "B = 500 resamples, seed 0" in r.output
    assert re.search(r"dearer\s+m\s+1000\.000 →\s+1600\.000 samples/rec", r.output)
    assert "by function, self: 1 of 2 frames flagged" in r.output
    assert out.exists() and 'data-diff="2"' in out.read_text()


@pytest.mark.parametrize("setup, text", [
    ("one", "at least 2 recordings"),
    ("mixed", "two folders of recordings or two files"),
    ("empty", "no perf runs and no .folded files"),
])
def test_cli_diff_of_folders_bad_input(tmp_path, setup, text):
    from profkit.cli import main

    _write(tmp_path / "A", [{"main;x": 10}] * (1 if setup == "one" else 3))
    if setup == "empty":
        (tmp_path / "B").mkdir()
    else:
        _write(tmp_path / "B", [{"main;x": 10}] * 3)
    b = str(tmp_path / "B" / "r0.folded") if setup == "mixed" else str(tmp_path / "B")
    r = CliRunner().invoke(main, ["flamegraph", "--diff", str(tmp_path / "A"), b])
    assert r.exit_code in (1, 2), r.output
    assert text in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("argv, text", [
    (["perf", "vanilla", "step3", "--recordings", "1"], "recordings must be an integer >= 2"),
    (["perf", "vanilla", "nosuch"], "unknown build 'nosuch'"),
    (["perf", "vanilla", "step3", "step4"], "3 builds"),
    (["perf", "vanilla", "--recordings", "3"], "go with two builds"),
    (["perf", "vanilla", "step3", "--pid", "1"], "not --pid/--dsn"),
])
def test_cli_two_build_perf_refuses_bad_input_before_work(argv, text):
    from profkit.cli import main

    r = CliRunner().invoke(main, argv)
    assert r.exit_code in (1, 2), r.output
    assert text in r.output and "Traceback" not in r.output


def test_check_request_labels_an_aa_pair():
    from profkit.experiments.flamediff import FlameDiffError, check_request

    req = check_request("vanilla", "vanilla", recordings=3, order_seed=1)
    assert [a.label for a in req.arms] == ["vanilla-a", "vanilla-b"]
    assert {a.preset for a in req.arms} == {"vanilla"} and req.backends == 3
    with pytest.raises(FlameDiffError, match="backends must be"):
        check_request("vanilla", "step3", recordings=3, backends=4)


def _perf_run(folder, rid: str, counts: dict[str, int], *, freq: int = 500,
              executions: int = 2, query: str = "SELECT 1"):
    """A folder as record_diff leaves one recording: provenance and folded stacks."""
    import json

    d = folder / rid
    d.mkdir(parents=True)
    (d / "provenance.json").write_text(json.dumps({
        "run_id": rid, "kind": "perf", "tool": "perf", "executions": executions,
        "reps": executions, "query": query, "perf": {"freq": freq}}))
    (d / "stacks.folded").write_text("".join(f"{k} {v}\n" for k, v in counts.items()))


def test_read_recordings_of_perf_runs_is_per_execution(tmp_path):
    from profkit.experiments.flamediff import FlameDiffError, diff_from_dirs, read_recordings

    for i in range(3):
        _perf_run(tmp_path / "A", f"r{i + 1:02d}",
                  {"postgres;ExecProcNodeInstr;ExecMaterial": 100, "postgres;x": 50})
        _perf_run(tmp_path / "B", f"r{i + 1:02d}",
                  {"postgres;ExecProcNodeInstr;ExecMaterial": 160, "postgres;x": 50})
    recs, runs = read_recordings(tmp_path / "A", align=True)
    assert len(recs) == len(runs) == 3
    # 100 samples at 500 Hz (2 ms each) over 2 executions = 100 ms per execution
    assert recs[0].scale == 1.0 and recs[0].counts == {"postgres;ExecMaterial": 100.0,
                                                        "postgres;x": 50.0}
    res = diff_from_dirs(tmp_path / "A", tmp_path / "B", align=True, n_boot=500)
    r = res.diff.lookup("function", "self")["ExecMaterial"]
    assert res.diff.unit == "ms per execution"
    assert (r["a_mean"], r["b_mean"], r["flag"]) == (100.0, 160.0, 1)
    assert res.diff.lookup("function", "self")["x"]["flag"] == 0
    # different queries on the two sides: refused
    _perf_run(tmp_path / "C", "r01", {"postgres;x": 5}, query="SELECT 2")
    _perf_run(tmp_path / "C", "r02", {"postgres;x": 5}, query="SELECT 2")
    with pytest.raises(FlameDiffError, match="same query"):
        diff_from_dirs(tmp_path / "A", tmp_path / "C")
    _perf_run(tmp_path / "D", "r01", {"postgres;x": 5}, query="SELECT 2")
    _perf_run(tmp_path / "D", "r02", {"postgres;x": 5}, query="SELECT 3")
    with pytest.raises(FlameDiffError, match="different queries"):
        read_recordings(tmp_path / "D")


def test_svg_draws_what_only_a_had_at_a_width():
    """union_profile: a frame that vanished (ExecProcNodeInstr in step3) is drawn at A's
    width and shows blue when its interval excludes 0."""
    from profkit.analyze.flamediff import union_profile

    a = _same({"main;x": 500.0, "main;gone;deep": 300.0}, 3)
    b = _same({"main;x": 500.0}, 3)
    d = bootstrap_diff(a, b, n_boot=500, seed=0)
    assert union_profile(a, b) == {"main;x": 500.0, "main;gone;deep": 300.0}
    svg = render(union_profile(a, b), significance=d, min_width_px=0)
    deep = _frame(svg, "deep")
    assert 'data-flag="-1"' in deep and "(300.0 samples/rec only in A," in deep
    import html

    flat = html.unescape(re.sub(r"</?tspan[^>]*>", " ", svg).replace("  ", " "))
    assert "and A's for the frames only A has (300.0 samples/rec, 1 of them flagged)" in flat
    assert "not drawn" not in flat
