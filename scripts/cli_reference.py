"""Write docs/cli.md, the command-line reference, from the click commands themselves.

Every command and subcommand of ``profkit`` (walked through click, so a command added to
the CLI appears here without editing this file), with its help text, its usage line, its
arguments and every option (type, default, help); then the ``profkit-stackcollapse-perf``
drop-in's own ``--help``. Nothing is typed by hand: tests/test_docs.py fails when
docs/cli.md differs from what this prints.

Usage::

    .venv/bin/python scripts/cli_reference.py > docs/cli.md
    .venv/bin/python scripts/cli_reference.py --check docs/cli.md   # exit 1 when it drifted
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click

HEADER = """\
# Command-line reference

Generated from the commands themselves by `scripts/cli_reference.py`; do not edit by hand
(`tests/test_docs.py` fails when this page and the commands disagree). Regenerate with

    .venv/bin/python scripts/cli_reference.py > docs/cli.md

Every command also prints this with `--help` (`-h`). Exit status, shell completion and
`--json` are described in [commands.md](commands.md).
"""

#: click >= 8.2 marks "no default" with a sentinel of its own.
_UNSET = getattr(click.core, "UNSET", None)

#: Width click and argparse wrap text to here, so the page does not depend on the terminal.
WIDTH = 100


@dataclass(frozen=True)
class Entry:
    """One command of the tree: its full name (``profkit cluster start``) and click's objects."""

    path: str
    command: click.Command
    ctx: click.Context


def walk(cmd: click.Command, path: str, parent: click.Context | None = None) -> Iterator[Entry]:
    """Every command under *cmd*, depth first, subcommands in the order ``--help`` lists them
    (works for groups that load their commands lazily: it asks the group, not its dict)."""
    ctx = click.Context(cmd, info_name=path.split()[-1], parent=parent,
                        terminal_width=WIDTH, max_content_width=WIDTH)
    yield Entry(path, cmd, ctx)
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from walk(sub, f"{path} {name}", ctx)


def _cell(text: str) -> str:
    """Text for one Markdown table cell: one line, pipes escaped."""
    return " ".join(text.replace("\b", "").split()).replace("|", "\\|")


def _help_paragraphs(text: str) -> str:
    """A click help text as Markdown paragraphs: click's paragraphs (blank-line separated)
    are re-flowed; a paragraph marked with click's ``\\b`` keeps its lines."""
    out = []
    for para in text.strip().split("\n\n"):
        if para.lstrip().startswith("\b"):
            lines = [ln for ln in para.splitlines() if ln.strip() != "\b"]
            out.append("\n".join("    " + ln for ln in lines))
        else:
            out.append(" ".join(para.split()))
    return "\n\n".join(out)


def _default(p: click.Parameter, ctx: click.Context) -> str:
    if isinstance(p, click.Option) and (p.is_flag and not p.secondary_opts):
        return ""
    d = p.get_default(ctx, call=False)
    if d is None or d is _UNSET or callable(d) or d == () or d == []:
        return ""
    if isinstance(d, list | tuple):
        return ", ".join(f"`{x}`" for x in d)
    return f"`{d}`"


def _type(p: click.Parameter) -> str:
    if isinstance(p, click.Option) and p.is_flag and not p.secondary_opts:
        return "flag"
    t = p.type
    if isinstance(t, click.Choice):
        return " \\| ".join(f"`{c}`" for c in t.choices)
    name = t.name.upper() if t.name else "TEXT"
    if p.multiple or (isinstance(p, click.Argument) and p.nargs == -1):
        name += ", repeatable" if isinstance(p, click.Option) else "…"
    return name


def _options(e: Entry) -> list[str]:
    rows = []
    for p in e.command.get_params(e.ctx):
        if not isinstance(p, click.Option) or p.hidden or "--help" in p.opts:
            continue
        names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
        rows.append(f"| {names} | {_type(p)} | {_default(p, e.ctx)} | {_cell(p.help or '')} |")
    if not rows:
        return []
    return ["| option | value | default | what it does |", "|---|---|---|---|", *rows, ""]


def _arguments(e: Entry) -> list[str]:
    args = [p for p in e.command.params if isinstance(p, click.Argument)]
    if not args:
        return []
    out = ["Arguments: " + ", ".join(
        f"`{p.human_readable_name}` ({_type(p)}{', optional' if not p.required else ''})"
        for p in args), ""]
    return out


def command_section(e: Entry) -> list[str]:
    depth = len(e.path.split())
    title = "#" * min(depth + 1, 4) + f" `{e.path}`"
    out = [title, ""]
    help_text = e.command.help or e.command.short_help or ""
    if help_text:
        out += [_help_paragraphs(help_text), ""]
    usage = " ".join(e.command.collect_usage_pieces(e.ctx))
    out += ["```text", f"Usage: {e.path} {usage}".rstrip(), "```", ""]
    out += _arguments(e)
    out += _options(e)
    if isinstance(e.command, click.Group):
        subs = e.command.list_commands(e.ctx)
        out += ["Commands: " + ", ".join(f"`{e.path} {s}`" for s in subs), ""]
    return out


def stackcollapse_help() -> str:
    """``profkit-stackcollapse-perf --help``, at :data:`WIDTH` columns."""
    from profkit.parse.perf_script import main as full

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            full(["--help"])
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return buf.getvalue().rstrip()


def reference() -> str:
    from profkit.cli import main

    entries = list(walk(main, "profkit"))
    out = [HEADER, "## Commands", ""]
    for e in entries[1:]:
        short = e.command.get_short_help_str(limit=WIDTH)
        anchor = e.path.replace(" ", "-")
        out.append(f"- [`{e.path}`](#{anchor}) — {_cell(short)}")
    out.append("- [`profkit-stackcollapse-perf`](#profkit-stackcollapse-perf) — "
               "stackcollapse-perf.pl as a drop-in command")
    out.append("")
    for e in entries:
        out += command_section(e)
    out += ["## `profkit-stackcollapse-perf`", "",
            "A separate command installed with profkit: FlameGraph's stackcollapse-perf.pl's "
            "command line and output, with a light start-up (see "
            "[flamegraphs.md](flamegraphs.md)).", "",
            "```text", stackcollapse_help(), "```", ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", type=Path, metavar="FILE",
                    help="compare FILE with the reference instead of printing it (exit 1 if they differ)")
    a = ap.parse_args(argv)
    text = reference()
    if a.check is None:
        sys.stdout.write(text)
        return 0
    if a.check.read_text(encoding="utf-8") != text:
        print(f"{a.check} differs from the commands: run "
              f"`.venv/bin/python scripts/cli_reference.py > {a.check}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
