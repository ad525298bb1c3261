"""The ``profkit`` command line: the main group and the ONE list of its commands.

Each command group lives in its own small module here; this file imports every one of
them plainly, so a module that fails to import fails ``profkit`` loudly (there is no
"optional" command). Library errors become one-line messages and exit status 1, usage
errors exit 2 (see :mod:`profkit.cli.common` and the README's "Exit status"). Commands
hold no library code: they parse arguments, call one experiment (the parse and flamegraph
commands: a parser and a renderer) and print its result. Each command lives in the module
named after it and imports its experiment inside the command function, so ``profkit
--version`` starts without the heavy libraries.
"""
from __future__ import annotations

import click

from profkit import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="profkit",
                      message="%(prog)s %(version)s")
@click.option("-v", "--verbose", is_flag=True, help="Log every external command.")
def main(verbose: bool) -> None:
    """profkit: profile PostgreSQL's executor instrumentation (EXPLAIN ANALYZE overhead).

    Exit status: 0 success, 1 the work failed (the message says why and what to do),
    2 usage error, 130 interrupted. Shell completion: see the README."""
    import logging  # here, not at the top: --help and --version never need it

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(name)s: %(message)s")


# Imported after `main` exists; none of these modules imports this one.
from profkit.cli import (  # noqa: E402
    bench,
    build,
    cluster,
    correction,
    export,
    flamegraph,
    nodetime,
    observers,
    parse,
    probe,
    profile,
    regress,
    timing_accuracy,
)

#: Every command of ``profkit`` (``--help`` lists them alphabetically).
COMMANDS: list[click.Command] = [
    build.build,
    cluster.cluster,
    cluster.load,
    regress.regress,
    parse.parse_group,
    flamegraph.flamegraph_cmd,
    export.export_cmd,
    probe.clock_cost_cmd,
    probe.clock_calls_cmd,
    probe.probe_cmd,
    bench.bench_cmd,
    bench.reproduce_cmd,
    observers.observers_cmd,
    correction.correction_cmd,
    profile.perf_cmd,
    profile.gprof_cmd,
    profile.callgrind_cmd,
    profile.pyspy_cmd,
    profile.import_cmd,
    profile.record_script_cmd,
    timing_accuracy.timing_accuracy_cmd,
    nodetime.nodetime_cmd,
]

for _cmd in COMMANDS:
    main.add_command(_cmd)

__all__ = ["COMMANDS", "main"]
