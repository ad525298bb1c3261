"""The benchmark runner: a real interleaved run, a backend killed mid-run, a full disk.

Everything runs real PostgreSQL clusters of the cached vanilla build at tiny scales;
two labels on the vanilla preset (an A/A run) stand in for two builds, so no patched
build has to exist for these tests.
"""
from __future__ import annotations

import csv
import errno
import io
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import math

import numpy as np
import pandas as pd
import pytest
from conftest import kept_counts, kept_reps
from proc_helpers import alive

from profkit.experiments import bench
from profkit.experiments.bench import BenchError, ProfilesFull, ServerCrashed
from profkit.errors import ProfkitError
from profkit.pg.workloads import WorkloadError

pytestmark = pytest.mark.alone  # asserts times measured here: make test runs it alone

SUMMARY_COLUMNS = ["build", "mode", "n", "median_ms", "mean_ms", "variance", "overhead_pct",
                   "ci_low_pct", "ci_high_pct", "instr", "instr_overhead_pct", "pg_version",
                   "preset", "metric", "q25_ms", "plain_instr", "plain_median_ms", "plain_q25_ms",
                   "ref_build", "vs_ref_pct", "vs_ref_ci_low_pct", "vs_ref_ci_high_pct",
                   "vs_ref_instr_pct", "backends", "between_share_pct",
                   "vs_ref_between_share_pct", "note"]
MODES = ["plain", "analyze_notiming", "analyze_timing"]
SEED = 7  # an order seed whose first repetition interleaves the two builds (checked below)


def _extra(run_dir: Path) -> int:
    """The extra repetitions a calibrated run ran for the vCPU rule (provenance)."""
    x = json.loads((Path(run_dir) / "provenance.json").read_text())["extra_repetitions"]
    assert 0 <= x["extra_reps"] <= 3 and x["min_kept"] == 2, x
    return int(x["extra_reps"])


def _csv_rows(path: Path) -> list[dict[str, str]]:
    """The complete rows of a CSV file, also while the bench appends to it (the killer
    threads below poll it): one read, then only the lines that end in a newline.  Read
    through csv.DictReader straight from the file, an empty file could end the header's
    read and a row written a moment later become the first data row (a killer thread
    failed so, the bench ran to its end, and the test saw no crash)."""
    try:
        with open(path, newline="") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    return list(csv.DictReader(io.StringIO(text[:text.rfind("\n") + 1], newline="")))




# ---------------------------------------------------------------------------
# bad input: refused before anything starts


@pytest.mark.parametrize("kwargs, exc, text", [
    ({"builds": "nope"}, BenchError, "unknown build 'nope'; known presets:"),
    ({"builds": "vanilla,vanilla"}, BenchError, "given twice"),
    ({"builds": ""}, BenchError, "no builds given"),
    ({"workload": "nope"}, WorkloadError, "unknown workload 'nope'; known: nested_loop"),
    ({"scale": 0}, WorkloadError, "scale must be a number > 0"),
    ({"scale": -0.5}, WorkloadError, "scale must be a number > 0"),
    ({"scale": "abc"}, WorkloadError, "scale must be a number > 0"),
    ({"reps": 0}, BenchError, "reps must be an integer >= 1"),
    ({"reps": 2.5}, BenchError, "reps must be an integer >= 1"),
    ({"warmup": -1}, BenchError, "warmup must be an integer >= 0"),
    ({"min_kept": 3}, BenchError,
     "min_kept must be 'auto' or an integer from 0 to the repetitions (2), got 3"),
    ({"min_kept": "half"}, BenchError, "min_kept must be 'auto' or an integer"),
    ({"modes": ["analyze_timing"]}, BenchError, "modes must include 'plain'"),
    ({"modes": ["plain", "verbose"]}, BenchError, "unknown mode 'verbose'"),
    ({"settings": ["work_mem"]}, BenchError, "is not name=value"),
    ({"settings": {"work_mem": "1'; drop"}}, BenchError, "may not contain quotes"),
    ({"settings": {"shared_preload_libraries": "auto_explain"}}, BenchError,
     "must keep pg_stat_statements"),
])
def test_bad_input_is_refused_before_anything_starts(tmp_path, kwargs, exc, text):
    args = {"builds": "vanilla", "workload": "nested_loop", "scale": 0.01, "reps": 2,
            "out_dir": tmp_path / "run", "progress": None, "instructions": "none", **kwargs}
    t0 = time.monotonic()
    with pytest.raises(exc) as ei:
        bench.run_bench(**args)
    assert text in str(ei.value)
    assert isinstance(ei.value, ProfkitError)
    assert not (tmp_path / "run").exists(), "nothing may be written for bad input"
    assert time.monotonic() - t0 < 10, "validation must not start clusters or builds"


