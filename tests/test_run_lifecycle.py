"""The one run lifecycle (profkit.rundir.open_run) and every kind of run found by the loader.

The first tests drive :func:`profkit.rundir.open_run` itself (complete, failed,
interrupted, a full disk, ``latest``); the last one makes every kind of run profkit has
(bench, timing accuracy, observers, correction, a perf profile, the probes, the clock
cost, the notebook's own runs and the ``%%profkit`` collectors that write a folder) in
one profiles folder and reads each back with ``load_run``/``list_runs``: each ends with
one final status, a failing ``%%profkit`` cell's too.
"""
from __future__ import annotations

import errno
import json
import os

import pytest

from profkit import rundir


def _prov(d):
    return json.loads((d / "provenance.json").read_text())


def test_open_run_complete_writes_status_and_latest(tmp_path):
    with rundir.open_run("bench", words=("nested_loop",), base=tmp_path, latest=True,
                         scale=0.01) as rd:
        assert _prov(rd.path)["status"] == "running"  # written before the body runs
        rd.update(rows=3)
    p = _prov(rd.path)
    assert p["status"] == "complete" and p["error"] is None and p["rows"] == 3
    assert p["kind"] == "bench" and p["scale"] == 0.01 and p["ended_at"]
    assert len(p["loadavg_start"]) == 3 and len(p["loadavg_end"]) == 3
    assert p["machine"]["cpus"] == os.cpu_count()
    assert os.readlink(tmp_path / "latest") == rd.path.name
    assert rundir.load_run(None, root=tmp_path).run_id == rd.run_id


def test_open_run_failed_and_interrupted_keep_their_files(tmp_path):
    with pytest.raises(ValueError, match="boom"):
        with rundir.open_run("observers", base=tmp_path, run_id="f", latest=True) as rd:
            rd.file("rows.csv").write_text("a\n1\n")
            raise ValueError("boom")
    p = _prov(tmp_path / "f")
    assert p["status"] == "failed" and p["error"] == "ValueError: boom"
    assert (tmp_path / "f" / "rows.csv").read_text() == "a\n1\n"
    assert not (tmp_path / "latest").exists()  # latest only points at a completed run
    with pytest.raises(KeyboardInterrupt):
        with rundir.open_run("bench", base=tmp_path, run_id="i"):
            raise KeyboardInterrupt
    assert _prov(tmp_path / "i")["status"] == "interrupted"
    assert _prov(tmp_path / "i")["error"] == "KeyboardInterrupt"


def test_open_run_full_disk_is_one_error(tmp_path):
    with pytest.raises(rundir.RunDiskFull, match="^profiles folder is full: free space or "
                       "choose --out") as ei:
        with rundir.open_run("bench", base=tmp_path, run_id="d"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "x")
    assert ei.value.run_dir == tmp_path / "d" and ei.value.oserror.errno == errno.ENOSPC
    assert _prov(tmp_path / "d")["status"] == "failed"


