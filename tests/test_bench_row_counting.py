"""The row-counting benchmark's table: both overheads against the same run's vanilla."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest


def _module():
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_row_counting.py"
    spec = importlib.util.spec_from_file_location("bench_row_counting", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _counts(rows):
    return pd.DataFrame([{"build": b, "mode": m, "instructions": n, "workload": "nested_loop"}
                         for b, m, n in rows])


def test_overheads_against_own_and_vanilla_plain():
    mod = _module()
    t = mod.overhead_table(_counts([
        ("vanilla", "plain", 1_000_000), ("vanilla", "analyze_notiming", 1_300_000),
        ("step3", "plain", 1_011_000), ("step3", "analyze_notiming", 1_056_000),
        ("step5", "plain", 1_001_000), ("step5", "analyze_notiming", 1_009_000),
        # a repeated count: the median is used
        ("step5", "plain", 1_001_000), ("step5", "plain", 1_001_300),
    ]), "vanilla").set_index("build")
    assert t.loc["vanilla", "Q2 vs own Q1 %"] == pytest.approx(30.0)
    assert t.loc["vanilla", "Q1 vs vanilla Q1 %"] == 0
    assert t.loc["step3", "Q2 vs own Q1 %"] == pytest.approx(45_000 / 1_011_000 * 100)
    assert t.loc["step3", "Q1 vs vanilla Q1 %"] == pytest.approx(1.1)
    assert t.loc["step3", "Q2 vs vanilla Q1 %"] == pytest.approx(5.6)
    assert t.loc["step5", "Q1"] == 1_001_000
    assert t.loc["step5", "Q2 vs vanilla Q1 %"] == pytest.approx(0.9)
    assert bool(t.loc["step5", "meets targets"]) and not bool(t.loc["step3", "meets targets"])
    assert not bool(t.loc["vanilla", "meets targets"])


def test_missing_reference_is_an_error():
    mod = _module()
    with pytest.raises(SystemExit, match="reference build 'vanilla'"):
        mod.overhead_table(_counts([("step5", "plain", 1)]), "vanilla")
