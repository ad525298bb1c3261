"""Time per plan node (:mod:`profkit.analyze.nodetime`) as text and as an HTML plan tree."""
from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence

import pandas as pd


def _pct(v: float) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1%}"


def _num(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"


def _node_label(r: pd.Series) -> str:
    out = "  " * int(r["depth"]) + f"{int(r['node_id'])} {r['node_type']}"
    rel = r.get("relation")
    if isinstance(rel, str) and rel:
        out += f" on {rel}"
        alias = r.get("alias")
        if isinstance(alias, str) and alias and alias != rel:
            out += f" {alias}"
    return out


def node_table(df: pd.DataFrame, *, has_plan: bool = True) -> pd.DataFrame:
    """The table people read: the plan indented, shares as percentages."""
    if not has_plan:
        return pd.DataFrame({"node type": df["node_type"],
                             "exclusive": df["exclusive_share"].map(_pct),
                             "samples": df["samples"].map(_num)})
    out = pd.DataFrame({
        "node": [_node_label(r) for _i, r in df.iterrows()],
        "exclusive": df["exclusive_share"].map(_pct),
        "inclusive": df["inclusive_share"].map(_pct),
        "samples": df["samples"].map(_num),
        "ambiguous": df["ambiguous_samples"].map(lambda v: _num(v) if v else ""),
    })
    if df["loops"].notna().any():
        out["rows"] = df["rows"].map(_num)
        out["loops"] = df["loops"].map(_num)
    return out


def text_table(t: pd.DataFrame) -> list[str]:
    """*t* as aligned text: the first column (the indented plan) left, the others right."""
    cells = [[str(c) for c in t.columns]] + [[str(v) for v in row] for row in t.itertuples(
        index=False)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(t.columns))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in cells]


def console_text(df: pd.DataFrame, *, outside_share: float, total: float,
                 outside: Mapping[str, float], has_plan: bool = True,
                 head: Sequence[str] = (), notes: Sequence[str] = (), run_dir: str = "",
                 flamegraph: str | None = None) -> str:
    """The console report: head lines, the per-node table, the samples outside the plan's
    nodes by category, notes, where the files are."""
    lines = list(head)
    t = node_table(df, has_plan=has_plan)
    lines += text_table(t) if len(t) else ["(no plan nodes)"]
    lines.append(f"outside the executor's plan nodes: {_pct(outside_share)} of {total:.0f} "
                 "samples" + (": " + ", ".join(f"{k} {v:.0f}" for k, v in
                                                sorted(outside.items(), key=lambda kv: -kv[1]))
                              if outside else ""))
    lines += [f"note: {n}" for n in notes]
    if run_dir:
        lines.append(f"artifacts: {run_dir}")
    if flamegraph:
        lines.append(f"flamegraph: {flamegraph}")
    return "\n".join(lines)


def plan_tree_html(df: pd.DataFrame, *, outside_share: float, total: float,
                   has_plan: bool = True) -> str:
    """The plan as an indented tree, each node with a bar of its exclusive share and its
    inclusive share (a notebook's view of a nodetime result)."""
    rows = []
    for _i, r in df.iterrows():
        ex = float(r["exclusive_share"]) if not pd.isna(r["exclusive_share"]) else 0.0
        label = html.escape(_node_label(r).strip() if has_plan else str(r["node_type"]))
        pad = 1.2 * int(r["depth"]) if has_plan else 0
        inc = _pct(r["inclusive_share"]) if has_plan else ""
        amb = float(r.get("ambiguous_samples", 0) or 0) if has_plan else 0.0
        rows.append(
            f"<tr><td style='padding-left:{pad:.1f}em;white-space:nowrap'>{label}</td>"
            f"<td style='width:16em'><div style='background:#e8743b;height:0.9em;"
            f"width:{100 * ex:.1f}%'></div></td>"
            f"<td style='text-align:right'>{_pct(ex)}</td>"
            f"<td style='text-align:right'>{inc}</td>"
            f"<td style='text-align:right'>{_num(r['samples'])}</td>"
            f"<td style='text-align:right'>{_num(amb) if amb else ''}</td></tr>")
    head = ("<tr><th style='text-align:left'>node</th><th></th><th>exclusive</th>"
            "<th>inclusive</th><th>samples</th><th>ambiguous</th></tr>")
    return (f"<table class='profkit-nodetime'>{head}{''.join(rows)}</table>"
            f"<p>outside the plan's nodes: {_pct(outside_share)} of {total:.0f} samples</p>")