def test_parse_builds_arms_with_settings():
    """--builds takes timing-accuracy's arm syntax: [LABEL=]PRESET[:GUC=V,...]."""
    refs = bench.parse_builds("vanilla,pg19sys=pg19/vanilla:timing_clock_source=system,"
                              "pg19tsc=pg19/vanilla:timing_clock_source=tsc,jit=off,"
                              "a=step3,pg19/step3")
    assert [(r.label, r.preset, r.settings) for r in refs] == [
        ("vanilla", "vanilla", ()),
        ("pg19sys", "pg19/vanilla", (("timing_clock_source", "system"),)),
        # jit=off continues pg19tsc's settings; a=step3 names a preset: a new arm
        ("pg19tsc", "pg19/vanilla", (("timing_clock_source", "tsc"), ("jit", "off"))),
        ("a", "step3", ()),
        ("pg19-step3", "pg19/step3", ()),
    ]
    # a list keeps each item whole
    refs = bench.parse_builds(["t=vanilla:work_mem=8MB,jit=off"])
    assert refs[0].settings_dict == {"work_mem": "8MB", "jit": "off"}
    for bad, text in (("x=vanilla:nosetting", "is not name=value"),
                      ("x=vanilla:", "nothing after ':'"),
                      ("a b=vanilla", "labels: letters"),
                      ("x=vanilla:work_mem='1'", "may not contain quotes"),
                      ("x=nopreset:work_mem=1MB", "unknown build 'nopreset'"),
                      ("pg19/vanilla:a=1,pg19/vanilla:a=2", "given twice")):
        with pytest.raises(BenchError, match=text):
            bench.parse_builds(bad)


def test_cli_bad_input_exit_code_and_message(tmp_path):
    # (the other bad inputs take the same path: see the parametrized test above)
    for argv, text in ((["--builds", "vanilla,nope"], "unknown build 'nope'"),
                       (["--scale", "0", "--reps", "0"], "scale must be a number > 0"),
                       (["--reps", "2", "--min-kept", "3"],
                        "min_kept must be 'auto' or an integer from 0 to the repetitions (2)")):
        cp = subprocess.run([sys.executable, "-m", "profkit", "bench", *argv, "--out",
                             str(tmp_path / "p")], capture_output=True, text=True, timeout=120)
        assert cp.returncode == 1, cp.stderr  # a failure (ProfkitError), not usage
        assert text in " ".join(cp.stderr.split()), cp.stderr
        assert "Traceback" not in cp.stderr
    assert not any((tmp_path / "p").glob("*-*")), "no run directory for bad input"


def test_out_dir_not_empty_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "timings.csv").write_text("keep me\n")
    with pytest.raises(BenchError, match="never overwritten"):
        bench.run_bench("vanilla", "nested_loop", 0.01, 1, out_dir=tmp_path / "run",
                        progress=None, instructions="none")
    assert (tmp_path / "run" / "timings.csv").read_text() == "keep me\n"


@pytest.mark.pg
def test_arm_setting_the_build_does_not_have_is_a_clear_error(tmp_path, vanilla_build):
    with pytest.raises(BenchError, match=r"build 'x' \(preset vanilla\) did not start with its "
                       r"settings no_such_setting=1: is every name a setting of this build"):
        bench.run_bench("x=vanilla:no_such_setting=1", "nested_loop", 0.01, 1,
                        out_dir=tmp_path / "run", progress=None, instructions="none")


# ---------------------------------------------------------------------------
# pure helpers


def test_choose_instr_scale_shrinks_with_the_square_of_the_scale():
    rows = [{"build": b, "mode": m, "client_ms": ms} for b in ("vanilla", "step1")
            for m, ms in (("plain", 1000.0), ("analyze_notiming", 1300.0),
                          ("analyze_timing", 3000.0))]
    df = pd.DataFrame(rows)
    s, why = bench.choose_instr_scale("nested_loop", 0.1, df, budget_s=60)
    # estimate: 100 x (1 + 1 + 1.3 + 3) s + 5 s = 635 s -> 0.1 * sqrt(55 / 630) = 0.0295
    assert s == 0.029
    assert "635 s" in why and "0.029" in why
    same, why2 = bench.choose_instr_scale("nested_loop", 0.001, df.assign(
        client_ms=df["client_ms"] / 1e4), budget_s=60)
    assert same == 0.001 and why2.startswith("bench scale")


# ---------------------------------------------------------------------------
# a real run through the CLI


