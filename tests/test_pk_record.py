"""Issue 15, part 3: scripts/pk-record.sh (plain sh, dash) and ``profkit import``.

The real test records a backend of a vanilla cluster running a query, with PATH holding
only symlinks to the programs the script's header lists (and dash), then imports the
tarball and checks the run it makes.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "pk-record.sh"
NEEDED = ("perf", "tar", "gzip", "uname", "date", "sleep", "mkdir", "rm", "cp")


def _bin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    for tool in (*NEEDED, "dash"):
        real = shutil.which(tool)
        assert real, f"{tool} is not installed (scripts/setup-system.sh)"
        (d / tool).symlink_to(real)
    return d


def _record(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {"PATH": str(_bin_dir(tmp_path)), "TMPDIR": str(tmp_path)}
    return subprocess.run([str(tmp_path / "bin" / "dash"), str(SCRIPT), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_header_lists_what_the_script_checks():
    text = SCRIPT.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert "#   " + " ".join(NEEDED) in text
    assert f"for tool in {' '.join(NEEDED)}; do" in text


def test_shellcheck_clean_and_dash_parses():
    sc = shutil.which("shellcheck")
    assert sc, "shellcheck is not installed (apt-get install -y shellcheck)"
    cp = subprocess.run([sc, "-s", "sh", str(SCRIPT)], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stdout
    cp = subprocess.run(["dash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr


@pytest.mark.parametrize("args, text", [
    (["abc"], "PID must be a number"),
    (["999999999"], "no process 999999999"),
    ([str(os.getpid())], "not a PostgreSQL backend"),
    (["1", "0"], "SECONDS must be a whole number > 0"),
])
def test_bad_input_is_one_line(tmp_path, args, text):
    cp = _record(tmp_path, *args)
    assert cp.returncode == 1, cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], cp.stderr
    assert not list(tmp_path.glob("pk-record-*")), "nothing left behind"


def test_missing_tool_is_named(tmp_path):
    d = _bin_dir(tmp_path)
    (d / "gzip").unlink()
    cp = subprocess.run([str(d / "dash"), str(SCRIPT), "1"], env={"PATH": str(d)},
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 1 and "gzip is not on the PATH" in cp.stderr, cp.stderr


def test_import_refuses_what_is_not_a_capture(tmp_path):
    bad = tmp_path / "x.tar.gz"
    bad.write_bytes(b"not a tarball")
    other = tmp_path / "other.tar.gz"
    (tmp_path / "f.txt").write_text("hi\n")
    with tarfile.open(other, "w:gz") as tf:
        tf.add(tmp_path / "f.txt", arcname="f.txt")
    for path, text in ((bad, "not a readable tarball"), (other, "no capture.txt inside"),
                       (tmp_path / "none.tar.gz", "no such file")):
        cp = subprocess.run([sys.executable, "-m", "profkit", "import", str(path), "--out",
                             str(tmp_path / "p")], capture_output=True, text=True, timeout=60)
        assert cp.returncode == 1, cp.stderr
        assert len(cp.stderr.strip().splitlines()) == 1 and text in cp.stderr, cp.stderr


@pytest.mark.pg
def test_record_a_real_backend_with_only_dash_and_perf_then_import(tmp_path, vanilla_build):
    from profkit.pg.cluster import Cluster
    from profkit.rundir import load_run

    tarball = tmp_path / "cap.tar.gz"
    with Cluster(vanilla_build, name="pk15-record") as cl, cl.connect() as conn, \
            cl.connect() as ctl:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        errors: list[BaseException] = []

        def busy() -> None:
            try:
                conn.execute("SELECT count(*) FROM generate_series(1, 200000000)")
            except Exception as e:  # noqa: BLE001 - the cancel below ends it
                errors.append(e)

        t = threading.Thread(target=busy)
        t.start()
        time.sleep(0.3)
        try:
            cp = _record(tmp_path, str(pid), "2", "-o", str(tarball))
        finally:
            ctl.execute("SELECT pg_cancel_backend(%s)", (pid,))
            t.join(60)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == str(tarball)
    with tarfile.open(tarball) as tf:
        names = {Path(n).name for n in tf.getnames()}
    assert {"perf.data", "perf.script.txt", "capture.txt", "buildid-list.txt"} <= names
    assert not list(tmp_path.glob("pk-record-*")), "the script's temp dir is removed"

    out = tmp_path / "profiles"
    cp = subprocess.run([sys.executable, "-m", "profkit", "import", str(tarball), "--out",
                         str(out), "--flamegraphs", str(tmp_path / "fg")],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    rd = load_run(out / "latest")
    cap = rd.provenance["capture"]
    assert cap["pid"] == str(pid) and cap["postgres_version"] == \
        "postgres (PostgreSQL) " + vanilla_build.version.split()[-1]
    assert cap["clocksource"] == Path(
        "/sys/devices/system/clocksource/clocksource0/current_clocksource").read_text().strip()
    assert cap["perf_version"].startswith("perf version ")
    assert rd.provenance["machine"]["kernel"] == os.uname().release
    fn = pd.read_parquet(rd.file("functions.parquet"))
    # ~2 s at 999 Hz of a backend counting a generate_series: its functions are named
    assert fn["self"].sum() > 200
    assert "generate_series_step_int4" in set(fn["function"])
    assert "ExecAgg" in set(fn["function"]) or any("agg" in f.lower() for f in fn["function"])
    folded = rd.file("stacks.folded").read_text()
    assert folded.startswith("postgres;")
    svg = rd.file("flamegraph.svg").read_text()
    assert "generate_series_step_int4" in svg and f"pid {pid}" in svg
    assert json.loads(rd.file("provenance.json").read_text())["status"] == "complete"
