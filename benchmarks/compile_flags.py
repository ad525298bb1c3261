"""What the debug-info flags cost a PostgreSQL compile: CPU seconds to compile one
directory's files of a cached build with profkit's CFLAGS and with variants of them.

    python benchmarks/compile_flags.py [--build vanilla] [--dir src/backend/executor]
                                       [--rounds 3]

Every file is compiled with ``gcc -c`` exactly as the build's Makefile.global says (its
CFLAGS, CPPFLAGS and include paths), without ccache, one compile at a time, the flag sets
interleaved file by file and their order rotated each round, so a slow minute of the host
falls on every flag set alike.  Prints each set's CPU seconds (user + system of the
compiler) per round, the median ratio to the base flags, and the object sizes.

The flag sets:

- ``base``: profkit's flags (``-O2 -g`` with frame pointers);
- ``no-vta``: base + ``-fno-var-tracking-assignments``;
- ``no-vt``: base + ``-fno-var-tracking`` (no location lists for variables; the types,
  line tables and inline records that profkit reads, DWARF struct offsets and
  ``addr2line -i``, stay);
- ``no-g``: base without ``-g`` (what debug information costs in all; profkit cannot drop
  it: its probes read struct offsets from DWARF).

A lever for the time a fresh machine spends compiling; changing profkit's flags changes every
build key, so the next make test compiles every build again.
"""
from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def makefile_var(global_mk: Path, name: str) -> str:
    for line in global_mk.read_text().splitlines():
        if line.startswith(f"{name} =") or line.startswith(f"{name}="):
            return line.split("=", 1)[1].strip()
    raise SystemExit(f"{name} not in {global_mk}")


def cpu_of(argv: list[str]) -> float:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="vanilla")
    ap.add_argument("--dir", default="src/backend/executor")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from profkit.pg.build import find_build

    b = find_build(args.build)
    if b is None:
        raise SystemExit(f"build {args.build!r} is not in the cache: profkit build {args.build}")
    tree, src = b.dir / "build", b.dir / "src"
    mk = tree / "src" / "Makefile.global"
    cflags = shlex.split(makefile_var(mk, "CFLAGS"))
    cppflags = shlex.split(makefile_var(mk, "CPPFLAGS"))
    files = sorted((src / args.dir).glob("*.c"))
    if not files:
        raise SystemExit(f"no .c files in {src / args.dir}")
    base = list(cflags)
    sets = {
        "base": base,
        "no-vta": base + ["-fno-var-tracking-assignments"],
        "no-vt": base + ["-fno-var-tracking"],
        "no-g": [f for f in base if f != "-g"],
    }
    inc = ["-I", str(tree / "src" / "include"), "-I", str(src / "src" / "include"),
           "-I", str(tree / "src" / "backend" / "utils" / "misc"), "-I", str(src / args.dir)]
    print(f"# {len(files)} files of {args.dir} ({args.build}, {b.dir.name}), gcc -c without "
          f"ccache, {args.rounds} rounds, load average at the start {os.getloadavg()[0]:.2f}")
    names = list(sets)
    cpu = {n: [0.0] * args.rounds for n in names}
    size = dict.fromkeys(names, 0)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for f in files:
                for n in order:
                    out = Path(tmp) / f"{n}.o"
                    cpu[n][r] += cpu_of(["gcc", *sets[n], *cppflags, *inc, "-c", str(f),
                                         "-o", str(out)])
                    if r == 0:
                        size[n] += out.stat().st_size
            print(f"round {r + 1}: " + ", ".join(f"{n} {cpu[n][r]:.1f} s" for n in names),
                  flush=True)
    print("\n| flags | CPU s (median of rounds) | ratio to base (median) | objects KiB |")
    print("|---|---|---|---|")
    for n in names:
        ratio = statistics.median(cpu[n][r] / cpu["base"][r] for r in range(args.rounds))
        print(f"| {n} | {statistics.median(cpu[n]):.1f} | {ratio:.3f} | {size[n] // 1024} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
