"""Renderers: tidy tables → SVG/HTML/PNG, with provenance printed into what they make.

- :mod:`profkit.render.flamegraph` — interactive flamegraphs (plain and differential);
  :class:`FlameGraph` displays in Jupyter through an isolated ``<iframe srcdoc>``.
"""
from __future__ import annotations

from profkit.render.flamegraph import FlameGraph, render, render_to_file, to_iframe_html

__all__ = ["FlameGraph", "render", "render_to_file", "to_iframe_html"]