@pytest.fixture(scope="module")
def small_run(tmp_path_factory, vanilla_build):
    """`profkit bench` on two labels of vanilla (aa with settings), scale 0.01, 3 reps,
    callgrind at 0.005."""
    root = tmp_path_factory.mktemp("profiles")
    # aa: an arm with its own settings, one of them postmaster-context (max_connections)
    argv = [sys.executable, "-m", "profkit", "bench", "--builds",
            "vanilla,aa=vanilla:max_connections=42,statement_timeout=600000",
            "--workload", "nested_loop", "--scale", "0.01", "--reps", "3", "--warmup", "1",
            "--instructions", "callgrind", "--instr-scale", "0.005", "--seed", str(SEED),
            "--set", "work_mem=8MB", "--out", str(root)]
    t0 = time.monotonic()
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - t0
    assert cp.returncode == 0, cp.stderr[-3000:]
    run_dir = (root / "latest").resolve()
    return {"root": root, "dir": run_dir, "stdout": cp.stdout, "stderr": cp.stderr,
            "elapsed": elapsed}


@pytest.mark.pg
def test_timings_shape_and_interleaving(small_run):
    d = small_run["dir"]
    import re

    assert re.fullmatch(r"\d{8}-\d{6}-bench-nested_loop", d.name), d.name
    t = bench.load_timings(d)
    # 3 repetitions, and the extra ones the vCPU rule asked for (a cell kept fewer than 2)
    reps = 3 + _extra(d)
    assert len(t) == 2 * 3 * reps
    assert t.groupby(["build", "mode"]).size().to_dict() == {
        (b, m): reps for b in ("vanilla", "aa") for m in MODES}
    assert sorted(t["order"]) == list(range(6 * reps))
    for rep, g in t.groupby("rep"):
        assert sorted(g["slot"]) == list(range(6))
        assert g["order"].min() == (rep - 1) * 6
    # the order is the seeded shuffle, repetition by repetition (the extra ones continue it)
    rng = random.Random(SEED)
    pairs = [(b, m) for b in ("vanilla", "aa") for m in MODES]
    ts = t.sort_values("order")
    for rep in range(1, reps + 1):
        seq = pairs[:]
        rng.shuffle(seq)
        got = list(zip(ts[ts.rep == rep]["build"], ts[ts.rep == rep]["mode"], strict=True))
        assert got == seq
    builds_in_order = ts["build"].tolist()
    # not all of one build first: the builds alternate within repetitions
    assert any(builds_in_order[i] != builds_in_order[i + 1] for i in range(2)), builds_in_order
    assert builds_in_order[:9] != ["vanilla"] * 9 and builds_in_order[:9] != ["aa"] * 9
    # CSV streamed during the run == parquet written at the end
    c = pd.read_csv(d / "timings.csv")
    assert len(c) == 6 * reps
    assert (c.sort_values("order")["client_ms"].to_numpy()
            == ts["client_ms"].to_numpy()).all()


@pytest.mark.pg
def test_server_and_client_times_agree(small_run):
    t = bench.load_timings(small_run["dir"])
    assert (t["client_ms"] > 0).all() and (t["server_ms"] > 0).all()
    assert (t["client_ms"] >= t["server_ms"]).all(), "the client's time includes the server's"
    # the backend's on-CPU time: positive, never more than the client waited
    assert (t["cpu_ms"] > 0).all() and (t["cpu_ms"] <= t["client_ms"] + 1).all()
    ex = t[t["mode"] != "plain"]
    assert ex["explain_ms"].notna().all() and t.loc[t["mode"] == "plain", "explain_ms"].isna().all()
    # pg_stat_statements' time of EXPLAIN = EXPLAIN's Execution Time + planning + output
    gap = ex["server_ms"] - ex["explain_ms"]
    assert (gap >= 0).all() and (gap < 20).all(), gap.describe()
    # one backend per build for the whole run
    assert t.groupby("build")["backend_pid"].nunique().eq(1).all()


