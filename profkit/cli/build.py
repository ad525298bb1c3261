"""``profkit build``: build PostgreSQL variants (cached)."""
from __future__ import annotations

import click

from profkit.cli.common import err_console, friendly, say


@click.command("build")
@click.argument("presets", nargs=-1)
@click.option("--source", default=None,
              help="debian:postgresql-18 (default), debian:postgresql-19, git:/path, "
                   "tarball:/path.tar.bz2 (the patches of its major version are used)")
@click.option("--list", "list_", is_flag=True, help="List presets and cached builds.")
@friendly
def build(presets: tuple[str, ...], source: str | None, list_: bool) -> None:
    """Build PostgreSQL variants (cached; an unchanged build is never rebuilt).

    A preset prefixed pg19/ (pg19/vanilla, pg19/step5) is built from PostgreSQL 19:
    $PROFKIT_PG19_SOURCE if set (e.g. tarball:../shared/pg-sources/postgresql-19beta1.tar.bz2),
    else debian:postgresql-19 (Debian's experimental suite).  The prefix works wherever a
    build is named (bench --builds, cluster start, regress)."""
    from profkit.pg.build import get_build, list_builds
    from profkit.pg.build import presets as all_presets

    if list_ or not presets:
        for name, spec in all_presets().items():
            click.echo(f"{name:24s} {spec.description}")
        click.echo("\ncached builds:")
        for b in list_builds():
            click.echo(f"  {b.name:22s} {b.version:8s} {b.key[:12]} {b.dir}")
        return
    for p in presets:
        with err_console.status(f"building {p}"):
            b = get_build(p, source=source, progress=say)
        click.echo(f"{b.name}\t{b.version}\t{b.prefix}")