def test_never_overwritten_is_checked_once(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(rundir.RunDirError, match="not empty"):
        rundir.place("bench", path=tmp_path / "full")
    with pytest.raises(rundir.RunDirError, match="not empty"):
        with rundir.open_run("bench", path=tmp_path / "full"):
            pass
    (tmp_path / "empty").mkdir()
    rid, p = rundir.place("bench", path=tmp_path / "empty")
    assert rid == "empty" and p == tmp_path / "empty"


def test_old_ok_reads_as_complete(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    (d / "provenance.json").write_text(json.dumps({"run_id": "old", "kind": "perf",
                                                   "status": "ok"}))
    rd = rundir.load_run(d)
    assert rd.provenance["status"] == "ok"  # read exactly as written
    assert rd.status == "complete"
    assert [r.run_id for r in rundir.list_runs(tmp_path, kind="perf")] == ["old"]


def test_clock_cost_and_notebook_runs_are_found(tmp_path, monkeypatch):
    from profkit.experiments.probe import clock_cost
    from profkit.lab.notebook import open_run, save_run

    import pandas as pd

    monkeypatch.setenv("PROFKIT_PROFILES", str(tmp_path))
    _cost, _df, d = clock_cost(sources=["clock_monotonic"], loops=10_000, repeats=1)
    saved = save_run("notebook-own", {"t": pd.DataFrame({"a": [1]})}, workload="nested_loop")
    assert saved.table("t")["a"].tolist() == [1]
    with open_run("notebook-collect") as nb:
        assert rundir.load_run(nb.path).status == "running"  # written before the body
        (nb.path / "out.txt").write_text("x")
    with pytest.raises(RuntimeError, match="tool died"):
        with open_run("notebook-broken"):
            raise RuntimeError("tool died")
    runs = {r.kind: r for r in rundir.list_runs(tmp_path)}
    assert runs["clock-cost"].path == d and runs["clock-cost"].status == "complete"
    assert runs["notebook-own"].status == "complete"
    assert runs["notebook-own"].provenance["workload"] == "nested_loop"
    assert runs["notebook-own"].provenance["machine"]["cpus"] == os.cpu_count()
    assert runs["notebook-collect"].status == "complete"
    assert runs["notebook-broken"].status == "failed"
    assert runs["notebook-broken"].provenance["error"] == "RuntimeError: tool died"


def test_a_second_handle_on_the_run_keeps_its_facts(tmp_path):
    """A collector that folds the run through its own load_run (perf's fold_run) writes
    facts the run's handle has not seen: the final status does not put them back."""
    with rundir.open_run("perf", base=tmp_path, run_id="r") as rd:
        other = rundir.load_run(rd.path)
        other.add_artifact("stacks.folded", "folded stacks")
        other.finish(status="complete", samples_folded=12)
    p = _prov(tmp_path / "r")
    assert p["status"] == "complete" and p["samples_folded"] == 12
    assert p["artifacts"] == {"stacks.folded": "folded stacks"}


@pytest.mark.pg
@pytest.mark.builds("vanilla")
def test_every_kind_of_run_is_found_with_its_provenance(tmp_path, monkeypatch, vanilla_build):
    from profkit.experiments import bench, correction, observers, probe, profile
    from profkit.experiments import timing_accuracy
    from profkit.lab import magics
    from profkit.pg.cluster import Cluster

    root = tmp_path / "profiles"
    monkeypatch.setenv("PROFKIT_PROFILES", str(root))
    monkeypatch.setenv("PROFKIT_FLAMEGRAPHS", str(tmp_path / "fg"))
    bench.run_bench("vanilla", "nested_loop", 0.005, 2, progress=None, instructions="none",
                    calibrate=False, pin_cpu=None)
    timing_accuracy.run_timing_accuracy(["vanilla", "b=vanilla"], {"nested_loop": 0.005},
                                        reps=1, clock_cost=False, nice=None)
    profile.perf_profile(vanilla_build, scale=0.005, stat=False)
    probe.clock_cost(sources=["clock_monotonic"], loops=10_000, repeats=1)
    observers.measure_observers("vanilla", workload="nested_loop", scale=0.005,
                                methods=["perf-99"], reps=1, warmup=0)
    with Cluster(vanilla_build, name="lifecycle") as cl:
        correction.measure_correction(cl, workloads={"nested_loop": 0.005}, reps=2,
                                      clock_loops=10_000, clock_repeats=1)
        with cl.connect() as conn:
            sql = "SELECT count(*) FROM generate_series(1, 1000)"
            with rundir.open_run("clock-calls", sql=sql) as rd:
                probe.clock_calls(conn, sql, methods=("ltrace",), out_dir=rd.path,
                                  run_id=rd.run_id)
    try:
        for collector in ("ltrace", "bpf", "callgrind"):
            magics.run_cell(f"--build vanilla --collector {collector}",
                            "SELECT count(*) FROM generate_series(1, 1000)")
    finally:
        magics.REGISTRY.stop()
    runs = rundir.list_runs(root)
    kinds = sorted({r.kind for r in runs})
    assert kinds == sorted({"bench", "timing_accuracy", "perf", "clock-cost", "observers",
                            "correction", "clock-calls", "magic-ltrace",
                            "magic-bpf", "magic-callgrind"}), kinds
    for r in runs:
        again = rundir.load_run(r.path)
        assert again.provenance["machine"]["cpus"] == os.cpu_count(), r.run_id
        assert again.provenance["started_at"] and again.provenance["argv"], r.run_id
    # every run ends with one final status, the magic cells' and the probes' too
    finished = {r.kind: r.status for r in runs}
    assert set(finished.values()) == {"complete"}, finished


@pytest.mark.pg
@pytest.mark.builds("vanilla")
def test_a_failing_magic_cell_marks_its_run_failed(tmp_path, monkeypatch):
    import psycopg

    from profkit.lab import magics

    root = tmp_path / "profiles"
    monkeypatch.setenv("PROFKIT_PROFILES", str(root))
    try:
        for collector in ("perf", "ltrace"):
            with pytest.raises(psycopg.errors.UndefinedTable):
                magics.run_cell(f"--build vanilla --collector {collector}",
                                "SELECT * FROM no_such_table")
    finally:
        magics.REGISTRY.stop()
    runs = {r.kind: r for r in rundir.list_runs(root)}
    assert sorted(runs) == ["magic-ltrace", "magic-perf"]
    for kind, r in runs.items():
        again = rundir.load_run(r.run_id, root=root)
        assert again.status == "failed", kind
        assert again.provenance["error"].startswith("UndefinedTable: relation "
                                                    '"no_such_table" does not exist'), kind
        assert again.provenance["build_name"] == "vanilla" and again.provenance["ended_at"]