@pytest.mark.pg
def test_summary_overheads_and_instruction_counts(small_run):
    d = small_run["dir"]
    text = (d / "summary.csv").read_text()
    assert text.splitlines()[0] == ",".join(SUMMARY_COLUMNS)
    assert "The tables above use `cpu_kept_ms`" in (d / "report.md").read_text()
    s = pd.read_csv(d / "summary.csv")
    assert list(s.columns) == SUMMARY_COLUMNS and len(s) == 6
    v = s.set_index(["build", "mode"])
    # TIMING on reads the clock twice per row per node: far above plain
    assert v.loc[("vanilla", "analyze_timing"), "overhead_pct"] > 0
    assert v.loc[("vanilla", "plain"), "overhead_pct"] == 0
    # its interval: paired on the repetitions whose plain and TIMING-on executions the
    # vCPU calibration both kept; with fewer than two such pairs, the two kept samples
    # unpaired (stats._pair); none when either has fewer than two executions (a slow host
    # rejected 4 of these 18 executions once, leaving vanilla's plain query 1; a cold
    # make test once left one pair, and the interval came from the two samples unpaired)
    reps = kept_reps(d)
    plain_reps = reps.get(("vanilla", "plain"), set())
    timing_reps = reps.get(("vanilla", "analyze_timing"), set())
    pairs = len(plain_reps & timing_reps)
    ci_low = v.loc[("vanilla", "analyze_timing"), "ci_low_pct"]
    if pairs >= 2 or min(len(plain_reps), len(timing_reps)) >= 2:
        assert ci_low > 0, (pairs, len(plain_reps), len(timing_reps), ci_low)
    else:
        assert np.isnan(ci_low), (pairs, len(plain_reps), len(timing_reps), ci_low)
    # by cpu_ms, which keeps every execution, the interval is always there (report.md)
    row = next(ln for ln in (d / "report.md").read_text().splitlines()
               if ln.startswith("| vanilla | analyze_timing | ") and ln.count("[") >= 3)
    lo = float(row.split("|")[4].split("[")[1].split(",")[0])
    assert lo > 0, row
    # n: the executions kept (3 each and the extra repetitions, minus those a slow vCPU
    # calibration rejected): at least 2 (min_kept), unless the extra ones ran out
    kept, extra = kept_counts(d), _extra(d)
    short = json.loads((d / "provenance.json").read_text())["extra_repetitions"][
        "short_after_extra"]
    for (b, m), n in v["n"].items():
        assert n == kept.get((b, m), 0) and n <= 3 + extra, (b, m, n, extra)
        assert n >= 2 or (short and extra == 3), (b, m, n, extra, short)
    # instruction counts: one execution each, callgrind, at the scale asked for
    ic = bench.load_instructions(d)
    assert ic is not None and len(ic) == 6
    assert set(ic["tool"]) == {"callgrind"} and set(ic["scale"]) == {0.005}
    per = ic.set_index(["build", "mode"])["instructions"].astype(float)
    for m in MODES:  # A/A: the same binary executes the same instructions (±0.01 %)
        assert abs(per[("aa", m)] / per[("vanilla", m)] - 1) < 1e-4
    q2 = v.loc[("vanilla", "analyze_notiming"), "instr_overhead_pct"]
    q3 = v.loc[("vanilla", "analyze_timing"), "instr_overhead_pct"]
    assert 10 < q2 < q3, (q2, q3)  # row counting costs instructions; timing costs more
    assert v.loc[("vanilla", "plain"), "instr"] == per[("vanilla", "plain")]
    # issue 13's columns: both arms are PG18 vanilla; aa (own settings) is measured
    # against vanilla's plain Query-1, in time (CI) and instructions
    assert set(s["pg_version"].astype(str).str[:2]) == {"18"} and set(s["metric"]) == {
        "cpu_kept_ms"}
    assert set(s["ref_build"]) == {"vanilla"} and set(s["preset"]) == {"vanilla"}
    aa = v.loc[("aa", "plain")]
    assert abs(aa.vs_ref_instr_pct) < 0.01 and aa.plain_instr == per[("aa", "plain")]
    # its interval, like vanilla's above: paired on the repetitions whose plain executions
    # of both builds the vCPU calibration kept; with fewer than two such pairs, the two kept
    # samples unpaired (a CI run kept vanilla's three and two of aa's, one in common, and got
    # an unpaired interval); none when either has fewer than two executions (a CI run kept
    # one of aa's three once). From fewer than 4 repetitions the row's note says so.
    van_plain, aa_plain = reps.get(("vanilla", "plain"), set()), reps.get(("aa", "plain"), set())
    aa_pairs = len(van_plain & aa_plain)
    if aa_pairs >= 2 or min(len(van_plain), len(aa_plain)) >= 2:
        assert aa.vs_ref_ci_low_pct <= aa.vs_ref_pct <= aa.vs_ref_ci_high_pct, (
            aa_pairs, len(van_plain), len(aa_plain))
        n_used = aa_pairs if aa_pairs >= 2 else min(len(van_plain), len(aa_plain))
        assert ("vs_ref interval from" in str(aa.note)) == (n_used < 4), (n_used, aa.note)
    else:
        assert np.isnan(aa.vs_ref_ci_low_pct) and np.isnan(aa.vs_ref_ci_high_pct), (
            aa_pairs, len(van_plain), len(aa_plain))
    assert v.loc[("aa", "analyze_notiming"), "vs_ref_instr_pct"] == pytest.approx(
        (per[("aa", "analyze_notiming")] / per[("vanilla", "plain")] - 1) * 100, abs=1e-3)
    for f in ("report.md", "overheads.png", "overheads.svg"):
        assert (d / f).stat().st_size > 1000, f
    md = (d / "report.md").read_text()
    assert "29.36" in md and "Query-2 overhead" in md  # beside the seed's figure
    out = small_run["stdout"]
    assert "Q2 overhead" in out and "vanilla" in out and "latest" in out


