"""``profkit build``: build PostgreSQL variants (cached) — library presets, or a named
build of your own patches (``profkit build NAME --patch FILE``)."""
from __future__ import annotations

import click

from profkit.cli.common import Failed, err_console, friendly, say


@click.command("build")
@click.argument("presets", nargs=-1)
@click.option("--source", default=None,
              help="debian:postgresql-18 (default), debian:postgresql-19, git:/path, "
                   "tarball:/path.tar.bz2 (the patches of its major version are used)")
@click.option("--patch", "patch_files", multiple=True, metavar="FILE",
              help="Make NAME a build of --base plus this patch (-p1 unified diff; repeatable, "
                   "applied in order). NAME is then usable wherever a preset name is.")
@click.option("--base", default="vanilla", show_default=True,
              help="The preset (or named build) the patches go on top of.")
@click.option("--configure", "configure_opts", multiple=True, metavar="OPT",
              help="Extra ./configure option for NAME (repeatable).")
@click.option("--cflags", default="", help="Extra CFLAGS for NAME, after the base's.")
@click.option("--list", "list_", is_flag=True, help="List presets and cached builds.")
@friendly
def build(presets: tuple[str, ...], source: str | None, patch_files: tuple[str, ...],
          base: str, configure_opts: tuple[str, ...], cflags: str, list_: bool) -> None:
    """Build PostgreSQL variants (cached; an unchanged build is never rebuilt).

    A preset prefixed pg19/ (pg19/vanilla, pg19/step5) is built from PostgreSQL 19:
    $PROFKIT_PG19_SOURCE if set (e.g. tarball:../shared/pg-sources/postgresql-19beta1.tar.bz2),
    else debian:postgresql-19 (Debian's experimental suite).  The prefix works wherever a
    build is named (bench --builds, cluster start, regress).  So do the suffixes @clang
    (compiled with clang: step5@clang) and @layoutN (the same code linked in another
    function order, lld's --shuffle-sections with seed N: vanilla@layout2).

    NAME --patch FILE [--patch FILE ...]: a named build of your own patches on --base."""
    from profkit.pg.build import custom_specs, define_build, get_build, list_builds
    from profkit.pg.build import presets as all_presets

    custom = patch_files or configure_opts or cflags
    if custom and len(presets) != 1:
        raise Failed("--patch/--configure/--cflags make one named build: "
                     "profkit build NAME --patch FILE [--patch FILE ...]")
    if list_ or not presets:
        mine = custom_specs()
        for name, spec in all_presets().items():
            tag = "  (yours)" if name in mine or name.removesuffix("+gprof") in mine else ""
            click.echo(f"{name:24s} {spec.description}{tag}")
        click.echo("\ncached builds:")
        shown = list_builds(defined_only=True)
        for b in shown:
            click.echo(f"  {b.name:22s} {b.version:8s} {b.key[:12]} {b.dir}")
        others = len(list_builds()) - len(shown)
        if others:
            click.echo(f"  (and {others} cached build{'s' if others > 1 else ''} of names not "
                       f"defined here: earlier definitions or another $PROFKIT_SPECS)")
        return
    if custom:
        spec = define_build(presets[0], patch_files, base=base, configure_opts=configure_opts,
                            cflags=cflags, source=source)
        say(f"{spec.name}: {spec.description}")
    for p in presets:
        with err_console.status(f"building {p}"):
            b = get_build(p, source=source, progress=say)
        click.echo(f"{b.name}\t{b.version}\t{b.prefix}")
