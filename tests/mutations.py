"""Mutations of real parser inputs, shared by the property tests
(tests/test_parser_properties.py, driven by Hypothesis) and the fuzz script
(benchmarks/fuzz_parsers.py, driven by a seeded ``random.Random``).

A mutation is a list of operations ``(kind, position, argument)``; :func:`apply` turns
one into the mutated bytes. The kinds are what real life does to a profile: a copy cut
short, line noise, blank lines, two lines run together, a garbled digit, bytes that are
not UTF-8, and long runs of padding (the input that made backtracking patterns
quadratic).
"""
from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FIX = Path(__file__).parent / "fixtures"

KINDS = ("truncate", "noise", "blank_line", "join_lines", "garble_digit", "latin1",
         "padding", "duplicate_line", "delete_line")

Op = tuple[str, int, int]


def _line_starts(b: bytes | bytearray) -> list[int]:
    starts = [0]
    i = b.find(b"\n")
    while i >= 0:
        starts.append(i + 1)
        i = b.find(b"\n", i + 1)
    return starts


def apply(data: bytes, ops: list[Op]) -> bytes:
    """*data* with each ``(kind, position, argument)`` applied in turn.

    *position* and *argument* are arbitrary non-negative integers, reduced to the data
    at hand (so a shrinking Hypothesis example stays valid)."""
    b = bytearray(data)
    for kind, pos, arg in ops:
        n = len(b)
        at = pos % (n + 1)
        if kind == "truncate":
            del b[at:]
        elif kind == "noise":
            noise = bytes((arg * 7919 + i * 104729) % 256 for i in range(1 + arg % 64))
            b[at:at] = noise
        elif kind == "padding":
            b[at:at] = (b" ", b"\t", b"0", b"-", b"x")[arg % 5] * (1 + arg % 60_000)
        elif kind in ("blank_line", "join_lines", "duplicate_line", "delete_line"):
            starts = _line_starts(b)
            k = pos % len(starts)
            s = starts[k]
            e = starts[k + 1] if k + 1 < len(starts) else len(b)
            if kind == "blank_line":
                b[s:s] = b"\n" * (1 + arg % 3)
            elif kind == "join_lines":
                if e > s and b[e - 1:e] == b"\n":
                    b[e - 1:e] = (b"", b" ", b"\t")[arg % 3]
            elif kind == "duplicate_line":
                b[s:s] = b[s:e]
            else:
                del b[s:e]
        elif kind == "garble_digit":
            digits = [i for i in range(n) if 48 <= b[i] <= 57]
            if digits:
                b[digits[pos % len(digits)]] = b"O|l.-,x "[arg % 8]
        elif kind == "latin1":
            b[at:at] = bytes([0xE9, 0xE8, 0xFF, 0xC3, 0x80][arg % 5:arg % 5 + 1 + arg % 2])
        else:  # pragma: no cover
            raise ValueError(kind)
    return bytes(b)


# --------------------------------------------------------------------------- parsers


@dataclass(frozen=True)
class Target:
    """A parser under test: how to call it on a file, and its real inputs."""

    name: str
    parse: Callable[[Path], object]
    fixtures: tuple[Path, ...]  # small real inputs, mutated
    big: Path | None = None  # a large real input for time per MB (may be .gz)
    suffix: str = ".txt"


def _gprof(p: Path) -> object:
    from profkit.parse.gprof import parse_gprof

    return parse_gprof(p)


def _callgrind(p: Path) -> object:
    from profkit.parse.callgrind import parse_callgrind_file

    return parse_callgrind_file(p)


def _ltrace(p: Path) -> object:
    from profkit.parse.ltrace import read_ltrace_summary

    return read_ltrace_summary(p)


def _perf_stat(p: Path) -> object:
    from profkit.parse.perf_stat import parse_perf_stat

    return parse_perf_stat(p)


def _explain(p: Path) -> object:
    from profkit.parse.explain import flatten_plan

    return flatten_plan(p.read_bytes())


def _explain_text(p: Path) -> object:
    from profkit.parse.explain import flatten_plan

    return flatten_plan(p.read_bytes().decode("utf-8", "replace"))


TARGETS: dict[str, Target] = {
    "gprof": Target("gprof", _gprof, (FIX / "gprof" / "cycles.gprof.txt",
                                      FIX / "gprof" / "cycles.brief.gprof.txt"),
                    big=FIX / "gprof" / "pg18-query2.gprof.txt.gz"),
    "callgrind": Target("callgrind", _callgrind, (FIX / "callgrind" / "fib.callgrind.out",),
                        big=FIX / "callgrind" / "pg18_nested_loop_analyze_notiming.callgrind.out.gz",
                        suffix=".out"),
    "ltrace": Target("ltrace", _ltrace, (FIX / "ltrace" / "join_sum_notiming_instr.txt",
                                         FIX / "ltrace" / "join_sum_timing.txt")),
    "perf_stat": Target("perf_stat", _perf_stat, (FIX / "perf_stat" / "sleep.perf-stat.csv",),
                        suffix=".csv"),
    "explain_json": Target("explain_json", _explain, (FIX / "plans" / "subplans.json",
                                                      FIX / "plans" / "nestloop_limit.json"),
                           suffix=".json"),
    "explain_text": Target("explain_text", _explain_text,
                           (FIX / "plans" / "text" / "initplan_subplan.psql.txt",
                            FIX / "plans" / "text" / "cte.psql.txt")),
}


def read_input(p: Path) -> bytes:
    """A fixture's bytes, decompressed when it is gzip."""
    data = p.read_bytes()
    return gzip.decompress(data) if p.suffix == ".gz" else data
