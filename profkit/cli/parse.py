"""CLI: ``profkit parse perf-script|gprof`` and ``profkit flamegraph``.

They read files from any machine: nothing here needs PostgreSQL.
"""
from __future__ import annotations

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
@click.option("--pid", is_flag=True, help="Include PID with process names (COMM-PID).")
@click.option("--tid", is_flag=True, help="Include TID and PID with process names.")
@click.option("--kernel", is_flag=True, help="Annotate kernel functions with a _[k].")
@click.option("--jit", is_flag=True, help="Annotate jit functions with a _[j].")
@click.option("--all", "all_", is_flag=True, help="All annotations (--kernel --jit).")
@click.option("--addrs", is_flag=True, help="Include raw addresses where symbols can't be found.")
@click.option("--event-filter", default=None, metavar="EVENT",
              help="Count this event's samples (default: the first event seen).")
@click.option("--inline", is_flag=True,
              help="Un-inline using addr2line (one addr2line per module; slow on big profiles, "
                   "needs the recorded binaries).")
@click.option("--context", is_flag=True, help="Add source context to --inline.")
@click.option("--samples", is_flag=True,
              help="profkit: count 1 per sample instead of its period.")
@click.option("--vdso", "vdso", default=None, metavar="IMAGE|self",
              help="profkit: vDSO image to name '[unknown] ([vdso])' frames; 'self' = this "
                   "kernel's.")
@click.option("--strict", is_flag=True,
              help="profkit: refuse truncated or garbled input (the Perl script skips it).")
@click.option("--functions", "functions", is_flag=True,
              help="Print the functions table (self/total) as CSV instead.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write here instead of stdout.")
@_friendly
def perf_script_cmd(file: str, pid: bool, tid: bool, kernel: bool, jit: bool, all_: bool,
                    addrs: bool, event_filter: str | None, inline: bool, context: bool,
                    samples: bool, vdso: str | None, strict: bool, functions: bool,
                    output: str | None) -> None:
    """Fold `perf script` text exactly as FlameGraph's stackcollapse-perf.pl does (same
    options, same output); the profkit options change that on request. FILE may be `-`."""
    if not (samples or vdso or functions or inline or context or file.endswith(".gz")):
        # stackcollapse-perf.pl's own reading: the compiled core straight to bytes, as
        # profkit-stackcollapse-perf does (no str per stack, no pandas)
        _fold_fast(file, pid=pid, tid=tid, kernel=kernel or all_, jit=jit or all_, addrs=addrs,
                   event_filter=event_filter, strict=strict, output=output)
        return
    from profkit.parse.perf_script import VdsoSymbols, fold_perf_script

    vsyms = None
    if vdso == "self":
        vsyms = VdsoSymbols.from_running_kernel()
    elif vdso:
        vsyms = VdsoSymbols.from_image(vdso)
    fold = fold_perf_script(_source(file), pid=pid, tid=tid, kernel=kernel, jit=jit, all=all_,
                            addrs=addrs, event_filter=event_filter, inline=inline,
                            context=context, weight="samples" if samples else "period",
                            vdso=vsyms, strict=strict,
                            warn=lambda m: click.echo(m, err=True))
    if event_filter is not None and fold.samples == 0 and fold.events:
        # the Perl script prints nothing and exits 0 here: say why instead
        from profkit.errors import ParseError

        raise ParseError(f"{file}: no sample of event {event_filter!r}; the file has "
                         f"{', '.join(fold.events)}: pass one of those to --event-filter")
    if functions:
        df = fold.functions_df()
        data = df.drop(columns=["run_id", "build"]).to_csv(index=False, lineterminator="\n")
        _emit(data, output)
    else:
        _emit_bytes(fold.folded_bytes(), output)


def _fold_fast(file: str, *, pid: bool, tid: bool, kernel: bool, jit: bool, addrs: bool,
               event_filter: str | None, strict: bool, output: str | None) -> None:
    """`parse perf-script` in stackcollapse-perf.pl's default weighting: the same bytes
    as :func:`profkit.parse.perf_script.fold_perf_script`'s ``folded_bytes()`` (tested),
    the same notes and errors, at the drop-in command's speed
    (:func:`profkit.stackcollapse.fold_command`)."""
    from profkit.stackcollapse import fold_command

    fold_command(file, pid=pid, tid=tid, kernel=kernel, jit=jit, addrs=addrs,
                 event_filter=event_filter, strict=strict,
                 note=lambda m: click.echo(m, err=True),
                 emit=lambda data: _emit_bytes(data, output))


def _emit_bytes(data: bytes, output: str | None) -> None:
    if output:
        Path(output).write_bytes(data)
        return
    try:
        sys.stdout.flush()
        out = getattr(sys.stdout, "buffer", None)
        if out is None:  # a text-only stream (tests): names of non-UTF-8 bytes escaped
            sys.stdout.write(data.decode("utf-8", "surrogateescape"))
        else:
            out.write(data)
            out.flush()
    except OSError as e:
        raise StdoutFailed(e) from None


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
        import json

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
@click.argument("stacks", nargs=-1, type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--diff", "diff", nargs=2, type=click.Path(dir_okay=False, exists=True),
              default=None, metavar="A B",
              help="Differential: widths from B, red/blue = more/fewer samples than A.")
@click.option("--merge", is_flag=True,
              help="Merge the STACKS files (runs) into one graph, each run normalised to the "
                   "same total.")
@click.option("--by-run", is_flag=True,
              help="With --merge: each run under its own root frame, side by side.")
