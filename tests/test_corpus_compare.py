"""corpus.compare() on hand-made frames (no build, no cluster): buffer counts are
compared exactly where both sides have them, and rows-only results (no buffer columns,
or NaN) compare as before."""
from __future__ import annotations

import math

import pandas as pd

from profkit.pg import corpus


def _frame(mode: str, hits: list[float], rows: list[float] | None = None) -> pd.DataFrame:
    n = len(hits)
    df = pd.DataFrame({"mode": mode, "query": "seqscan", "node_id": list(range(n)),
                       "node_type": ["Aggregate", "Seq Scan"][:n],
                       "rows": rows or [1.0] * n, "loops": [1.0] * n,
                       "parent_id": [None, 0][:n]})
    for col in corpus.BUFFER_COLUMNS.values():
        df[col] = [0.0] * n
    df["shared_hit"] = hits
    return df


def test_equal_buffers_compare_equal():
    ref = _frame("buffers", [45.0, 45.0])
    assert corpus.compare(ref, ref.copy()).empty


def test_a_buffer_count_that_differs_is_reported():
    ref = _frame("buffers", [45.0, 45.0])
    got = _frame("buffers", [44.0, 45.0])  # the parent lost a block: inclusive sum wrong
    diff = corpus.compare(ref, got)
    assert len(diff) == 1
    row = diff.iloc[0]
    assert row["node_type_ref"] == "Aggregate"
    assert (row["shared_hit_ref"], row["shared_hit_got"]) == (45.0, 44.0)


def test_modes_without_buffers_compare_rows_only():
    ref = _frame("rows", [math.nan, math.nan])
    assert corpus.compare(ref, ref.copy()).empty
    # frames without any buffer column (an older result) still compare on rows and loops
    bare = ref.drop(columns=list(corpus.BUFFER_COLUMNS.values()))
    assert corpus.compare(bare, bare.copy()).empty
    assert len(corpus.compare(bare, _frame("rows", [math.nan, math.nan], [1.0, 2.0])
                              .drop(columns=list(corpus.BUFFER_COLUMNS.values())))) == 1
    # NaN on one side only (BUFFERS on in one run, off in the other) is a difference
    assert len(corpus.compare(_frame("buffers", [45.0, 45.0]),
                              _frame("buffers", [math.nan, 45.0]))) == 1
