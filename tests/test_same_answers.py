"""Every patch variant reports exactly vanilla's actual rows and loops for every node.

Runs the corpus of profkit.pg.corpus (seq/index/index-only/bitmap scans with
BitmapAnd/BitmapOr, nested loop/hash/merge joins, material, memoize, sort,
incremental sort, hash and group aggregate, window, limit, subquery scan, CTE
scan, append/merge append, unique, set ops, recursive union, values/function
scans, project set, subplans, Gather, Gather Merge and Parallel Hash, an async
Foreign Scan through postgres_fdw on a loopback server, INSERT/UPDATE with four
triggers on one relation) on each variant's own cluster, in every
instrumentation mode of corpus.MODES (rows only; BUFFERS; TIMING; both) and as
plain statements under auto_explain (log_analyze, rows only; and with log_buffers),
and compares node by node with vanilla of the same major version (rows, loops, and
every buffer count where BUFFERS is on): PostgreSQL 18 variants against vanilla,
pg19/... variants against pg19/vanilla.
"""

from __future__ import annotations

import os
import signal

import pandas as pd
import pytest

from profkit.patches import PRESETS, has_patch
from profkit.pg import corpus
from profkit.pg.build import get_build, split_major
from profkit.pg.cluster import Cluster

from proc_helpers import proc_text

pytestmark = pytest.mark.pg

PG18_VARIANTS = [name for name in PRESETS if name != "vanilla"
                 and all(has_patch(p, "18") for p in PRESETS[name])]
# PostgreSQL 19 in `make test`: the variants that carry every row-counting change (step5 =
# step1 + step4 + step5), the buffer counting (step6 = step5 + step6) and the timing
# variant (fast_timing) against pg19/vanilla, to keep a cold suite inside its time budget;
# the others run with PROFKIT_TEST_PG19_VARIANTS=step1,step2,step3,step4,step5,step6,fast_timing
# (and `profkit regress`).
PG19_VARIANTS = [f"pg19/{name}" for name in
                 os.environ.get("PROFKIT_TEST_PG19_VARIANTS", "step5,step6,fast_timing").split(",")
                 if name]
MODES = list(corpus.MODES)
ALL_MODES = [*MODES, "auto_explain", "auto_explain_buffers"]
BUFFER_MODES = [m for m in MODES if corpus.MODES[m][1]] + ["auto_explain_buffers"]


def _corpus_run(build, name: str):
    # a cluster of its own: an open transaction elsewhere would keep VACUUM from
    # setting pages all-visible and change index-only-scan plans
    with Cluster(build, name=name) as cl, cl.connect() as conn:
        corpus.load(conn)
        rows = corpus.plan_rows(conn, modes=MODES)
        times = corpus.all_times(conn)
        # the same statements under auto_explain (log_analyze on, log_timing off: rows only;
        # then with log_buffers on)
        rows = pd.concat([rows, corpus.auto_explain_rows(conn),
                          corpus.auto_explain_rows(conn, buffers=True)], ignore_index=True)
    return rows, times


def _walwriter(cl: Cluster) -> int:
    ww = [p for p in cl.backend_pids() if "walwriter" in proc_text(p, "cmdline")]
    assert len(ww) == 1, ww
    return ww[0]


def test_the_corpus_is_all_visible_when_the_wal_writer_is_late(vanilla_build):
    """profkit's clusters commit asynchronously, and a tuple whose commit record is not
    yet flushed gets no hint bit, so VACUUM cannot mark its page all-visible. With the WAL
    writer stopped (as a loaded machine can make it late) the corpus's VACUUM must still
    leave every page of its tables all-visible, or index-only scans read the heap and two
    builds' buffer counts differ for no reason of theirs (it happened in `make test`).
    Checked here: the load without its synchronous commits left 0 of 64 pages of ca
    all-visible (and of every other table) under this test."""
    with Cluster(vanilla_build, name="test-corpus-late-wal") as cl, cl.connect() as conn:
        ww = _walwriter(cl)
        os.kill(ww, signal.SIGSTOP)
        try:
            corpus.load(conn)
            rows = conn.execute(
                "SELECT relname, relallvisible, relpages FROM pg_class WHERE relname = "
                "ANY(%s) ORDER BY relname", [list(corpus.VACUUMED)]).fetchall()
        finally:
            os.kill(ww, signal.SIGCONT)
    assert [r for r, _v, _p in rows] == sorted(corpus.VACUUMED), rows
    assert all(p > 0 and v == p for _r, v, p in rows), rows


def _reference(build) -> object:
    rows, _ = _corpus_run(build, f"test-corpus-{build.name.replace('/', '-')}")
    missing = corpus.missing_node_types(rows)
    assert missing == [], f"corpus no longer covers: {missing}"
    return rows


@pytest.fixture(scope="module")
def vanilla_rows(vanilla_build):
    return _reference(vanilla_build)


@pytest.fixture(scope="module")
def pg19_vanilla_rows():
    return _reference(get_build("pg19/vanilla", progress=print))


