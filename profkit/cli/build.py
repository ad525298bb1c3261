"""``profkit build``: build PostgreSQL variants (cached) — library presets, or a named
build of your own patches (``profkit build NAME --patch FILE``)."""
from __future__ import annotations

import click

from profkit.cli.common import Failed, err_console, friendly, say
from profkit.errors import ProfkitError


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
@click.option("--check", "--dry-run", "check", is_flag=True,
              help="Compile nothing: resolve each build (all presets when none is named), get "
                   "its source, and apply its patches to a scratch copy; report each.")
@friendly
def build(presets: tuple[str, ...], source: str | None, patch_files: tuple[str, ...],
          base: str, configure_opts: tuple[str, ...], cflags: str, list_: bool,
          check: bool) -> None:
    """Build PostgreSQL variants (cached; an unchanged build is never rebuilt).

    Several names are made in the order given, one compile at a time (make uses every
    core), while the next one copies its source, applies its patches and runs configure.

    A preset prefixed pg19/ (pg19/vanilla, pg19/step5) is built from PostgreSQL 19:
    $PROFKIT_PG19_SOURCE if set (e.g. tarball:../shared/pg-sources/postgresql-19beta1.tar.bz2),
    else debian:postgresql-19 (Debian's experimental suite).  The prefix works wherever a
    build is named (bench --builds, cluster start, regress).  So do the suffixes @clang
    (compiled with clang: step5@clang) and @layoutN (the same code linked in another
    function order, lld's --shuffle-sections with seed N: vanilla@layout2).

    NAME --patch FILE [--patch FILE ...]: a named build of your own patches on --base.

    --check: a dry run that shows each build resolves and its patches apply."""
    from profkit.pg.build import custom_specs, define_build, get_builds, list_builds
    from profkit.pg.build import presets as all_presets

    custom = patch_files or configure_opts or cflags
    if custom and len(presets) != 1:
        raise Failed("--patch/--configure/--cflags make one named build: "
                     "profkit build NAME --patch FILE [--patch FILE ...]")
    if check:
        if custom or list_:
            raise Failed("--check takes build names only (define a named build first)")
        _check(presets or tuple(all_presets()), source)
        return
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
    # several: the next one's source copy, patches and configure beside this one's compile
    with err_console.status(f"building {', '.join(presets)}"):
        get_builds(presets, source=source, progress=say,
                   on_built=lambda b: click.echo(f"{b.name}\t{b.version}\t{b.prefix}"))


def _check(names: tuple[str, ...], source: str | None) -> None:
    """One line per build on stdout (NAME, version, what applies); one error at the end."""
    from profkit.pg.build import check_build

    failed: list[str] = []
    for name in names:
        try:
            with err_console.status(f"checking {name}"):
                c = check_build(name, source=source)
        except ProfkitError as e:
            failed.append(name)
            click.echo(f"{name}\tFAILED\t{e}")
            continue
        n = len(c.patches)
        applied = (f"{n} {'patch applies' if n == 1 else 'patches apply'} "
                   f"({', '.join(_stem(p) for p in c.patches)}; {c.files} "
                   f"{'file' if c.files == 1 else 'files'})"
                   if n else "no patches")
        click.echo(f"{c.name}\t{c.version}\t{applied}\t{c.source}\t"
                   f"{'built (cached)' if c.cached else 'not built yet'}")
    if failed:
        raise ProfkitError(f"{len(failed)} of {len(names)} builds do not resolve or their patches "
                           f"do not apply: {', '.join(failed)} (each one's reason is above)")


def _stem(path: str) -> str:
    from pathlib import Path

    return Path(path).stem
