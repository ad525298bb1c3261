"""The bias figures the docs, the patch headers and sampled_timing's help text quote are
the committed results (no build, no cluster).

- ``benchmarks/results/sampled_timing_bias.csv`` (``benchmarks/sampled_timing_bias.py``):
  sampled_timing's residual bias per node against the TSC arm minus its clock reads.  Its
  summary (range of the biases, envelope of the 95 % intervals) is quoted verbatim in
  the patch header, in the help text of ``explain_timing_sample_rate`` and in
  docs/variants.md; "unbiased"/"no bias" may be said only if 0 is inside every interval.
- ``benchmarks/results/fast_timing_yardstick.csv`` (``benchmarks/fast_timing_yardstick.py``):
  fast_timing's and pg19tsc's bias against pg19tsc minus its reads, and how much closer
  fast_timing is, quoted in profkit/patches/pg19/README.md and docs/variants.md.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import benchmark_module

from profkit import patches

ROOT = Path(__file__).resolve().parent.parent


def guc_help(patch_text: str) -> str:
    """The help texts of explain_timing_sample_rate as the server shows them: the C
    string literals of its entry in guc_tables.c, joined."""
    m = re.search(r'^\+\s*\{"explain_timing_sample_rate",.*?^\+\s*GUC_EXPLAIN', patch_text,
                  re.MULTILINE | re.DOTALL)
    assert m, "explain_timing_sample_rate's entry not found in the patch"
    lits = re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(0))
    return "".join(lits[1:])  # the first literal is the GUC's name


@pytest.fixture(scope="module")
def sampled():
    mod = benchmark_module("sampled_timing_bias")
    rows = pd.read_csv(mod.CSV)
    s = mod.summarize(rows, "sampled_timing")
    assert s is not None and s.nodes >= 5, "the committed run must hold the seed's long nodes"
    return mod, rows, s


def _texts() -> dict[str, str]:
    text = patches.read_patch("sampled_timing")
    return {"patch header": patches.split_header(text), "help text": guc_help(text),
            "docs/variants.md": (ROOT / "docs" / "variants.md").read_text()}


def test_help_text_is_read_from_the_patch():
    h = guc_help(patches.read_patch("sampled_timing"))
    assert h.startswith("Times about 1 of every N calls") and "Row and loop" in h


def test_sampled_bias_is_quoted_from_the_results(sampled):
    mod, rows, s = sampled
    # the committed rows cover the three seed workloads, against the TSC yardstick
    main = rows[(rows["arm"] == "sampled_timing") & (rows["yardstick"] == mod.YARDSTICK)]
    assert set(main["workload"]) == {"nested_loop", "join_sum", "count_star"}
    assert (main["yard_mean_ms"] >= 1.0).all()
    for where, text in _texts().items():
        flat = " ".join(text.split())
        assert s.text() in flat, f"{where} does not quote {s.text()!r}"
        assert "2-vCPU VM" in flat, f"{where} does not say where the times were taken"
        assert "sampled_timing_bias" in flat, f"{where} does not name the script behind it"


def test_no_unbiased_claim_without_the_measurement(sampled):
    _, _, s = sampled
    for where, text in _texts().items():
        for m in re.finditer(r"unbiased|without bias|no bias", text, re.IGNORECASE):
            around = " ".join(text[max(0, m.start() - 80):m.end() + 80].split())
            if s.zero_in_every_interval and m.group(0).lower() == "no bias":
                assert "no bias detected within" in around, (where, around)
            else:
                # only allowed as a description of the estimator's design goal or of
                # what a floor would break, never as a property of the figures
                assert re.search(r"stays unbiased only|would bias|biases the sum|is "
                                 r"unbiased only|right on average", around), (where, around)


def test_fast_timing_yardstick_is_quoted_from_the_results():
    mod = benchmark_module("fast_timing_yardstick")
    df = pd.read_csv(mod.CSV)
    c = df[df["yardstick"] == "corrected"]
    assert len(c) == 3 and set(c["node_type"]) == {"Aggregate", "Nested Loop", "Materialize"}
    assert (c["closer_by_pp"] > 0).all()
    for f in (ROOT / "profkit" / "patches" / "pg19" / "README.md", ROOT / "docs" / "variants.md"):
        flat = " ".join(f.read_text().split())
        for r in c.itertuples():
            for v in (r.fast_bias_pct, r.upstream_bias_pct):
                assert f"{v:+.1f} %" in flat, (f.name, v)
            assert f"{r.closer_by_pp:.1f}" in flat, (f.name, r.closer_by_pp)
        assert f"{c['read_ns'].iloc[0]:.2f} ns" in flat, f.name
