"""Markdown: ONE table helper (:func:`table`) that every report's module uses.

:func:`table` lays out every markdown table profkit writes; :func:`frame` formats a
DataFrame's cells for it (NaN as an empty cell or a dash, floats by column format). Each
report's text is a module of its own: :mod:`profkit.render.bench_report`,
:mod:`profkit.render.timing_accuracy`, :mod:`profkit.render.observers`,
:mod:`profkit.render.correction`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd


def table(header: Sequence[Any], rows: Sequence[Sequence[Any]],
          align: Sequence[str] | None = None) -> str:
    """A GitHub markdown table (no trailing newline). *align*: "l"/"r" per column
    (``| :--- | ---: |``); None: ``|---|---|``. Pipes in cells are escaped."""
    def esc(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(esc(h) for h in header) + " |"
    if align is None:
        sep = "|" + "|".join("---" for _ in header) + "|"
    else:
        sep = "| " + " | ".join("---:" if a == "r" else ":---" for a in align) + " |"
    return "\n".join([head, sep, *("| " + " | ".join(esc(c) for c in r) + " |" for r in rows)])


def frame(df: pd.DataFrame, floatfmt: Mapping[str, str] | None = None,
          default_fmt: str = "{:.2f}", *, cell: Callable[[str, Any], str] | None = None,
          empty: str | None = None) -> str:
    """*df* as a markdown table with a trailing newline. Floats by *floatfmt* per column
    (else *default_fmt*), ints with thousands separators, NaN as an empty cell — or
    every cell through *cell*. *empty*: the text for a table without rows (default: the
    header alone)."""
    if empty is not None and df.empty:
        return empty
    fmts = dict(floatfmt or {})

    def default_cell(col: str, v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
            return ""
        if isinstance(v, (float, np.floating)):
            return fmts.get(col, default_fmt).format(float(v))
        if isinstance(v, (int, np.integer)):
            return f"{int(v):,}"
        return str(v)

    fn = cell or default_cell
    cols = [str(c) for c in df.columns]
    rows = [[fn(c, v) for c, v in zip(cols, rec, strict=True)]
            for rec in df.itertuples(index=False)]
    return table(cols, rows) + "\n"


def loadavg_text(la: Sequence[float] | object, *, sep: str = " ", decimals: int = 2) -> str:
    """A load-average triple as numbers (*decimals* places, joined by *sep*); anything
    else (a provenance field that is missing: None) as written."""
    if isinstance(la, list | tuple):
        return sep.join(f"{float(x):.{decimals}f}" for x in la)
    return str(la)


def loadavg_span(prov: Mapping[str, Any], *, sep: str = "/", decimals: int = 1) -> str:
    """A run's load averages at its start and end (provenance ``loadavg_start`` and
    ``loadavg_end``): ``"1.2/0.9/0.7 → 2.0/1.1/0.8"``."""
    return " → ".join(loadavg_text(prov.get(k), sep=sep, decimals=decimals)
                      for k in ("loadavg_start", "loadavg_end"))


#: Report names that experiments/timing_accuracy, observers and correction still look up
#: here (``render_md.NAME``); their homes are the report modules. Delete this and
#: ``__getattr__`` when those modules import the report modules themselves.
_MOVED = {"timing_accuracy_report": "timing_accuracy", "observers_markdown": "observers",
          "SLOWDOWN_SHOW": "observers", "correction_markdown": "correction",
          "CORRECTION_SHOW": "correction", "COSTS_SHOW": "correction",
          "NODES_SHOW": "correction"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(f"profkit.render.{_MOVED[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