@pytest.mark.pg
def test_vcpu_columns_present_and_plausible(small_run):
    """Issue 13 item 5: per execution, the vCPU calibration before and after on the pinned
    CPU, and the backend's context switches, migrations, faults and steal time."""
    d = small_run["dir"]
    t = bench.load_timings(d)
    p = json.loads((d / "provenance.json").read_text())
    cpu = max(os.sched_getaffinity(0))
    assert p["pin_cpu"] == cpu and p["vcpu_calibration"]["loops"] > 0
    for c in ("calib_before_ms", "calib_after_ms", "runq_ms", "vol_cs", "invol_cs",
              "migrations", "minflt", "majflt", "steal_ms", "steal_cpu_ms", "last_cpu"):
        assert t[c].notna().all(), c
        assert (t[c] >= 0).all(), c
    # ~3 ms of fixed work; the same work within a factor 4 (the worst swing seen here)
    assert t["calib_before_ms"].between(0.2, 100).all()
    ratio = pd.concat([t["calib_before_ms"], t["calib_after_ms"]])
    assert ratio.max() / ratio.median() < 4
    # pinned: the backends ran on that CPU and never migrated during an execution
    assert set(t["last_cpu"]) == {cpu} and (t["migrations"] == 0).all()
    # counts are whole numbers; steal is ticks (10 ms) times a whole number
    for c in ("vol_cs", "invol_cs", "minflt", "majflt"):
        assert (t[c] == t[c].round()).all(), c
    assert ((t["steal_ms"] / 10) == (t["steal_ms"] / 10).round()).all()
    md = (d / "report.md").read_text()
    assert "## The vCPU's speed and what disturbed the backends" in md
    assert "Query-2 overhead CI half-width by `cpu_kept_ms`" in md


@pytest.mark.pg
def test_provenance_fields(small_run):
    p = json.loads((small_run["dir"] / "provenance.json").read_text())
    assert p["status"] == "complete" and p["error"] is None
    for k in ("run_id", "started_at", "ended_at", "command_line", "workload", "scale", "reps",
              "warmup", "modes", "order_seed", "settings", "cluster_settings", "builds",
              "machine", "tools", "instruction_counter", "instr_scale", "backend_pids",
              "pgss_queryids", "server_settings", "loadavg_start", "loadavg_end"):
        assert k in p, k
    assert p["scale"] == 0.01 and p["reps"] == 3 and p["order_seed"] == SEED
    assert p["settings"] == {"work_mem": "8MB"}
    assert p["server_settings"]["vanilla"]["work_mem"] == "8192"
    # the aa arm's own settings: in its cluster (a postmaster-context one too), recorded
    assert p["builds"]["aa"]["arm_settings"] == {"max_connections": "42",
                                                 "statement_timeout": "600000"}
    assert p["builds"]["vanilla"]["arm_settings"] == {}
    assert p["arm_settings_shown"] == {"aa": {"max_connections": "42",
                                              "statement_timeout": "10min"}}
    assert p["server_settings"]["aa"]["max_connections"] == "42"
    assert p["server_settings"]["vanilla"]["max_connections"] != "42"
    t = bench.load_timings(small_run["dir"])
    assert set(t.loc[t["build"] == "aa", "settings"]) == {"max_connections=42,"
                                                          "statement_timeout=600000"}
    assert set(t.loc[t["build"] == "vanilla", "settings"]) == {""}
    assert p["command_line"][:2] == ["profkit", "bench"]
    for label in ("vanilla", "aa"):
        b = p["builds"][label]
        assert b["preset"] == "vanilla" and len(b["key"]) == 64
        assert b["pg_config"]["VERSION"].startswith("PostgreSQL 18")
        assert "CFLAGS" in b["pg_config"] and b["patches"] == []
    m = p["machine"]
    for k in ("cpu_model", "kernel", "clocksource", "virtualization", "governor", "cpus"):
        assert k in m, k
    assert m["kernel"] == os.uname().release
    assert p["instruction_counter"] == "callgrind" and p["instr_scale"] == 0.005
    assert "valgrind" in p["tools"]["valgrind"]
    # the clusters are gone
    for c in p["clusters"].values():
        assert not Path(c["dir"]).exists() and not alive(c["postmaster_pid"])


