"""profkit.rundir: the one run-id format, create/load, fsync'd rows, provenance, latest."""
from __future__ import annotations

import json
import os
import re

import pandas as pd
import pytest

from profkit import rundir
from profkit.errors import ComparisonError


def test_check_comparable_refuses_differing_checked_fields():
    a = {"run_id": "a", "workload": "nested_loop", "scale": 0.1, "source": {"version": "18.6"},
         "machine": {"cpu_model": "X", "kernel": "6.1", "clocksource": "tsc",
                     "virtualization": "kvm", "cpus": 2}}
    b = json.loads(json.dumps(a))
    assert rundir.check_comparable(a, b) == {}
    b["machine"]["clocksource"] = "hpet"
    del b["machine"]["kernel"]  # missing is different, never filled in
    with pytest.raises(ComparisonError, match="clocksource: 'tsc' vs 'hpet'"):
        rundir.check_comparable(a, b)
    diff = rundir.check_comparable(a, b, force=True)
    assert diff == {"machine.kernel": ("6.1", None), "machine.clocksource": ("tsc", "hpet")}


def test_update_latest_points_at_newest(tmp_path):
    (tmp_path / "r1").mkdir()
    (tmp_path / "r2").mkdir()
    rundir.update_latest(tmp_path / "r1")
    rundir.update_latest(tmp_path / "r2")
    assert os.readlink(tmp_path / "latest") == "r2"
    (tmp_path / "latest").unlink()
    (tmp_path / "latest").mkdir()
    with pytest.raises(rundir.RunDirError, match="not a symlink"):
        rundir.update_latest(tmp_path / "r1")



def test_run_ids_have_one_format_and_never_collide(tmp_path):
    rid = rundir.new_run_id("bench", "nested_loop", root=tmp_path)
    assert re.fullmatch(r"\d{8}-\d{6}-bench-nested_loop", rid), rid
    (tmp_path / rid).mkdir()
    again = rundir.new_run_id("bench", "nested_loop", root=tmp_path)
    assert again != rid and not (tmp_path / again).exists()
    assert rundir.new_run_id("perf", "a b/c", None).endswith("-perf-a_b_c")


def test_new_run_then_load_run_reads_back_exactly(tmp_path):
    rd = rundir.new_run("observers", base=tmp_path, run_id="r1", workload="join_sum",
                        scale=0.02)
    rd.update(status="running")
    rd.finish(status="ok")  # the old word is written as the one word for a finished run
    got = rundir.load_run(tmp_path / "r1")
    assert got.run_id == "r1" and got.kind == "observers"
    assert got.provenance["scale"] == 0.02 and got.provenance["status"] == "complete"
    assert got.status == "complete"
    assert got.provenance["machine"]["cpus"] == os.cpu_count()
    assert rundir.load_run("r1", root=tmp_path).path == got.path
    rundir.update_latest(got.path)
    assert rundir.load_run(None, root=tmp_path).run_id == "r1"
    with pytest.raises(rundir.RunDirError, match="never overwritten"):
        rundir.new_run("observers", base=tmp_path, run_id="r1")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(rundir.RunDirError, match="not empty"):
        rundir.new_run("bench", path=tmp_path / "full")


def test_load_run_refuses_what_is_not_a_run(tmp_path):
    with pytest.raises(rundir.RunDirError, match="no run directory"):
        rundir.load_run(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(rundir.RunDirError, match="provenance.json is missing"):
        rundir.load_run(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "provenance.json").write_text("{not json")
    with pytest.raises(rundir.RunDirError, match="not valid JSON"):
        rundir.load_run(tmp_path / "bad")


def test_an_old_run_loads_as_written(tmp_path):
    # a run written before rundir existed (bench's own id format, no "kind" field)
    d = tmp_path / "20261129-101500-nested_loop"
    d.mkdir()
    (d / "provenance.json").write_text(json.dumps({"run_id": d.name, "workload": "nested_loop",
                                                   "machine": {"kernel": "6.1"}}))
    rd = rundir.load_run(d)
    assert rd.run_id == d.name and rd.get("machine.kernel") == "6.1"
    assert rd.get("machine.cpu_model") is None  # never filled in from this machine


def test_row_writer_appends_whole_rows(tmp_path):
    p = tmp_path / "rows.csv"
    with rundir.RowWriter(p, ("a", "b")) as w:
        w.write({"a": 1, "b": 0.5})
        w.write({"a": 2, "b": float("nan")})
        assert w.rows == 2
    df = pd.read_csv(p)
    assert df["a"].tolist() == [1, 2] and df["b"].iloc[0] == 0.5 and pd.isna(df["b"].iloc[1])
    with pytest.raises(FileExistsError):
        rundir.RowWriter(p, ("a",))
    with rundir.RowWriter(tmp_path / "plans.jsonl") as j:
        j.json_line({"plan": [1, 2]})
    assert json.loads((tmp_path / "plans.jsonl").read_text()) == {"plan": [1, 2]}


def test_checked_fields_read_a_collectors_build_source():
    a = {"run_id": "a", "build": {"source": {"version": "18.1"}}}
    b = {"run_id": "b", "source": {"version": "18.1"}}
    assert "source.version" not in rundir.check_comparable(a, b, force=True)
    with pytest.raises(ComparisonError):
        rundir.check_comparable(a, {"run_id": "c", "source": {"version": "17.0"}},
                                fields=("source.version",))
