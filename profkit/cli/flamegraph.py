"""CLI: ``profkit flamegraph`` — folded stacks or ``perf script`` text as an SVG.

Reads files from any machine: nothing here needs PostgreSQL. The drawing is
:mod:`profkit.render.flamegraph`'s; the input is read by
:func:`profkit.experiments.stacks.read_stacks` (``read_stacks_or_diff`` for one input,
which may be a differential folded file).
"""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

import click

from profkit.cli.common import Failed as _Failed
from profkit.cli.common import friendly as _friendly
from profkit.errors import NoStackCounts
from profkit.paths import flamegraphs_dir


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
@click.option("--diff", "diff", nargs=2, type=click.Path(exists=True),
              default=None, metavar="A B",
              help="Differential, widths from B. Two folders of repeated recordings (e.g. "
                   "<run>/recordings/vanilla and .../step3 of `profkit perf A B`): per "
                   "execution, coloured only where the bootstrap interval of the change "
                   "excludes 0. Two files: share-based (red/blue = more/fewer samples than "
                   "A as a share of each total; no interval).")
@click.option("--align", is_flag=True,
              help="With --diff: drop the executor's wrapper frames (ExecProcNodeInstr...) "
                   "inside the stacks of both sides so plan nodes line up.")
@click.option("--resamples", type=int, default=4000, show_default=True,
              help="With --diff of folders: bootstrap resamples.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="With --diff of folders: the bootstrap's seed.")
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
                   width: float, minwidth: float, diff_basis: str, vdso: str | None,
                   align: bool, resamples: int, seed: int) -> None:
    """Render folded stacks or `perf script` text (STACKS; `-` reads stdin) as an
    interactive SVG (a differential folded file, difffolded.pl's `stack BEFORE AFTER`, as
    a differential, as flamegraph.pl draws it); --diff A B: B against A (two folders of
    repeated recordings: with bootstrap intervals; two files: share-based); --merge A B
    C: several runs in one graph."""
    from profkit.experiments.flamediff import aligned, draw_folders
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
    if align and not diff:
        raise _Failed("--align goes with --diff")
    if diff and sum(Path(x).is_dir() for x in diff) == 1:
        raise _Failed("--diff A B: give two folders of recordings or two files, not one of "
                      "each")
    if diff and Path(diff[0]).is_dir():
        if resamples < 100:
            raise _Failed(f"--resamples must be at least 100, got {resamples}")
        a_dir, b_dir = diff
        out = Path(output) if output else \
            flamegraphs_dir() / f"{Path(a_dir).name}-vs-{Path(b_dir).name}.svg"
        _res, _path, text = draw_folders(a_dir, b_dir, out, title=title, subtitle=subtitle,
                                         facts=_meta(meta), width=width,
                                         min_width_px=minwidth, basis=diff_basis,
                                         align=align, n_boot=resamples, seed=seed)
        click.echo(text)
        return
    if stacks.count("-") > 1:
        raise _Failed("stdin (-) can be read once")
    from profkit.experiments.stacks import perf_reading

    # perf script text is drawn in samples with vDSO frames named (profkit's reading)
    kw = perf_reading(vdso)
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
    count_name = "samples"
    if diff:
        a_path, b_path = diff
        a, b = _load(a_path, kw), _load(b_path, kw)
        if align:
            a, b = aligned(a), aligned(b)
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
        counts, against = _load_one(stacks[0], kw)
        name = _stem(stacks[0])
        provenance.setdefault("input", "stdin" if stacks[0] == "-" else Path(stacks[0]).name)
        if against is not None:
            # difffolded.pl's output, as flamegraph.pl draws it: widths from AFTER
            provenance.setdefault("differential file", "BEFORE AFTER per stack (widths: "
                                  "AFTER)")
    if icicle:
        name += "-icicle"
    provenance.setdefault("samples", f"{round(sum(counts.values())):,}")
    provenance.setdefault("rendered", _dt.datetime.now().strftime("%Y-%m-%d %H:%M"))
    svg = render(counts, diff_against=against, title=title or name, subtitle=subtitle,
                 provenance=provenance, width=width, min_width_px=minwidth,
                 diff_basis=diff_basis, inverted=icicle,  # type: ignore[arg-type]
                 count_name=count_name)
    out = Path(output) if output else flamegraphs_dir() / f"{name}.svg"
    write_svg(svg, out)
    click.echo(str(out))


def _stem(path: str) -> str:
    return "stdin" if path == "-" else Path(path).name.split(".")[0]


def _load(path: str, perf_kwargs: dict[str, Any]) -> dict[str, float]:
    """Folded stacks or perf script text (sniffed), from a path or stdin (``-``)."""
    return _load_one(path, perf_kwargs, diff=False)[0]


def _load_one(path: str, perf_kwargs: dict[str, Any], *, diff: bool = True
              ) -> tuple[dict[str, float], dict[str, float] | None]:
    """One input: (stacks, None), or with *diff* (after, before) of a differential
    folded file (without: such a file is refused, saying how to draw it)."""
    from profkit.experiments.stacks import InvalidLines, read_stacks, read_stacks_or_diff

    if path != "-" and not Path(path).is_file():
        raise _Failed(f"{path}: no such file")
    invalid = InvalidLines()
    if diff:
        counts, before = read_stacks_or_diff(path, perf_kwargs, invalid)
    else:
        counts, before = read_stacks(path, perf_kwargs, invalid), None
    where = "stdin" if path == "-" else path
    if invalid.total:
        # as flamegraph.pl and inferno do: the other lines are drawn, and it is said
        shown = ", ".join(f"line {n} {text[:60]!r}" for n, text in invalid[:3])
        more = f" and {invalid.total - 3} more" if invalid.total > 3 else ""
        click.echo(f"profkit: {where}: ignored {invalid.total} line"
                   f"{'s' if invalid.total != 1 else ''} that are not 'frame;frame COUNT' "
                   f"({shown}{more}); the graph leaves them out", err=True)
    NoStackCounts.unless_any(counts, where, "draw")
    return counts, before
