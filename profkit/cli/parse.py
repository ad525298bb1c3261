"""CLI: ``profkit parse perf-script|gprof|callgrind|explain``: files into tables.

They read files from any machine: nothing here needs PostgreSQL.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from profkit.cli.common import friendly as _friendly
from profkit.cli.common import json_option, records
from profkit.errors import ParseError, StdoutFailed


def _source(path: str) -> Any:
    """A path, or stdin's binary buffer for ``-`` (so a pipe from perf script streams)."""
    return sys.stdin.buffer if path == "-" else path


def _output_option(f: Any) -> Any:
    """``-o/--output FILE``: every parse command writes its table there instead of stdout."""
    return click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
                        help="Write here instead of stdout.")(f)


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
@click.option("--srcline", is_flag=True,
              help="The input is `perf script -F+srcline` output: add each frame's source "
                   "line to its name.")
@click.option("--samples", is_flag=True,
              help="profkit: count 1 per sample instead of its period.")
@click.option("--vdso", "vdso", default=None, metavar="IMAGE|self",
              help="profkit: vDSO image to name '[unknown] ([vdso])' frames; 'self' = this "
                   "kernel's.")
@click.option("--strict", is_flag=True,
              help="profkit: refuse truncated or garbled input (the Perl script skips it).")
@click.option("--functions", "functions", is_flag=True,
              help="Print the functions table (self/total) as CSV instead.")
@_output_option
@_friendly
def perf_script_cmd(file: str, pid: bool, tid: bool, kernel: bool, jit: bool, all_: bool,
                    addrs: bool, event_filter: str | None, inline: bool, context: bool,
                    srcline: bool, samples: bool, vdso: str | None, strict: bool,
                    functions: bool, output: str | None) -> None:
    """Fold `perf script` text exactly as FlameGraph's stackcollapse-perf.pl does (same
    options, same output); the profkit options change that on request. FILE may be `-`."""
    if not (samples or vdso or functions or inline or context or srcline
            or file.endswith(".gz")):
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
                            context=context, srcline=srcline,
                            weight="samples" if samples else "period",
                            vdso=vsyms, strict=strict,
                            warn=lambda m: click.echo(m, err=True))
    if event_filter is not None and fold.samples == 0 and fold.events:
        # the Perl script prints nothing and exits 0 here: say why instead
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
@_output_option
@json_option
@_friendly
def gprof_cmd(file: str, call_graph: bool, no_strict: bool, output: str | None,
              as_json: bool) -> None:
    """Print gprof's flat profile as CSV (name,calls,self_seconds,cumulative_seconds,
    percent_time; calls empty where gprof shows none), or with --call-graph its edges.
    FILE may be `-` (stdin) or gzip-compressed. A report in cycles (an embedded target's
    gprof) gives self_cycles,cumulative_cycles."""
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
            u = prof.time_unit  # "cycles" for a gprof that counts cycles
            df = pd.DataFrame({"name": flat["function"], "calls": flat["calls"],
                               f"self_{u}": flat[f"self_{u}"],
                               f"cumulative_{u}": flat[f"cumulative_{u}"],
                               "percent_time": flat["percent_time"]})
        doc = {"file": file, "call_edges" if call_graph else "flat_profile": records(df)}
        import json

        text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    _emit(text, output)


@parse_group.command("callgrind")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--event", default=None, metavar="EVENT",
              help="The cost column to read (default: Ir, instructions, when the file has it, "
                   "else its first event).")
@click.option("--call-graph", is_flag=True,
              help="Print the call arcs (caller,callee,calls) instead, as callgrind_annotate "
                   "--tree=caller counts them.")
@click.option("--no-strict", is_flag=True,
              help="Read a file valgrind did not finish (no 'totals:' line): the costs written.")