# ---------------------------------------------------------------------------
# a backend killed mid-run


@pytest.mark.pg
def test_backend_killed_mid_run_keeps_rows_and_names_build_and_rep(tmp_path, vanilla_build):
    out = tmp_path / "run"
    killed: dict[str, int] = {}
    stop = threading.Event()

    def killer() -> None:
        while not stop.is_set():
            rows = _csv_rows(out / "timings.csv")
            if len(rows) >= 4:
                pid = int(rows[-1]["backend_pid"])
                killed.update(pid=pid, rows_seen=len(rows))
                os.kill(pid, signal.SIGKILL)  # a crash, not pg_terminate_backend
                return
            time.sleep(0.01)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    try:
        with pytest.raises(ServerCrashed) as ei:
            bench.run_bench("vanilla", "nested_loop", 0.01, 60, warmup=1, out_dir=out,
                            progress=None, instructions="none", order_seed=1)
    finally:
        stop.set()
        th.join(10)
    msg = str(ei.value)
    assert "build 'vanilla'" in msg and "repetition" in msg, msg
    assert "terminated by signal 9" in msg, msg
    assert "rows measured before are kept" in msg
    rep = int(msg.split("repetition ")[1].split()[0])
    rows = _csv_rows(out / "timings.csv")
    assert len(rows) >= killed["rows_seen"] and len(rows) < 180
    assert ei.value.rows == len(rows) and ei.value.run_dir == out
    t = bench.load_timings(out)  # parquet salvaged from the same rows
    assert len(t) == len(rows) and t["client_ms"].gt(0).all()
    assert sorted(t["order"]) == list(range(len(rows)))
    assert t["rep"].max() <= rep
    p = json.loads((out / "provenance.json").read_text())
    assert p["status"] == "failed" and "terminated by signal 9" in p["error"]
    c = p["clusters"]["vanilla"]
    assert not alive(c["postmaster_pid"]) and not Path(c["dir"]).exists()
    assert "terminated by signal 9" in (out / "logs" / "postgres-vanilla.log").read_text()
    # the partial run still makes a report
    files = bench.write_report(out)
    assert files.summary_csv.exists()