def test_corpus_covers_the_node_types(vanilla_rows):
    have = set(vanilla_rows["node_type"])
    for t in (
        "Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Bitmap Index Scan",
        "BitmapAnd", "BitmapOr", "Nested Loop", "Hash Join", "Hash", "Merge Join",
        "Materialize", "Sort", "Incremental Sort", "Aggregate", "WindowAgg", "Limit",
        "Subquery Scan", "CTE Scan", "Append", "Merge Append", "Unique", "SetOp", "Gather",
        "Gather Merge", "Memoize", "Foreign Scan", "ModifyTable",
    ):
        assert t in have, t
    # rows are real numbers, not placeholders, in every mode
    for mode in ALL_MODES:
        seq = vanilla_rows[(vanilla_rows["mode"] == mode) & (vanilla_rows["query"] == "seqscan")
                           & (vanilla_rows["node_type"] == "Seq Scan")]
        assert seq["rows"].iloc[0] == sum(1 for i in range(1, 10001) if ((i * 7919) % 1000) % 7 == 0)
    # the seed's step3 reported rows=0 for these with TIMING or BUFFERS on: vanilla does not
    def node_rows(mode: str, query: str, node_type: str) -> list[float]:
        m = ((vanilla_rows["mode"] == mode) & (vanilla_rows["query"] == query)
             & (vanilla_rows["node_type"] == node_type))
        return sorted(vanilla_rows.loc[m, "rows"].tolist())

    for mode in ALL_MODES:
        assert node_rows(mode, "hashjoin", "Hash") == [10000]
        # the two bitmaps of a = 3 (250 rows) and b = 5 (258 rows) of cbm
        assert node_rows(mode, "bitmap_and", "Bitmap Index Scan") == [250, 258]
        # id % 4 <> 1 of the two foreign partitions' 2000 and 3000 rows
        assert node_rows(mode, "async_foreign", "Foreign Scan") == [1500, 2250]
    # buffer counts are real where BUFFERS is on, and inclusive: the Aggregate over the Seq
    # Scan of ca shows the scan's blocks (it reads none itself); with the leader taking part,
    # the Gather shows at least the Parallel Seq Scan's blocks (its workers' totals too)
    for mode in BUFFER_MODES:
        sub = vanilla_rows[(vanilla_rows["mode"] == mode) & (vanilla_rows["query"] == "seqscan")]
        hits = dict(zip(sub["node_type"], sub["shared_hit"], strict=True))
        assert hits["Seq Scan"] > 0 and hits["Aggregate"] == hits["Seq Scan"], (mode, hits)
        sub = vanilla_rows[(vanilla_rows["mode"] == mode)
                           & (vanilla_rows["query"] == "gather_leader")]
        hits = dict(zip(sub["node_type"], sub["shared_hit"], strict=False))
        assert hits["Gather"] >= hits["Seq Scan"] > 0, (mode, hits)
    assert vanilla_rows[vanilla_rows["mode"] == "rows"]["shared_hit"].isna().all()
    # the async Foreign Scans really are async (Async Capable in the plan)
    fs_async = vanilla_rows[(vanilla_rows["query"] == "async_foreign")
                            & (vanilla_rows["node_type"] == "Foreign Scan")
                            & vanilla_rows["mode"].isin(MODES)]["async_capable"]
    assert len(fs_async) == 2 * len(MODES) and fs_async.eq(True).all(), fs_async
    # each trigger keeps its own calls: 250 inserted rows, 150 updated (every 2nd of 300),
    # the WHEN trigger on the updated rows with NEW.v % 3 = 0, one statement trigger
    trig = vanilla_rows[vanilla_rows["node_type"].str.startswith("Trigger ")]
    calls = trig.set_index(["mode", "query", "node_type"])["rows"]
    for mode in ALL_MODES:
        assert calls[(mode, "trigger_insert", "Trigger t1_before_row on ctrig")] == 250
        assert calls[(mode, "trigger_insert", "Trigger t2_after_row on ctrig")] == 250
        assert calls[(mode, "trigger_insert", "Trigger t4_after_stmt on ctrig")] == 1
        assert calls[(mode, "trigger_update", "Trigger t1_before_row on ctrig")] == 150
        when = sum(1 for i in range(2, 301, 2) if ((i % 10) + 1 + 1) % 3 == 0)
        assert calls[(mode, "trigger_update", "Trigger t3_after_row_when on ctrig")] == when
        assert calls[(mode, "trigger_update", "Trigger t4_after_stmt on ctrig")] == 1
    # with the leader participating, the Gather still returns every row: the leader's and
    # the workers' counts add up (v < 50 of cbig: 50 of every 97 ids of 200,000)
    expect = sum(1 for i in range(1, 200001) if i % 97 < 50)
    for mode in ALL_MODES:
        for q in ("gather", "gather_leader"):
            assert node_rows(mode, q, "Seq Scan") == [expect], (mode, q)
        leader = vanilla_rows[(vanilla_rows["mode"] == mode)
                              & (vanilla_rows["query"] == "gather_leader")
                              & (vanilla_rows["node_type"] == "Seq Scan")]["loops"]
        assert (leader >= 1).all(), leader


def _variant_params(names):
    return [pytest.param(n, marks=pytest.mark.builds(n)) for n in names]


def _check_variant(variant: str, reference) -> None:
    b = get_build(variant, progress=print)
    rows, times = _corpus_run(b, f"test-{variant.replace('/', '-')}")
    diff = corpus.compare(reference, rows)
    assert diff.empty, f"{variant} differs from vanilla:\n{diff.to_string()}"
    assert len(rows) == len(reference)
    # TIMING TRUE: every executed node has a non-negative time
    executed = times[times["loops"].fillna(0) > 0]
    assert executed["total_ms"].notna().all()
    assert (executed["total_ms"] >= 0).all(), executed[executed["total_ms"] < 0]
    assert (executed["startup_ms"] >= 0).all()


@pytest.mark.parametrize("variant", _variant_params(PG18_VARIANTS))
def test_variant_reports_vanilla_rows_and_loops(variant, vanilla_rows):
    _check_variant(variant, vanilla_rows)


@pytest.mark.builds("pg19/vanilla")
@pytest.mark.parametrize("variant", _variant_params(PG19_VARIANTS))
def test_pg19_variant_reports_pg19_vanilla_rows_and_loops(variant, pg19_vanilla_rows):
    assert split_major(variant)[0] == "19"
    _check_variant(variant, pg19_vanilla_rows)
