"""CLI: ``profkit parse perf-script|gprof`` and ``profkit flamegraph``.

They read files from any machine: nothing here needs PostgreSQL.
"""
from __future__ import annotations

import datetime as _dt
import json
import sys
from pathlib import Path
from typing import Any

import click

from profkit.cli.common import Failed as _Failed
from profkit.cli.common import friendly as _friendly
from profkit.cli.common import StdoutFailed, json_option, records


def _source(path: str) -> Any:
    """A path, or stdin's binary buffer for ``-`` (so a pipe from perf script streams)."""
    return sys.stdin.buffer if path == "-" else path


@click.group("parse")
def parse_group() -> None:
    """Parse profiler output from files (any machine, any PostgreSQL version)."""


@parse_group.command("perf-script")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--vdso", "vdso", default=None, metavar="IMAGE|self",
              help="vDSO image to name '[unknown] ([vdso])' frames; 'self' = this kernel's.")
@click.option("--event", default=None, help="Count only samples of this event (cpu-clock).")
@click.option("--period", is_flag=True, help="Weight samples by their period, not 1.")
@click.option("--include-pid", is_flag=True, help="Root frame COMM-PID.")
@click.option("--include-tid", is_flag=True, help="Root frame COMM-PID/TID (with --include-pid).")
@click.option("--functions", "functions", is_flag=True,
              help="Print the functions table (self/total samples) as CSV instead.")
@click.option("--no-strict", is_flag=True,
              help="Drop an incomplete last sample instead of failing on truncated input.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write here instead of stdout.")
@_friendly
def perf_script_cmd(file: str, vdso: str | None, event: str | None, period: bool,
                    include_pid: bool, include_tid: bool, functions: bool, no_strict: bool,
                    output: str | None) -> None:
    """Fold `perf script` text into stackcollapse-perf.pl's format: the process name as
    root frame, `frame;frame;leaf count`, one line per distinct stack. FILE may be `-`."""
    from profkit.parse.perf_script import VdsoSymbols, fold_perf_script

    vsyms = None
    if vdso == "self":
        vsyms = VdsoSymbols.from_running_kernel()
    elif vdso:
        vsyms = VdsoSymbols.from_image(vdso)
    fold = fold_perf_script(_source(file), vdso=vsyms, event=event,
                            weight="period" if period else "samples",
                            include_pid=include_pid, include_tid=include_tid,
                            strict=not no_strict)
    if functions:
        df = fold.functions_df()
        text = df.drop(columns=["run_id", "build"]).to_csv(index=False, lineterminator="\n")
    else:
        text = fold.folded_text()
    _emit(text, output)


@parse_group.command("gprof")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--call-graph", is_flag=True,
              help="Print the call graph's edges (caller,callee,calls) instead.")
@click.option("--no-strict", is_flag=True,
              help="Accept a report trimmed by hand or `gprof -b -p` output (a flat profile "
                   "that ends at its last row).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write here instead of stdout.")
@json_option
@_friendly
def gprof_cmd(file: str, call_graph: bool, no_strict: bool, output: str | None,
              as_json: bool) -> None:
    """Print gprof's flat profile as CSV (name,calls,self_seconds,cumulative_seconds,
    percent_time; calls empty where gprof shows none), or with --call-graph its edges.
    FILE may be `-` (stdin) or gzip-compressed."""
    import pandas as pd

    from profkit.parse.gprof import parse_gprof

    prof = parse_gprof(_source(file), strict=not no_strict)
    text = prof.edges_csv() if call_graph else prof.flat_csv()
    if as_json:
        # the same columns as the CSV, with integer calls (null where gprof shows none)
        if call_graph:
            df = prof.call_edges[["caller", "callee", "calls"]]
        else:
            flat = prof.functions[prof.functions["in_flat"]]
            df = pd.DataFrame({"name": flat["function"], "calls": flat["calls"],
                               "self_seconds": flat["self_seconds"],
                               "cumulative_seconds": flat["cumulative_seconds"],
                               "percent_time": flat["percent_time"]})
        doc = {"file": file, "call_edges" if call_graph else "flat_profile": records(df)}
        text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    _emit(text, output)


