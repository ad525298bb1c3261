"""``python -m profkit`` and the ``profkit`` command: the command line.

``profkit parse perf-script FILE`` with only stackcollapse-perf.pl's options is answered
without loading click or the command modules (:func:`profkit.stackcollapse.command_main`:
a fold of a 50 MB capture takes a fraction of a second, start-up would be most of it);
everything else goes to :mod:`profkit.cli`."""
from __future__ import annotations

import sys


def main() -> None:
    args = sys.argv[1:]
    if args[:2] == ["parse", "perf-script"]:
        from profkit.stackcollapse import command_main

        status = command_main(args[2:])
        if status is not None:
            sys.exit(status)
    from profkit.cli import main as cli

    cli(prog_name="profkit")


if __name__ == "__main__":
    main()
