"""Fuzz the gprof, callgrind, ltrace, perf stat and EXPLAIN JSON parsers.

Each parser gets ``--n`` (default 1,000) mutations of its real fixtures
(tests/mutations.py: truncation, noise, blank lines, joined lines, garbled digits,
non-UTF-8 bytes, long padding, duplicated/deleted lines; one to four at a time), a
tenth of them gzip-compressed (and some of those with the compressed bytes mutated).
Every input is written to a file and parsed by path, as the CLI does. The outcome is a
result, a ParseError, or anything else — a crash, which must never happen (exit 1).

Time per MB: the slowest mutated case (time / its size, over inputs of 100 kB and more
— one case in 20 mutates a large real input — so start-up costs do not dominate)
against the parser's rate on an unmutated large real input measured in the same run
(the peer): a quadratic pattern shows as a ratio far above 1.

Usage::

    .venv/bin/python benchmarks/fuzz_parsers.py            # 1,000 per parser, seed 14
    .venv/bin/python benchmarks/fuzz_parsers.py --n 5000 --seed 7 --only gprof
"""
from __future__ import annotations

import argparse
import gzip
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from mutations import KINDS, TARGETS, Op, apply, read_input  # noqa: E402

from profkit.errors import ParseError  # noqa: E402

MB = 1 << 20
MIN_TIMED = 100_000  # bytes: smaller inputs are dominated by fixed costs


def _ops(rng: random.Random) -> list[Op]:
    return [(rng.choice(KINDS), rng.randrange(10**9), rng.randrange(10**6))
            for _ in range(rng.randint(1, 4))]


def _time(fn, path: Path) -> tuple[str, float, str]:
    t0 = time.perf_counter()
    try:
        fn(path)
        outcome, detail = "result", ""
    except ParseError as e:
        outcome, detail = "parse_error", str(e)
    except Exception as e:  # noqa: BLE001 - counting what must not happen
        outcome, detail = "other", "".join(traceback.format_exception_only(e)).strip()
    return outcome, time.perf_counter() - t0, detail


def large_input(name: str) -> bytes:
    """The large real input (or, for formats with small fixtures only, a larger valid
    input built from the fixture's own lines)."""
    t = TARGETS[name]
    src = t.big or max(t.fixtures, key=lambda p: p.stat().st_size)
    data = read_input(src)
    if len(data) < 256 * 1024:
        data = _repeat(name, data, 256 * 1024)
    return data


def peer_rate(name: str, tmp: Path) -> tuple[float, int]:
    """Seconds per MB on the large unmutated input (best of 3)."""
    t = TARGETS[name]
    data = large_input(name)
    p = tmp / f"peer-{name}{t.suffix}"
    p.write_bytes(data)
    best = min(_time(t.parse, p)[1] for _ in range(3))
    outcome = _time(t.parse, p)[0]
    if outcome != "result":
        raise SystemExit(f"{name}: the unmutated peer input does not parse ({outcome})")
    return best / (len(data) / MB), len(data)


def _repeat(name: str, data: bytes, size: int) -> bytes:
    """A larger valid input of the same format, for formats whose fixtures are small."""
    if name == "perf_stat":
        lines = [ln for ln in data.splitlines(True) if ln.strip() and not ln.startswith(b"#")]
        out = bytearray()
        i = 0
        while len(out) < size:
            out += lines[i % len(lines)].replace(b",", f",{i}".encode(), 0)
            i += 1
        return bytes(out)
    if name == "ltrace":
        lines = data.splitlines(True)
        rule = lines[1]
        rows = [ln for ln in lines[2:] if ln.strip() and ln != rule and b"total" not in ln]
        body = bytearray()
        calls = 0
        i = 0
        while len(body) < size:
            row = rows[i % len(rows)]
            parts = row.split()
            calls += int(parts[3])
            body += row.rstrip(b"\n") + f"_{i}\n".encode()
            i += 1
        return b"".join(lines[:2]) + bytes(body) + rule + \
            f"100.00   41.232639                 {calls} total\n".encode()
    if name == "explain_json":
        import json

        plan = json.loads(data)
        node = plan[0]["Plan"]
        wide = {"Node Type": "Append", "Actual Rows": 1.0, "Actual Loops": 1,
                "Plans": [dict(node, **{"Parent Relationship": "Member"})
                          for _ in range(max(1, size // len(data)))]}
        return json.dumps([{"Plan": wide}]).encode()
    return data * max(1, size // len(data))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="mutations per parser")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--only", choices=sorted(TARGETS), action="append")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    names = args.only or sorted(TARGETS)
    rows = []
    crashes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="profkit-fuzz-") as d:
        tmp = Path(d)
        for name in names:
            t = TARGETS[name]
            peer, peer_size = peer_rate(name, tmp)
            counts = {"result": 0, "parse_error": 0, "other": 0}
            slowest = (0.0, 0, 0.0, "")  # s/MB, size, seconds, ops
            sources = [read_input(p) for p in t.fixtures]
            large = large_input(name)
            for i in range(args.n):
                # one case in 20 mutates the large input, so time per MB is measured on
                # inputs where start-up costs (pandas tables) do not dominate
                raw = large if i % 20 == 19 else sources[i % len(sources)]
                ops = _ops(rng)
                gz = name != "explain_json" and i % 10 == 9
                if gz and rng.random() < 0.5:
                    data = apply(gzip.compress(raw), ops)
                    size = len(raw)  # text size: time per MB is over what is parsed
                else:
                    data = apply(raw, ops)
                    size = len(data)
                    if gz:
                        data = gzip.compress(data)
                p = tmp / (f"case{t.suffix}" + (".gz" if gz else ""))
                p.write_bytes(data)
                outcome, secs, detail = _time(t.parse, p)
                counts[outcome] += 1
                if outcome == "other":
                    crashes.append(f"{name} #{i} ops={ops} gz={gz}: {detail}")
                if size >= MIN_TIMED:
                    per_mb = secs / (size / MB)
                    if per_mb > slowest[0]:
                        slowest = (per_mb, size, secs, repr(ops) + (" (gzip)" if gz else ""))
            rows.append((name, args.n, counts, slowest, peer, peer_size))
    print(f"fuzz: {args.n} mutations per parser, seed {args.seed}")
    print(f"{'parser':13} {'inputs':>6} {'result':>7} {'ParseError':>10} {'other':>6} "
          f"{'slowest s/MB':>12} {'(size, s)':>17} {'peer s/MB':>9} {'ratio':>6}")
    for name, n, c, (per_mb, size, secs, _), peer, _ps in rows:
        print(f"{name:13} {n:6d} {c['result']:7d} {c['parse_error']:10d} {c['other']:6d} "
              f"{per_mb:12.3f} {f'({size:,} B, {secs:.3f})':>17} {peer:9.3f} "
              f"{per_mb / peer if peer else float('nan'):6.1f}")
    print("peer: the same parser on an unmutated large real input (MB): "
          + ", ".join(f"{r[0]} {r[5] / MB:.2f}" for r in rows))
    for r in rows:
        print(f"slowest {r[0]}: {r[3][3]}")
    if crashes:
        print(f"\n{len(crashes)} inputs raised something other than ParseError:")
        for c in crashes[:20]:
            print("  " + c)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
