"""Which child a plan node's call site runs: a return address inside a join's function →
``"outer"`` or ``"inner"``, from the binary's line tables and the executor's source.

A join calls its children through ``ExecProcNode(outerPlan)`` / ``ExecProcNode(innerPlan)``
(``MultiExecProcNode(hashNode)`` for a Hash Join's inner side), inlined at -O2 into
separate call instructions. perf records each non-leaf frame's return address
(``ExecNestLoop+0x93``); ``addr2line -i`` on the address before it gives the inline
chain: ``ExecProcNode`` (executor.h) inlined at nodeNestloop.c:159. That source line —
``innerTupleSlot = ExecProcNode(innerPlan);`` — names the side: a word starting with
``outer`` or ``inner`` (``hashNode``: inner) in the call. A line that names neither, a
call that is not ``ExecProcNode``/``MultiExecProcNode``, a binary without line tables or a
source tree that is gone gives None: the attribution then says the stack is ambiguous.

The symbol's address comes from the binary's symbol table (``nm``), so the result does
not depend on where the process mapped the binary.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from profkit.processes import run as run_argv
from profkit.processes import which

CHILD_CALLS = frozenset({"ExecProcNode", "MultiExecProcNode"})
_OUTER = re.compile(r"\bouter\w*", re.IGNORECASE)
_INNER = re.compile(r"\b(inner\w*|hashNode|hashstate)\b", re.IGNORECASE)


class CallSites:
    """Resolves (function, offset) frames of one binary to a join side."""

    def __init__(self, binary: str | os.PathLike[str]) -> None:
        self.binary = str(binary)
        self._symbols: dict[str, int] | None = None
        self._cache: dict[tuple[str, int], str | None] = {}
        self._lines: dict[str, list[str] | None] = {}
        self.source_lines: dict[tuple[str, int], str] = {}
        self._frameless: dict[str, frozenset[int]] = {}
        self._sizes: dict[str, int] = {}

    def _load_symbols(self) -> dict[str, int]:
        if self._symbols is None:
            cp = run_argv([which("nm"), "-S", "--defined-only", self.binary], timeout=120,
                          check=False, what="nm")
            syms: dict[str, int] = {}
            for line in (cp.stdout or "").splitlines():
                parts = line.split()
                if len(parts) == 4 and parts[2] in "tTwW":
                    syms.setdefault(parts[3], int(parts[0], 16))
                    self._sizes.setdefault(parts[3], int(parts[1], 16))
                elif len(parts) == 3 and parts[1] in "tTwW":
                    syms.setdefault(parts[2], int(parts[0], 16))
            self._symbols = syms
        return self._symbols

    def _source(self, path: str) -> list[str] | None:
        if path not in self._lines:
            try:
                self._lines[path] = Path(os.path.normpath(path)).read_text(
                    errors="replace").splitlines()
            except OSError:
                self._lines[path] = None
        return self._lines[path]

    def resolve(self, frames: Iterable[tuple[str, int]]) -> None:
        """Look up many (function, offset) pairs at once (one addr2line process)."""
        syms = self._load_symbols()
        todo: list[tuple[tuple[str, int], int]] = []
        for name, off in frames:
            key = (name, off)
            if key in self._cache:
                continue
            base = syms.get(name)
            if base is None or off <= 0:
                self._cache[key] = None
                continue
            todo.append((key, base + off - 1))  # the call instruction, not the next one
        if not todo:
            return
        # -a: each block starts with the address (inline chains have a variable length)
        argv = [which("addr2line"), "-a", "-f", "-i", "-e", self.binary]
        stdin = "".join(f"{hex(a)}\n" for _k, a in todo)
        cp = run_argv(argv, input=stdin, timeout=300, check=False, what="addr2line")
        blocks = _split_blocks((cp.stdout or "").splitlines())
        for (key, _a), block in zip(todo, blocks, strict=False):
            self._cache[key] = self._side(key, block)
        for key, _a in todo:
            self._cache.setdefault(key, None)

    def _side(self, key: tuple[str, int], chain: list[tuple[str, str]]) -> str | None:
        # chain: (function, file:line) innermost inline frame first; the inlined
        # ExecProcNode first, else the call of the real MultiExecProcNode on the line
        if not chain:
            return None
        inlined = chain[0][0] in CHILD_CALLS
        if inlined and len(chain) < 2:
            return None
        where = chain[1][1] if inlined else chain[0][1]
        path, _, line = where.rpartition(":")
        line = line.split()[0] if line else ""
        if not line.isdigit():
            return None
        text = self._source(path)
        if text is None or not 0 < int(line) <= len(text):
            return None
        src = text[int(line) - 1]
        if not inlined and "ExecProcNode(" not in src:
            return None
        self.source_lines[key] = src.strip()
        call = src[src.find("ExecProcNode") - 5:] if "ExecProcNode" in src else src
        outer, inner = bool(_OUTER.search(call)), bool(_INNER.search(call))
        if outer == inner:
            return None
        return "outer" if outer else "inner"

    def frameless_offsets(self, name: str) -> frozenset[int]:
        """Offsets in function *name* where it has no frame of its own (before ``mov
        %rsp,%rbp``, and after ``leave``/``pop %rbp`` up to its ``ret`` or tail ``jmp``):
        a sample there loses the caller's frame in a frame-pointer walk."""
        if name in self._frameless:
            return self._frameless[name]
        syms = self._load_symbols()
        start = syms.get(name)
        out: set[int] = set()
        if start is not None:
            end = self._sizes.get(name) or 0
            cp = run_argv([which("objdump"), "-d", "--no-show-raw-insn",
                           f"--start-address={start:#x}",
                           f"--stop-address={start + max(end, 1):#x}", self.binary],
                          timeout=60, check=False, what="objdump")
            set_up = False
            torn = False
            for line in (cp.stdout or "").splitlines():
                m = _INSN.match(line)
                if m is None:
                    continue
                off = int(m.group(1), 16) - start
                insn = m.group(2).strip()
                if not set_up:
                    out.add(off)
                    if insn.startswith("mov") and "%rsp,%rbp" in insn:
                        set_up = True
                    continue
                if torn:
                    out.add(off)
                    if insn.startswith(("ret", "jmp")):
                        torn = False
                    continue
                if insn.startswith("leave") or (insn.startswith("pop") and "%rbp" in insn):
                    torn = True
        self._frameless[name] = frozenset(out)
        return self._frameless[name]

    def lost_caller(self, name: str, offset: int | None, module: str | None) -> bool | None:
        """For a sample's leaf frame: True when the walk lost its caller's frame (see
        :meth:`frameless_offsets`), None for a leaf in another user-space module (system
        libraries have no frame pointers: the caller is always lost), False otherwise."""
        mod = module or ""
        if "kernel" in mod or mod.startswith("[") and mod not in ("[vdso]",):
            return False
        if os.path.basename(mod) != os.path.basename(self.binary):
            return None
        if offset is None:
            return False
        return offset in self.frameless_offsets(name)

    def side(self, name: str, offset: int | None) -> str | None:
        """"outer", "inner" or None for the return address *name*+*offset*."""
        if offset is None:
            return None
        key = (name, offset)
        if key not in self._cache:
            self.resolve([key])
        return self._cache.get(key)


def _split_blocks(lines: list[str]) -> list[list[tuple[str, str]]]:
    """addr2line -a -f -i output: per address its line, then (function, file:line) pairs."""
    blocks: list[list[tuple[str, str]]] = []
    i = 0
    while i < len(lines):
        if _ADDR.match(lines[i].strip()):
            blocks.append([])
            i += 1
            continue
        if blocks and i + 1 < len(lines):
            blocks[-1].append((lines[i].strip(), lines[i + 1].strip()))
        i += 2
    return blocks


_ADDR = re.compile(r"^0x[0-9a-fA-F]+$")
_INSN = re.compile(r"^\s*([0-9a-f]+):\s+(.*)$")
