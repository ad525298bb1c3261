"""Moved to :mod:`profkit.render.bench_report` (the bench report is its only content).

Kept while experiments/bench.py still imports this name; delete it when that import
says ``profkit.render.bench_report``.
"""
from profkit.render.bench_report import (  # noqa: F401
    bench_extra_sections,
    plot_overheads,
    render_markdown,
    report_provenance,
    seed_table,
    write_summary_csv,
)