@_output_option
@json_option
@_friendly
def callgrind_cmd(file: str, event: str | None, call_graph: bool, no_strict: bool,
                  output: str | None, as_json: bool) -> None:
    """Print a callgrind (or cachegrind) output file's functions as CSV, by self cost:
    function,object,calls,self_EVENT,inclusive_EVENT,self_percent (recursion levels
    fn'2 and --separate-callers contexts fn'caller merged; calls empty where no arc leads
    in), or with --call-graph its arcs.
    FILE may be `-` (stdin) or gzip-compressed."""
    import pandas as pd

    from profkit.parse.callgrind import parse_callgrind_file

    prof = parse_callgrind_file(_source(file), event=event, strict=not no_strict)
    if call_graph:
        df = prof.call_edges[["caller", "callee", "calls", "caller_module", "callee_module"]]
        df = df.rename(columns={"caller_module": "caller_object",
                                "callee_module": "callee_object"})
    else:
        f = prof.functions
        ev = prof.event
        df = pd.DataFrame({"function": f["function"], "object": f["module"],
                           "calls": f["calls"], f"self_{ev}": f["self"].astype("int64"),
                           f"inclusive_{ev}": f["total"].astype("int64"),
                           "self_percent": (f["self_share"] * 100).round(4)})
    if as_json:
        import json

        doc = {"file": file, "event": prof.event, "events": list(prof.events),
               "totals": prof.totals,
               "call_edges" if call_graph else "functions": records(df)}
        text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    else:
        text = df.to_csv(index=False, lineterminator="\n")
    _emit(text, output)


@parse_group.command("explain")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--mode", type=click.Choice(["analyze_timing", "analyze_notiming", "plain"]),
              default="analyze_timing", show_default=True,
              help="What to predict the calls of: EXPLAIN ANALYZE (TIMING on or off), or the "
                   "plain query.")
@_output_option
@json_option
@_friendly
def explain_cmd(file: str, mode: str, output: str | None, as_json: bool) -> None:
    """Print, per plan node of an EXPLAIN ANALYZE output (text as psql or pgAdmin shows
    it, or FORMAT JSON), the instrumentation calls its execution makes as CSV:
    node_id,parent_id,node_type,relation,rows,loops,exec_proc_node_instr,instr_start_node,
    clock_reads,exact. The totals, with the per-query constants, go to stderr (in the
    document with --json). FILE may be `-` (stdin)."""
    from profkit.analyze.predict import PredictContext, predict
    from profkit.parse.explain import read_explain

    pred = predict([read_explain(_source(file))], PredictContext(mode=mode))
    n = pred.nodes
    df = n[["node_id", "parent_id", "node_type", "relation", "rows", "loops"]].copy()
    df["rows"] = df["rows"].round().astype("Int64")
    df["loops"] = df["loops"].round().astype("Int64")
    df["exec_proc_node_instr"] = n["exec_calls_predicted"]
    df["instr_start_node"] = n["instr_start_predicted"]
    df["clock_reads"] = n["clock_calls_predicted"]
    df["exact"] = n["exact"]
    t = pred.totals
    if as_json:
        import json

        doc = {"file": file, "mode": mode, "nodes": records(df),
               "totals": {k: t[k] for k in ("clock_reads", "clock_reads_nodes",
                                            "exec_proc_node_instr", "instr_start_node",
                                            "exact")}}
        _emit(json.dumps(doc, indent=1, allow_nan=False) + "\n", output)
        return
    _emit(df.to_csv(index=False, lineterminator="\n"), output)
    click.echo(f"{mode}: {t['clock_reads']:,} clock reads ({t['clock_reads_nodes']:,} in the "
               f"plan nodes, {t['clock_reads'] - t['clock_reads_nodes']:,} per query), "
               f"{t['exec_proc_node_instr']:,} ExecProcNodeInstr and "
               f"{t['instr_start_node']:,} InstrStartNode calls"
               + ("" if t["exact"] else "; some nodes' counts are estimates (exact=False)"),
               err=True)


def _emit(text: str, output: str | None) -> None:
    if output:
        Path(output).write_text(text, encoding="utf-8")
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        raise StdoutFailed(e) from None