# ---------------------------------------------------------------------------
# a full disk


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "full"
    mnt.mkdir()
    cp = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                        capture_output=True, text=True)
    if cp.returncode != 0 and os.geteuid() != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({cp.stderr.strip()}): needs root")
    assert cp.returncode == 0, f"mount -t tmpfs failed as root: {cp.stderr.strip()}"
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> None:
    """Write *path* until its file system is full (unbuffered: nothing left to flush)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"x" * 1024)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)


@pytest.mark.pg
def test_full_disk_keeps_rows_written(small_fs, vanilla_build):
    out = small_fs / "run"
    filled = threading.Event()
    stop = threading.Event()

    def filler() -> None:
        while not stop.is_set():
            if len(_csv_rows(out / "timings.csv")) >= 3:
                _fill(small_fs / "filler")
                filled.set()
                return
            time.sleep(0.005)

    th = threading.Thread(target=filler, daemon=True)
    th.start()
    try:
        with pytest.raises(ProfilesFull) as ei:
            bench.run_bench("vanilla", "nested_loop", 0.005, 400, modes=["plain"], warmup=1,
                            out_dir=out, progress=None, instructions="none")
    finally:
        stop.set()
        th.join(10)
    assert filled.is_set()
    msg = str(ei.value)
    assert msg.startswith("profiles folder is full: free space or choose --out"), msg
    rows = _csv_rows(out / "timings.csv")
    assert len(rows) >= 3 and ei.value.rows >= len(rows)
    # every row in the file is whole (the failed write was cut back)
    assert all(r["client_ms"] and r["rep"].isdigit() for r in rows)
    t = bench.load_timings(out)
    assert len(t) == len(rows)
    # the first provenance.json is intact
    assert json.loads((out / "provenance.json").read_text())["run_id"] == "run"


@pytest.mark.pg
def test_full_disk_before_start(small_fs, vanilla_build):
    _fill(small_fs / "filler")
    with pytest.raises(ProfilesFull, match="^profiles folder is full: free space or choose"):
        bench.run_bench("vanilla", "nested_loop", 0.005, 2, out_dir=small_fs / "run",
                        progress=None, instructions="none")


@pytest.mark.pg
def test_ctrl_c_stops_everything_and_keeps_rows(tmp_path, vanilla_build):
    root = tmp_path / "p"
    # SIGINT back to its default in the child: a shell may start us with it ignored
    p = subprocess.Popen(
        [sys.executable, "-m", "profkit", "bench", "--builds", "vanilla", "--scale", "0.01",
         "--reps", "200", "--instructions", "none", "--out", str(root)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            runs = list(root.glob("*-nested_loop"))
            if runs and len(_csv_rows(runs[0] / "timings.csv")) >= 5:
                break
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        _out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "interrupted; everything profkit started was stopped" in err
    run = runs[0]
    prov = json.loads((run / "provenance.json").read_text())
    assert prov["status"] == "interrupted" and prov["rows"] >= 5
    assert len(bench.load_timings(run)) == prov["rows"] == len(_csv_rows(run / "timings.csv"))
    c = prov["clusters"]["vanilla"]
    assert not alive(c["postmaster_pid"]) and not Path(c["dir"]).exists()


@pytest.mark.pg
def test_load_bench_reads_the_run_back(small_run):
    r = bench.load_bench(small_run["root"] / "latest")
    assert r.run_id == small_run["dir"].name and len(r.timings) == 6 * (3 + _extra(r.out_dir))
    s = r.summary()
    assert set(s["metric"]) == {"cpu_kept_ms"} and s["instr"].notna().all()
    assert "<table" in r._repr_html_()
    # the same numbers as summary.csv
    csv_s = pd.read_csv(small_run["dir"] / "summary.csv")
    # summary.csv keeps 3 decimals: equal to within that rounding
    assert csv_s["overhead_pct"].tolist() == pytest.approx(s["overhead_pct"].tolist(), abs=1e-3)


# ---------------------------------------------------------------------------
# nothing measured disappears; A/A; plans; backends (synthetic run directories)


def _synthetic_run(d: Path, *, reject_all: tuple[str, str] | None = None,
                   plan_differs: bool = False, backends: int = 4, reps: int = 12) -> Path:
    rng = np.random.default_rng(5)
    rows = []
    order = 0
    for rep in range(1, reps + 1):
        for build in ("vanilla", bench.AA_LABEL):
            for mode, ov in (("plain", 0.0), ("analyze_notiming", 20.0)):
                cpu = 100 * (1 + ov / 100) * (1 + rng.normal(0, 0.01))
                slow = reject_all == (build, mode)
                rows.append({"run_id": "syn", "build": build, "workload": "nested_loop",
                             "query": mode, "mode": mode, "rep": rep, "order": order,
                             "client_ms": cpu + 1, "server_ms": cpu, "cpu_ms": cpu,
                             "calib_before_ms": 3.0 * (2.0 if slow else 1.0) + rng.normal(0, .005),
                             "calib_after_ms": 3.0 + rng.normal(0, 0.005),
                             "preset": "vanilla", "settings": "",
                             "backend": (rep - 1) * backends // reps + 1})
                order += 1
    d.mkdir()
    pd.DataFrame(rows).to_csv(d / "timings.csv", index=False)
    prov = {"run_id": "syn", "kind": "bench", "workload": "nested_loop", "scale": 0.01,
            "reps": reps, "backends": backends, "aa_label": bench.AA_LABEL,
            "plan_differs": plan_differs,
            "plans": {"vanilla": "Aggregate\n  ->  Seq Scan on t",
                      bench.AA_LABEL: "Aggregate\n  ->  Index Scan on t" if plan_differs
                      else "Aggregate\n  ->  Seq Scan on t"},
            "builds": {b: {"preset": "vanilla", "source": {"version": "18.6"}}
                       for b in ("vanilla", bench.AA_LABEL)}}
    (d / "provenance.json").write_text(json.dumps(prov))
    return d


def test_rejected_cell_keeps_its_row_with_the_reason(tmp_path):
    d = _synthetic_run(tmp_path / "run", reject_all=("vanilla", "analyze_notiming"))
    files = bench.write_report(d)
    s = pd.read_csv(files.summary_csv)
    row = s[(s.build == "vanilla") & (s["mode"] == "analyze_notiming")].iloc[0]
    assert row.n == 0 and math.isnan(row.overhead_pct)
    assert "all 12 executions rejected" in row.note and "vCPU" in row.note
    assert len(s) == 4  # every (build, mode) measured has its row
    md = files.report_md.read_text()
    assert "vanilla analyze_notiming: all 12 executions rejected" in md
    assert any("all 12 executions rejected" in x for x in files.notes)


def test_rejected_plain_keeps_the_builds_rows_without_overhead(tmp_path):
    d = _synthetic_run(tmp_path / "run", reject_all=(bench.AA_LABEL, "plain"))
    s = bench.write_report(d).summary
    aa = s[s.build == bench.AA_LABEL].set_index("mode")
    assert aa.loc["plain", "n"] == 0 and aa.loc["analyze_notiming", "n"] == 12
    assert "no plain Query-1 of this build kept" in aa.loc["analyze_notiming", "note"]


def test_aa_arm_gives_the_smallest_detectable_difference(tmp_path):
    d = _synthetic_run(tmp_path / "run")
    files = bench.write_report(d)
    aa = files.aa
    assert aa is not None and aa.aa == bench.AA_LABEL and aa.ref == "vanilla"
    assert aa.ci_low_pct <= aa.diff_pct <= aa.ci_high_pct
    assert aa.detectable_pct == pytest.approx(max(abs(aa.ci_low_pct), abs(aa.ci_high_pct)))
    assert aa.detectable_pct < 5  # 1 % noise, 12 reps
    md = files.report_md.read_text()
    assert "the smallest difference this run could detect" in md
    assert "backends per build (fresh clusters): between-backend variance" in md
    s = pd.read_csv(files.summary_csv)
    assert set(s["backends"]) == {4}
    q2 = s[(s.build == "vanilla") & (s["mode"] == "analyze_notiming")].iloc[0]
    assert 0 <= q2.between_share_pct <= 100


def test_plan_differences_mark_every_row(tmp_path):
    d = _synthetic_run(tmp_path / "run", plan_differs=True)
    files = bench.write_report(d)
    s = pd.read_csv(files.summary_csv)
    assert s["note"].str.contains("plans differ between builds").all()
    md = files.report_md.read_text()
    assert "PLANS DIFFER" in md and "Index Scan on t" in md and "2 different plans" in md


def test_aa_and_backends_options_are_checked():
    req = bench.check_request("vanilla,step1", "nested_loop", 0.01, 10, aa=True)
    assert [r.label for r in req.refs] == ["vanilla", "step1", bench.AA_LABEL]
    assert req.refs[-1].preset == "vanilla" and req.backends == 10  # one per repetition
    assert bench.check_request("vanilla", "nested_loop", 0.01, 3).backends == 1
    with pytest.raises(BenchError, match="--aa repeats the vanilla build"):
        bench.check_request("step1", "nested_loop", 0.01, 10, aa=True)
    with pytest.raises(BenchError, match="must not exceed reps"):
        bench.check_request("vanilla", "nested_loop", 0.01, 3, backends=4)
    with pytest.raises(BenchError, match="backends must be"):
        bench.check_request("vanilla", "nested_loop", 0.01, 3, backends=0)


def test_layouts_option_runs_one_backend_per_layout():
    req = bench.check_request("vanilla,step2", "nested_loop", 0.01, 8, layouts=4, aa=True)
    assert req.layouts == 4 and req.backends == 4
    assert bench.layout_presets(req.refs[0], 4) == [f"vanilla@layout{i}" for i in (1, 2, 3, 4)]
    assert bench.layout_presets(req.refs[1], 4)[0] == "step2@layout1"
    # the A/A twin runs another layout than vanilla in every block
    aa = bench.layout_presets(req.refs[-1], 4)
    assert aa == ["vanilla@layout2", "vanilla@layout3", "vanilla@layout4", "vanilla@layout1"]
    assert all(x != y for x, y in zip(aa, bench.layout_presets(req.refs[0], 4), strict=True))
    assert bench.check_request("vanilla", "nested_loop", 0.01, 8).layouts == 0
    with pytest.raises(BenchError, match="one backend per layout"):
        bench.check_request("vanilla", "nested_loop", 0.01, 8, layouts=2, backends=4)
    with pytest.raises(BenchError, match="layouts must be"):
        bench.check_request("vanilla", "nested_loop", 0.01, 8, layouts=1)
    with pytest.raises(BenchError, match="without @variant"):
        bench.check_request("vanilla@layout1", "nested_loop", 0.01, 8, layouts=2)
    with pytest.raises(BenchError, match="must not exceed reps"):
        bench.check_request("vanilla", "nested_loop", 0.01, 3, layouts=4)


def test_session_gives_each_block_its_layout():
    from profkit.experiments import harness

    arm = harness.Arm("vanilla", "vanilla")
    s = harness.Session([arm], {"vanilla": ["L1", "L2", "L3"]}, name="t", log_dir=Path("."))
    assert [s.build_for(arm, b) for b in (1, 2, 3, 4)] == ["L1", "L2", "L3", "L1"]
    s = harness.Session([arm], {"vanilla": "B"}, name="t", log_dir=Path("."))
    assert s.build_for(arm, 3) == "B"
