"""``profkit regress``: PostgreSQL's own regression suite on builds."""
from __future__ import annotations

import sys

import click

from profkit.cli.common import err_console, friendly, say


@click.command("regress")
@click.argument("builds", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every preset of the patch library.")
@friendly
def regress(builds: tuple[str, ...], all_: bool) -> None:
    """Run PostgreSQL's regression suite (make check) on builds; print a result table."""
    from profkit.patches import PRESETS
    from profkit.pg.build import get_build
    from profkit.pg.regress import regress as run_regress

    names = list(PRESETS) if all_ else list(builds)
    if not names:
        raise click.UsageError("name builds or pass --all")
    failed = 0
    for n in names:
        b = get_build(n, progress=say)
        with err_console.status(f"make check on {n}"):
            r = run_regress(b)
        failed += not r.passed
        status = "ok" if r.passed else "FAILED"
        click.echo(f"{n:16s} {status:7s} tests={r.tests:4d} failed={r.failed:3d} "
                   f"{r.seconds:6.0f} s  log={r.log}" + (f" diffs={r.diffs}" if r.diffs else ""))
    if failed:
        sys.exit(1)