def _emit(text: str, output: str | None) -> None:
    if output:
        Path(output).write_text(text, encoding="utf-8")
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        raise StdoutFailed(e) from None


def _meta(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise _Failed(f"--meta wants KEY=VALUE, got {p!r}")
        out[k] = v
    return out


@click.command("flamegraph")
@click.argument("stacks", required=False, type=click.Path(dir_okay=False, exists=True))
@click.option("--diff", "diff", nargs=2, type=click.Path(dir_okay=False, exists=True),
              default=None, metavar="A B",
              help="Differential: widths from B, red/blue = more/fewer samples than A.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="SVG path (default: flamegraphs/<name>.svg).")
@click.option("--title", default=None)
@click.option("--subtitle", default=None, help="Replaces the provenance line.")
@click.option("--meta", multiple=True, metavar="KEY=VALUE",
              help="Provenance shown in the subtitle (build=..., pg=..., query=...).")
@click.option("--meta-json", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A JSON object of provenance (e.g. a collector's metadata file).")
@click.option("--width", type=int, default=1200, show_default=True)
@click.option("--diff-basis", type=click.Choice(["self", "total"]), default="self",
              show_default=True)
@click.option("--vdso", default=None, metavar="IMAGE|self",
              help="vDSO image for perf script input (see `parse perf-script`).")
@_friendly
def flamegraph_cmd(stacks: str | None, diff: tuple[str, str] | None, output: str | None,
                   title: str | None, subtitle: str | None, meta: tuple[str, ...],
                   meta_json: str | None, width: int, diff_basis: str,
                   vdso: str | None) -> None:
    """Render folded stacks or `perf script` text (STACKS) as an interactive SVG;
    with --diff A B, a differential flamegraph of B against A."""
    from profkit.parse import load_stacks
    from profkit.parse.perf_script import VdsoSymbols
    from profkit.paths import flamegraphs_dir
    from profkit.render.flamegraph import render, write_svg

    if bool(stacks) == bool(diff):
        raise _Failed("give either STACKS or --diff A B")
    kw: dict[str, Any] = {}
    if vdso:
        kw["vdso"] = (VdsoSymbols.from_running_kernel() if vdso == "self"
                      else VdsoSymbols.from_image(vdso))
    provenance: dict[str, Any] = {}
    if meta_json:
        try:
            loaded = json.loads(Path(meta_json).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise _Failed(f"--meta-json {meta_json}: {e}") from None
        if not isinstance(loaded, dict):
            raise _Failed(f"--meta-json {meta_json}: expected a JSON object")
        provenance.update(loaded)
    provenance.update(_meta(meta))
    if diff:
        a_path, b_path = diff
        a, b = load_stacks(a_path, **kw), load_stacks(b_path, **kw)
        name = f"{Path(a_path).name.split('.')[0]}-vs-{Path(b_path).name.split('.')[0]}"
        provenance.setdefault("before (A)", Path(a_path).name)
        provenance.setdefault("after (B)", Path(b_path).name)
        counts, against = b, a
    else:
        assert stacks is not None
        counts, against = load_stacks(stacks, **kw), None
        name = Path(stacks).name.split(".")[0]
        provenance.setdefault("input", Path(stacks).name)
    provenance.setdefault("samples", f"{int(sum(counts.values())):,}")
    provenance.setdefault("rendered", _dt.datetime.now().strftime("%Y-%m-%d %H:%M"))
    svg = render(counts, diff_against=against, title=title or name, subtitle=subtitle,
                 provenance=provenance, width=width, diff_basis=diff_basis)  # type: ignore[arg-type]
    out = Path(output) if output else flamegraphs_dir() / f"{name}.svg"
    write_svg(svg, out)
    click.echo(str(out))