@click.option("--icicle", is_flag=True, help="Inverted: the root at the top, callees below.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="SVG path (default: flamegraphs/<name>.svg).")
@click.option("--title", default=None)
@click.option("--subtitle", default=None, help="Replaces the provenance line.")
@click.option("--meta", multiple=True, metavar="KEY=VALUE",
              help="Provenance shown in the subtitle (build=..., pg=..., query=...).")
@click.option("--meta-json", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A JSON object of provenance (e.g. a collector's metadata file).")
@click.option("--width", type=float, default=1200, show_default=True,
              help="Image width in pixels (at least 100).")
@click.option("--minwidth", type=float, default=0.1, show_default=True,
              help="Merge sibling frames narrower than this many pixels (flamegraph.pl's "
                   "--minwidth).")
@click.option("--diff-basis", type=click.Choice(["self", "total"]), default="self",
              show_default=True)
@click.option("--vdso", default=None, metavar="IMAGE|self",
              help="vDSO image for perf script input (see `parse perf-script`).")
@_friendly
def flamegraph_cmd(stacks: tuple[str, ...], diff: tuple[str, str] | None, merge: bool,
                   by_run: bool, icicle: bool, output: str | None, title: str | None,
                   subtitle: str | None, meta: tuple[str, ...], meta_json: str | None,
                   width: float, minwidth: float, diff_basis: str, vdso: str | None) -> None:
    """Render folded stacks or `perf script` text (STACKS; `-` reads stdin) as an
    interactive SVG; --diff A B: B against A; --merge A B C: several runs in one graph."""
    from profkit.render.flamegraph import (
        RenderError,
        check_size,
        merge_profiles,
        render,
        write_svg,
    )

    # bad sizes are usage errors (exit 2), refused before any file is read
    try:
        check_size("--width", width, minimum=100)
        check_size("--minwidth", minwidth, minimum=0, allow_zero=True)
    except RenderError as e:
        raise _Failed(str(e)) from None
    if diff and (stacks or merge):
        raise _Failed("give STACKS, or --diff A B, not both")
    if not diff and not stacks:
        raise _Failed("give STACKS (a folded file, perf script text, or - for stdin), or "
                      "--diff A B")
    if len(stacks) > 1 and not merge:
        raise _Failed(f"{len(stacks)} inputs: pass --merge to draw them in one graph")
    if merge and len(stacks) < 2:
        raise _Failed("--merge needs at least two inputs")
    if by_run and not merge:
        raise _Failed("--by-run goes with --merge")
    if stacks.count("-") > 1:
        raise _Failed("stdin (-) can be read once")
    # perf script text is drawn in samples with vDSO frames named (profkit's reading)
    kw: dict[str, Any] = {"weight": "samples", "vdso_names": True}
    if vdso:
        from profkit.parse.perf_script import VdsoSymbols

        kw["vdso"] = (VdsoSymbols.from_running_kernel() if vdso == "self"
                      else VdsoSymbols.from_image(vdso))
    provenance: dict[str, Any] = {}
    if meta_json:
        try:
            import json

            loaded = json.loads(Path(meta_json).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise _Failed(f"--meta-json {meta_json}: {e}") from None
        if not isinstance(loaded, dict):
            raise _Failed(f"--meta-json {meta_json}: expected a JSON object")
        provenance.update(loaded)
    provenance.update(_meta(meta))
    count_name = "samples"
    if diff:
        a_path, b_path = diff
        a, b = _load(a_path, kw), _load(b_path, kw)
        name = f"{_stem(a_path)}-vs-{_stem(b_path)}"
        provenance.setdefault("before (A)", Path(a_path).name)
        provenance.setdefault("after (B)", Path(b_path).name)
        counts, against = b, a
    elif merge:
        runs = [_load(p, kw) for p in stacks]
        names = [_stem(p) for p in stacks]
        counts, against = merge_profiles(runs, names=names, by_run=by_run), None
        name = "merged-" + "-".join(names[:3]) + ("-etc" if len(names) > 3 else "")
        provenance.setdefault("merged runs", ", ".join(
            f"{n} ({sum(r.values()):,.0f})" for n, r in zip(names, runs, strict=True)))
        provenance.setdefault("normalised", "each run scaled to the mean total")
        count_name = "samples (normalised)"
    else:
        counts, against = _load(stacks[0], kw), None
        name = _stem(stacks[0])
        provenance.setdefault("input", "stdin" if stacks[0] == "-" else Path(stacks[0]).name)
    if icicle:
        name += "-icicle"
    provenance.setdefault("samples", f"{round(sum(counts.values())):,}")
    import datetime as _dt

    provenance.setdefault("rendered", _dt.datetime.now().strftime("%Y-%m-%d %H:%M"))
    svg = render(counts, diff_against=against, title=title or name, subtitle=subtitle,
                 provenance=provenance, width=width, min_width_px=minwidth,
                 diff_basis=diff_basis, inverted=icicle,  # type: ignore[arg-type]
                 count_name=count_name)
    from profkit.paths import flamegraphs_dir

    out = Path(output) if output else flamegraphs_dir() / f"{name}.svg"
    write_svg(svg, out)
    click.echo(str(out))


def _stem(path: str) -> str:
    return "stdin" if path == "-" else Path(path).name.split(".")[0]


def _load(path: str, perf_kwargs: dict[str, Any]) -> dict[str, float]:
    """Folded stacks or perf script text (sniffed), from a path or stdin (``-``)."""
    from profkit.parse import load_stacks

    if path != "-":
        if not Path(path).is_file():
            raise _Failed(f"{path}: no such file")
        return load_stacks(path, **perf_kwargs)
    import tempfile

    # stdin is sniffed like a file: spooled to a temporary file first
    with tempfile.NamedTemporaryFile(prefix="profkit-stdin-", suffix=".txt") as tmp:
        import shutil

        shutil.copyfileobj(sys.stdin.buffer, tmp, 1 << 20)
        tmp.flush()
        return load_stacks(tmp.name, **perf_kwargs)
