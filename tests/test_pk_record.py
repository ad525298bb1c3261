"""The capture script pk-record.sh (plain sh, dash; package data in profkit/scripts/,
``scripts/pk-record.sh`` links to it) and ``profkit import``.

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
SCRIPT = ROOT / "profkit" / "scripts" / "pk-record.sh"
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
    from profkit.paths import RECORD_SCRIPT

    assert RECORD_SCRIPT == SCRIPT and (ROOT / "scripts" / "pk-record.sh").resolve() == SCRIPT
    text = SCRIPT.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert "#   " + " ".join(NEEDED) in text
    assert f"for tool in {' '.join(NEEDED)}; do" in text


def test_record_script_command_writes_the_script(tmp_path):
    """`profkit record-script` gives the packaged script: stdout, or -o FILE/DIR (0755)."""
    def pk(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "profkit", "record-script", *args],
                              capture_output=True, timeout=60, cwd=tmp_path)

    cp = pk()
    assert cp.returncode == 0 and cp.stdout == SCRIPT.read_bytes()
    cp = pk("-o", "pk.sh")
    assert cp.returncode == 0 and cp.stdout.decode().strip() == "pk.sh"
    assert (tmp_path / "pk.sh").read_bytes() == SCRIPT.read_bytes()
    assert (tmp_path / "pk.sh").stat().st_mode & 0o777 == 0o755
    (tmp_path / "srv").mkdir()
    cp = pk("-o", "srv")
    assert cp.returncode == 0 and (tmp_path / "srv" / "pk-record.sh").stat().st_mode & 0o111
    assert sorted(p.name for p in (tmp_path / "srv").iterdir()) == ["pk-record.sh"]
    cp = pk("-o", str(tmp_path / "no" / "such" / "dir" / "x.sh"))
    assert cp.returncode == 1 and b"Traceback" not in cp.stderr
    assert cp.stderr.decode().strip().startswith("profkit: ") and b"No such file" in cp.stderr
    # the copy runs as the original does
    cp = subprocess.run(["dash", str(tmp_path / "pk.sh"), "abc"], capture_output=True,
                        text=True, timeout=60)
    assert cp.returncode == 1 and "PID must be a number" in cp.stderr


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


# --------------------------------------------------------------------------- one query

PSQL = Path("/usr/lib/postgresql/15/bin/psql")  # Debian's psql binary (not the perl wrapper)


def _query_bin_dir(tmp_path: Path) -> Path:
    d = _bin_dir(tmp_path)
    assert PSQL.exists(), "Debian's postgresql-client-15 is not installed (setup-system.sh)"
    (d / "psql").symlink_to(PSQL)
    for tool in ("mkfifo", "tail"):
        (d / tool).symlink_to(shutil.which(tool))
    return d


def _record_query(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    d = tmp_path / "bin"
    return subprocess.run([str(d / "dash"), str(SCRIPT), *args],
                          env={"PATH": str(d), "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=timeout)


def test_query_mode_needs_psql_and_a_query_file(tmp_path):
    d = _bin_dir(tmp_path)  # no psql, mkfifo, tail
    q = tmp_path / "q.sql"
    q.write_text("SELECT 1\n")
    cp = subprocess.run([str(d / "dash"), str(SCRIPT), "--query-file", str(q)],
                        env={"PATH": str(d)}, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 1 and "psql is not on the PATH" in cp.stderr, cp.stderr
    for args, text in ((["--query-file", str(tmp_path / "none.sql")], "not found"),
                       (["1", "--", "-h", "x"], "need --query-file"),
                       (["1", "--query-file", str(q)], "not both")):
        cp = subprocess.run([str(d / "dash"), str(SCRIPT), *args], env={"PATH": str(d)},
                            capture_output=True, text=True, timeout=60)
        assert cp.returncode == 1 and len(cp.stderr.strip().splitlines()) == 1, cp.stderr
        assert text in cp.stderr, cp.stderr


@pytest.mark.pg
def test_record_one_query_through_psql_then_import(tmp_path, vanilla_build):
    """--query-file: psql's own session, its backend recorded for exactly that query;
    only dash, perf, psql, tar, gzip and coreutils on the PATH."""
    from profkit.pg.cluster import Cluster
    from profkit.rundir import load_run

    _query_bin_dir(tmp_path)
    q = tmp_path / "q.sql"
    q.write_text("SELECT pg_backend_pid() AS pid, count(*) AS n\n"
                 "FROM generate_series(1, 3000000) AS g")  # no newline at the end
    bad = tmp_path / "bad.sql"
    bad.write_text("SELECT nosuchcolumn FROM pg_class")
    # psql stops at the first error while the script still has ~1 MB to send it: the
    # script's writes fail (EPIPE), it is not killed by SIGPIPE, and it says why psql ended
    flood = tmp_path / "flood.sql"
    flood.write_text("SELECT nosuchcolumn FROM pg_class;\n" + "SELECT 1;\n" * 100_000)
    tarball = tmp_path / "q.tar.gz"
    with Cluster(vanilla_build, name="pk15-record-q") as cl:
        dsn = cl.dsn
        cp = _record_query(tmp_path, "--query-file", str(q), "-o", str(tarball), "--", dsn)
        failed = _record_query(tmp_path, "--query-file", str(bad), "-o",
                               str(tmp_path / "bad.tar.gz"), "--", dsn)
        flooded = _record_query(tmp_path, "--query-file", str(flood), "-o",
                                str(tmp_path / "bad.tar.gz"), "--", dsn)
    assert cp.returncode == 0, cp.stderr
    for f in (failed, flooded):
        assert f.returncode == 1 and len(f.stderr.strip().splitlines()) == 1, \
            (f.returncode, f.stderr)
        assert 'column "nosuchcolumn" does not exist' in f.stderr, f.stderr
        assert "psql ended before the query finished" in f.stderr, f.stderr
    assert not (tmp_path / "bad.tar.gz").exists()
    bad_dsn = _record_query(tmp_path, "--query-file", str(q), "--", f"host={tmp_path} port=1")
    assert bad_dsn.returncode == 1 and "psql ended before it connected" in bad_dsn.stderr, \
        (bad_dsn.returncode, bad_dsn.stderr)
    assert not list(tmp_path.glob("pk-record-*")), list(tmp_path.glob("pk-record-*"))

    out = tmp_path / "profiles"
    imp = subprocess.run([sys.executable, "-m", "profkit", "import", str(tarball), "--out",
                          str(out), "--flamegraphs", str(tmp_path / "fg")],
                         capture_output=True, text=True, timeout=300)
    assert imp.returncode == 0, imp.stderr
    rd = load_run(out / "latest")
    cap = rd.provenance["capture"]
    assert cap["what"] == "query", cap
    # the query ran in the recorded backend: it printed that backend's pid
    output = rd.file("query-output.txt").read_text()
    pid_out, n_out = output.split()[0].split("|")
    assert pid_out == cap["pid"] and n_out == "3000000", (output, cap)
    assert rd.provenance["query"] == q.read_text().strip()
    assert cap["postgres_version"].startswith("postgres (PostgreSQL) 18"), cap
    fn = pd.read_parquet(rd.file("functions.parquet"))
    assert fn["self"].sum() > 100, fn["self"].sum()
    names = set(fn["function"])
    assert "generate_series_step_int4" in names and "ExecAgg" in names, sorted(names)[:50]
    folded = rd.file("stacks.folded").read_text().splitlines()
    weight = {ln.rpartition(" ")[0]: float(ln.rpartition(" ")[2]) for ln in folded}
    in_executor = sum(w for s, w in weight.items() if "standard_ExecutorRun" in s)
    # perf ran for that query only: (nearly) every sample is in its execution
    outside = sorted(((w, s) for s, w in weight.items() if "standard_ExecutorRun" not in s),
                     reverse=True)
    assert in_executor / sum(weight.values()) > 0.9, (in_executor, outside[:10])
    svg = rd.file("flamegraph.svg").read_text()
    assert "generate_series_step_int4" in svg and "ExecAgg" in svg


@pytest.mark.pg
def test_a_short_query_says_too_few_samples_and_repeat_gives_a_profile(tmp_path,
                                                                       vanilla_build):
    """join_sum at scale 0.02 (a hash join of 20,000 rows and 20, a few ms) recorded once
    at 999 Hz: the import says how long the query ran (psql's timing), how many samples
    that gave and the --repeat that fixes it; recorded again with that --repeat (same
    session, perf across all runs), the import names N and the profile has enough."""
    import re

    from profkit.collect.perf import MIN_SAMPLES
    from profkit.pg.cluster import Cluster
    from profkit.pg.workloads import get_workload
    from profkit.rundir import load_run

    _query_bin_dir(tmp_path)
    wl = get_workload("join_sum")
    q = tmp_path / "q.sql"
    q.write_text(wl.select_sql + "\n")

    def imp(tarball: Path, out: str) -> subprocess.CompletedProcess:
        cp = subprocess.run([sys.executable, "-m", "profkit", "import", str(tarball), "--out",
                             str(tmp_path / out), "--flamegraphs", str(tmp_path / "fg")],
                            capture_output=True, text=True, timeout=300)
        assert cp.returncode == 0 and "Traceback" not in cp.stderr, cp.stderr
        return cp

    with Cluster(vanilla_build, name="pk-record-short") as cl:
        with cl.connect() as conn:
            wl.load(conn, 0.02)
            conn.execute(wl.select_sql).fetchall()           # warm, as a user's server is
        once = _record_query(tmp_path, "--query-file", str(q), "-o", str(tmp_path / "1.tgz"),
                             "--", cl.dsn)
        assert once.returncode == 0, once.stderr
        cp = imp(tmp_path / "1.tgz", "p1")
        msg = " ".join(cp.stderr.split())
        m = re.search(r"too few samples for a profile: (\d+) \(shares need >= 100.*\): the "
                      r"query ran ([\d.]+) ms; at 999 Hz that is about (\d+) samples of CPU "
                      r"time, perf kept (\d+)\. To fix: run the query more times in the "
                      r"recording: pk-record\.sh --repeat (\d+)", msg)
        assert m, msg
        n, ran_ms, kept, repeat = (int(m.group(1)), float(m.group(2)), int(m.group(4)),
                                   int(m.group(5)))
        rd = load_run(tmp_path / "p1" / "latest")
        cap = rd.provenance["capture"]
        assert cap["repeat"] == "1" and n == kept < MIN_SAMPLES
        assert abs(sum(float(t) for t in cap["query_ms"].split()) - ran_ms) < 0.1
        assert 0 < ran_ms < 100, ran_ms
        assert "query: ran 1 time in one session" in cp.stdout
        assert "too few" in rd.file("flamegraph.svg").read_text()
        # the fix it gave
        many = _record_query(tmp_path, "--query-file", str(q), "--repeat", str(repeat), "-o",
                             str(tmp_path / "n.tgz"), "--", cl.dsn)
        assert many.returncode == 0, many.stderr
    cp = imp(tmp_path / "n.tgz", "pn")
    assert "too few" not in cp.stderr, cp.stderr
    assert f"query: ran {repeat} times in one session in " in cp.stdout
    rd = load_run(tmp_path / "pn" / "latest")
    cap = rd.provenance["capture"]
    assert cap["repeat"] == str(repeat) and len(cap["query_ms"].split()) == repeat
    fn = pd.read_parquet(rd.file("functions.parquet"))
    assert fn["self"].sum() >= MIN_SAMPLES
    assert {"ExecHashJoin", "ExecAgg"} & set(fn["function"]) or any(
        "HashJoin" in f for f in fn["function"]), sorted(fn["function"])[:40]
    # the output kept is the last run's, once: sum(i*i, i = 1..20)
    assert rd.file("query-output.txt").read_text().split() == ["2870"]
    assert not list(tmp_path.glob("pk-record-*")), "the script's temp dirs are removed"
