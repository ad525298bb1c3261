"""Every patch variant reports exactly vanilla's actual rows and loops for every node.

Runs the corpus of profkit.pg.corpus (seq/index/index-only/bitmap scans, nested
loop/hash/merge joins, material, memoize, sort, incremental sort, hash and
group aggregate, window, limit, subquery scan, CTE scan, append/merge append,
unique, set ops, recursive union, values/function scans, project set,
subplans, Gather and Gather Merge) on each variant's own cluster.
"""

from __future__ import annotations

import pytest

from profkit.patches import PRESETS
from profkit.pg import corpus
from profkit.pg.build import get_build
from profkit.pg.cluster import Cluster

pytestmark = pytest.mark.pg

VARIANTS = [name for name in PRESETS if name != "vanilla"]


@pytest.fixture(scope="module")
def vanilla_rows(vanilla_build):
    # a cluster of its own: an open transaction elsewhere would keep VACUUM from
    # setting pages all-visible and change index-only-scan plans
    with Cluster(vanilla_build, name="test-corpus-vanilla") as cl, cl.connect() as conn:
        corpus.load(conn)
        rows = corpus.plan_rows(conn)
    missing = corpus.missing_node_types(rows)
    assert missing == [], f"corpus no longer covers: {missing}"
    return rows


def test_corpus_covers_the_node_types(vanilla_rows):
    have = set(vanilla_rows["node_type"])
    for t in (
        "Seq Scan",
        "Index Scan",
        "Index Only Scan",
        "Bitmap Heap Scan",
        "Nested Loop",
        "Hash Join",
        "Merge Join",
        "Materialize",
        "Sort",
        "Incremental Sort",
        "Aggregate",
        "WindowAgg",
        "Limit",
        "Subquery Scan",
        "CTE Scan",
        "Append",
        "Merge Append",
        "Unique",
        "SetOp",
        "Gather",
        "Gather Merge",
        "Memoize",
    ):
        assert t in have, t
    # rows are real numbers, not placeholders
    seq = vanilla_rows[
        (vanilla_rows["query"] == "seqscan") & (vanilla_rows["node_type"] == "Seq Scan")
    ]
    assert seq["rows"].iloc[0] == sum(1 for i in range(1, 10001) if ((i * 7919) % 1000) % 7 == 0)


@pytest.mark.builds(*VARIANTS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_reports_vanilla_rows_and_loops(variant, vanilla_rows):
    b = get_build(variant, progress=print)
    with Cluster(b, name=f"test-{variant}") as cl, cl.connect() as conn:
        corpus.load(conn)
        rows = corpus.plan_rows(conn)
        times = corpus.all_times(conn)
    diff = corpus.compare(vanilla_rows, rows)
    assert diff.empty, f"{variant} differs from vanilla:\n{diff.to_string()}"
    assert len(rows) == len(vanilla_rows)
    # TIMING TRUE: every executed node has a non-negative time
    executed = times[times["loops"].fillna(0) > 0]
    assert executed["total_ms"].notna().all()
    assert (executed["total_ms"] >= 0).all(), executed[executed["total_ms"] < 0]
    assert (executed["startup_ms"] >= 0).all()
