"""Struct member offsets and enum values from a binary's DWARF debug info.

The BPF probes in :mod:`profkit.collect.bpf` read ``PlanState->plan->plan_node_id``
and ``PlanState->type`` out of the backend's memory.  The offsets of those
members depend on the PostgreSQL version, the configure flags and the patches
applied, so they are read from the build's own DWARF here (pyelftools), never
hard-coded.

Speed: the postgres binary carries ~20 MB of ``.debug_info`` in ~900
compilation units.  Parsing all of it in pure Python takes minutes, so we

- walk the CUs lazily, only their top-level DIEs (gcc emits DW_AT_sibling, so
  whole subtrees such as function bodies are skipped);
- look at CUs named by a hint first (``execProcnode.c`` includes every
  executor header), then fall back to the full walk, and stop as soon as every
  requested type is found;
- cache each type found (all its members, not only the ones asked for) in
  ``~/.cache/profkit/dwarf/<key>.json``, keyed by the binary's path and its
  GNU build-id (or mtime+size when it has none), so a rebuild invalidates it.

A binary without DWARF (Debian's stripped postgres, any ``strip``-ed copy)
raises :class:`ProbeError` telling the user to use a profkit build.  A
separate debug file found by build-id under ``/usr/lib/debug/.build-id`` is
used when present.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.dwarf.die import DIE
from elftools.elf.elffile import ELFFile

from profkit import paths
from profkit.errors import ProbeError

CACHE_VERSION = 1
DEBUG_ROOT = Path("/usr/lib/debug/.build-id")
# CUs that define the executor's structs and the NodeTag enum: tried first.
DEFAULT_HINTS: tuple[str, ...] = ("execProcnode.c", "instrument.c", "explain.c")

_STRIP_TAGS = frozenset({
    "DW_TAG_typedef", "DW_TAG_const_type", "DW_TAG_volatile_type",
    "DW_TAG_restrict_type", "DW_TAG_atomic_type",
})


@dataclass(frozen=True)
class Member:
    """One struct member: byte offset from the start of the struct, byte size."""

    name: str
    offset: int
    size: int | None
    type_name: str
    bit_offset: int | None = None  # bit-fields only
    bit_size: int | None = None


@dataclass(frozen=True)
class StructLayout:
    name: str
    size: int | None
    members: dict[str, Member]

    def offset(self, path: str) -> int:
        try:
            return self.members[path].offset
        except KeyError:
            raise ProbeError(
                f"struct {self.name} has no member {path!r}; members: "
                f"{', '.join(sorted(self.members))[:400]}") from None


# ---------------------------------------------------------------------------
# Binary identity and cache


def build_id(elf: ELFFile) -> str | None:
    for sec in elf.iter_sections():
        if sec.header.sh_type != "SHT_NOTE":
            continue
        for note in sec.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID":
                return str(note["n_desc"])
    return None


def _identity(binary: Path, elf: ELFFile) -> str:
    bid = build_id(elf)
    if bid:
        return f"buildid:{bid}"
    st = binary.stat()
    return f"mtime:{st.st_mtime_ns}:size:{st.st_size}"


def _cache_file(binary: Path, ident: str) -> Path:
    key = hashlib.sha256(f"{binary.resolve()}\0{ident}".encode()).hexdigest()[:24]
    return paths.sub("dwarf") / f"{key}.json"


def _load_cache(p: Path, binary: Path, ident: str) -> dict[str, Any]:
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {"version": CACHE_VERSION, "binary": str(binary), "identity": ident,
                "structs": {}, "enums": {}}
    if data.get("version") != CACHE_VERSION or data.get("identity") != ident:
        return {"version": CACHE_VERSION, "binary": str(binary), "identity": ident,
                "structs": {}, "enums": {}}
    return data


def _save_cache(p: Path, data: dict[str, Any]) -> None:
    tmp = p.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(p)


# ---------------------------------------------------------------------------
# DWARF walking


def _name(die: DIE) -> str | None:
    a = die.attributes.get("DW_AT_name")
    if a is None:
        return None
    v = a.value
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _strip(die: DIE | None) -> DIE | None:
    """Follow typedefs and cv-qualifiers to the underlying type."""
    seen = 0
    while die is not None and die.tag in _STRIP_TAGS and seen < 64:
        if "DW_AT_type" not in die.attributes:
            return None  # typedef of void
        die = die.get_DIE_from_attribute("DW_AT_type")
        seen += 1
    return die


def _type_name(die: DIE | None, depth: int = 0) -> str:
    if die is None:
        return "void"
    if depth > 16:
        return "?"
    n = _name(die)
    tag = die.tag
    inner = (die.get_DIE_from_attribute("DW_AT_type") if "DW_AT_type" in die.attributes
             else None)
    if tag == "DW_TAG_pointer_type":
        return _type_name(inner, depth + 1) + " *"
    if tag in ("DW_TAG_const_type", "DW_TAG_volatile_type"):
        return f"{tag[7:-5]} {_type_name(inner, depth + 1)}"
    if tag == "DW_TAG_structure_type":
        return f"struct {n or '<anon>'}"
    if tag == "DW_TAG_union_type":
        return f"union {n or '<anon>'}"
    if tag == "DW_TAG_enumeration_type":
        return f"enum {n or '<anon>'}"
    if tag == "DW_TAG_array_type":
        return _type_name(inner, depth + 1) + "[]"
    if tag == "DW_TAG_subroutine_type":
        return "function"
    return n or tag


def _byte_size(die: DIE | None) -> int | None:
    die = _strip(die)
    if die is None:
        return None
    a = die.attributes.get("DW_AT_byte_size")
    if a is not None:
        return int(a.value)
    if die.tag == "DW_TAG_pointer_type":
        return die.cu["address_size"]
    return None


def _uleb(data: Sequence[int], i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


def member_location(die: DIE) -> tuple[int, int | None]:
    """(byte offset, bit offset or None) of a DW_TAG_member.

    DW_AT_data_member_location is a constant (DWARF 3+; gcc's usual form),
    or a location expression ``DW_OP_plus_uconst N`` (DWARF 2 style, also what
    some compilers emit for block forms); union members have none (offset 0).
    Bit-fields carry DW_AT_data_bit_offset (DWARF 4+) or the older
    DW_AT_bit_offset, counted from the most significant bit of the storage unit.
    """
    bit: int | None = None
    a = die.attributes.get("DW_AT_data_member_location")
    if a is None:
        off = 0
    elif isinstance(a.value, int):
        off = a.value
    else:
        expr = list(a.value)
        if expr and expr[0] == 0x23:  # DW_OP_plus_uconst
            off, _ = _uleb(expr, 1)
        elif expr and 0x30 <= expr[0] <= 0x4F and len(expr) == 1:  # DW_OP_lit0..31
            off = expr[0] - 0x30
        elif expr and expr[0] == 0x10:  # DW_OP_constu
            off, _ = _uleb(expr, 1)
        else:
            raise ProbeError(f"unsupported DW_AT_data_member_location expression {expr} "
                             f"for member {_name(die)}")
    dbo = die.attributes.get("DW_AT_data_bit_offset")
    if dbo is not None:
        bit = int(dbo.value)
        off = bit // 8
        bit = bit % 8
    elif "DW_AT_bit_offset" in die.attributes and "DW_AT_bit_size" in die.attributes:
        size = _byte_size(die.get_DIE_from_attribute("DW_AT_type")) or 4
        msb = int(die.attributes["DW_AT_bit_offset"].value)
        bits = int(die.attributes["DW_AT_bit_size"].value)
        lsb_from_start = size * 8 - msb - bits  # little-endian storage
        bit = lsb_from_start
    return off, bit


def _collect_members(struct: DIE, base: int = 0, prefix: str = "",
                     out: dict[str, Member] | None = None, depth: int = 0) -> dict[str, Member]:
    """All members, with anonymous struct/union members flattened into the parent
    (C11 lets ``s.x`` name a member of an anonymous member) and named nested
    structs reachable as ``outer.inner`` (e.g. HashState ``ps.instrument``)."""
    out = {} if out is None else out
    if depth > 8:
        return out
    for m in struct.iter_children():
        if m.tag != "DW_TAG_member":
            continue
        off, bit = member_location(m)
        tdie = m.get_DIE_from_attribute("DW_AT_type") if "DW_AT_type" in m.attributes else None
        n = _name(m)
        under = _strip(tdie)
        if n is None:
            if under is not None and under.tag in ("DW_TAG_structure_type", "DW_TAG_union_type"):
                _collect_members(under, base + off, prefix, out, depth + 1)
            continue
        full = prefix + n
        bs = m.attributes.get("DW_AT_bit_size")
        out[full] = Member(name=full, offset=base + off, size=_byte_size(tdie),
                           type_name=_type_name(tdie), bit_offset=bit,
                           bit_size=int(bs.value) if bs is not None else None)
        # embedded (not pointed-to) structs: PostgreSQL's "inheritance" (ScanState.ps)
        if under is not None and under.tag == "DW_TAG_structure_type" and depth < 4:
            _collect_members(under, base + off, full + ".", out, depth + 1)
    return out


def _struct_from_die(die: DIE) -> dict[str, Any]:
    members = _collect_members(die)
    size = die.attributes.get("DW_AT_byte_size")
    return {
        "size": int(size.value) if size is not None else None,
        "members": {k: [m.offset, m.size, m.type_name, m.bit_offset, m.bit_size]
                    for k, m in members.items()},
    }


def _enum_from_die(die: DIE) -> dict[str, int]:
    return {_name(e) or "": int(e.attributes["DW_AT_const_value"].value)
            for e in die.iter_children() if e.tag == "DW_TAG_enumerator"}


def _is_decl(die: DIE) -> bool:
    return "DW_AT_declaration" in die.attributes


def _iter_cus_hinted(dw: Any, hints: Sequence[str]) -> Iterator[Any]:
    """Hinted CUs first (by file name), then the rest, each CU once."""
    if not hints:
        yield from dw.iter_CUs()
        return
    rest_offsets: list[int] = []
    for cu in dw.iter_CUs():
        top = cu.get_top_DIE()
        cu_name = _name(top) or ""
        if any(cu_name.endswith("/" + h) or cu_name == h for h in hints):
            yield cu
        else:
            rest_offsets.append(cu.cu_offset)
    for off in rest_offsets:
        yield dw.get_CU_at(off)


def _open_elf(stack: contextlib.ExitStack, binary: Path) -> ELFFile:
    try:
        f = stack.enter_context(open(binary, "rb"))  # noqa: SIM115 - the stack closes it
    except OSError as e:
        raise ProbeError(f"cannot read {binary}: {e.strerror}") from None
    try:
        return ELFFile(f)
    except ELFError as e:
        raise ProbeError(f"{binary} is not an ELF binary ({e})") from None


def _no_dwarf(binary: Path) -> ProbeError:
    return ProbeError(
        f"no DWARF debug info in {binary}: use a profkit build (profkit build vanilla), "
        "which is compiled with -g; distribution binaries such as Debian's "
        "/usr/lib/postgresql/*/bin/postgres are stripped and have no debug package")


def _find(binary: Path, structs: Iterable[str], enums: Iterable[str],
          hints: Sequence[str]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Walk the DWARF once for every requested struct/enum; return (identity, found...)."""
    want_s = set(structs)
    want_e = set(enums)
    with contextlib.ExitStack() as stack:
        elf = _open_elf(stack, binary)
        ident = _identity(binary, elf)
        dwarf_elf = elf
        if not elf.has_dwarf_info() or elf.get_section_by_name(".debug_info") is None:
            bid = build_id(elf)
            dbg = DEBUG_ROOT / bid[:2] / f"{bid[2:]}.debug" if bid else None
            if dbg is None or not dbg.exists():
                raise _no_dwarf(binary)
            dwarf_elf = _open_elf(stack, dbg)
            if not dwarf_elf.has_dwarf_info():
                raise _no_dwarf(binary)
        dw = dwarf_elf.get_dwarf_info()
        found_s: dict[str, Any] = {}
        found_e: dict[str, Any] = {}
        for cu in _iter_cus_hinted(dw, hints):
            if not (want_s - found_s.keys()) and not (want_e - found_e.keys()):
                break
            for die in cu.get_top_DIE().iter_children():
                tag = die.tag
                if tag not in ("DW_TAG_structure_type", "DW_TAG_typedef",
                               "DW_TAG_enumeration_type"):
                    continue
                n = _name(die)
                if n is None:
                    continue
                if n in want_s and n not in found_s:
                    s = _strip(die) if tag == "DW_TAG_typedef" else die
                    if (s is not None and s.tag == "DW_TAG_structure_type"
                            and not _is_decl(s)):
                        found_s[n] = _struct_from_die(s)
                if n in want_e and n not in found_e:
                    e = _strip(die) if tag == "DW_TAG_typedef" else die
                    if (e is not None and e.tag == "DW_TAG_enumeration_type"
                            and not _is_decl(e)):
                        found_e[n] = _enum_from_die(e)
        return ident, found_s, found_e


def lookup(binary: str | os.PathLike[str], structs: Iterable[str] = (),
           enums: Iterable[str] = (), hints: Sequence[str] = DEFAULT_HINTS
           ) -> tuple[dict[str, StructLayout], dict[str, dict[str, int]]]:
    """Layouts of *structs* and values of *enums* (by struct/typedef/enum name).

    Results are cached per binary identity; a missing type raises ProbeError.
    """
    binary = Path(binary)
    if not binary.exists():
        raise ProbeError(f"{binary} does not exist")
    structs = list(dict.fromkeys(structs))
    enums = list(dict.fromkeys(enums))
    # Identity needs the ELF headers only: cheap, and it keys the cache.
    with contextlib.ExitStack() as stack:
        ident = _identity(binary, _open_elf(stack, binary))
    cfile = _cache_file(binary, ident)
    data = _load_cache(cfile, binary, ident)
    miss_s = [s for s in structs if s not in data["structs"]]
    miss_e = [e for e in enums if e not in data["enums"]]
    if miss_s or miss_e:
        _, fs, fe = _find(binary, miss_s, miss_e, hints)
        data["structs"].update(fs)
        data["enums"].update(fe)
        _save_cache(cfile, data)
        lost = [s for s in miss_s if s not in fs] + [e for e in miss_e if e not in fe]
        if lost:
            raise ProbeError(f"type(s) {', '.join(lost)} not found in the DWARF of {binary}: "
                             "is this a PostgreSQL backend binary?")
    layouts = {}
    for s in structs:
        d = data["structs"][s]
        layouts[s] = StructLayout(
            name=s, size=d["size"],
            members={k: Member(k, v[0], v[1], v[2], v[3], v[4])
                     for k, v in d["members"].items()})
    return layouts, {e: dict(data["enums"][e]) for e in enums}


def struct_layout(binary: str | os.PathLike[str], struct: str) -> StructLayout:
    return lookup(binary, structs=[struct])[0][struct]


def struct_offsets(binary: str | os.PathLike[str], struct: str,
                   members: Sequence[str]) -> dict[str, int]:
    """Byte offsets of *members* (``"ps.instrument"`` for embedded structs) in *struct*.

    >>> struct_offsets(pg, "PlanState", ["plan", "instrument", "type"])
    {'plan': 8, 'instrument': 40, 'type': 0}
    """
    lay = struct_layout(binary, struct)
    return {m: lay.offset(m) for m in members}


def enum_values(binary: str | os.PathLike[str], enum: str) -> dict[str, int]:
    """Enumerator -> value of the enum named *enum* (e.g. NodeTag: T_SeqScanState -> 370)."""
    return lookup(binary, enums=[enum])[1][enum]


@dataclass(frozen=True)
class ExecutorLayout:
    """What the per-node BPF program needs to know about a backend binary."""

    planstate_type: int
    planstate_plan: int
    planstate_instrument: int
    plan_node_id: int
    plan_type: int
    instrumentation: dict[str, int]
    node_tags: dict[str, int]

    def tag_name(self, value: int) -> str:
        for k, v in self.node_tags.items():
            if v == value:
                return k
        return f"T_<{value}>"

    def c_defines(self) -> str:
        """``#define`` lines for the BPF C text."""
        return "\n".join([
            f"#define OFF_PS_TYPE {self.planstate_type}",
            f"#define OFF_PS_PLAN {self.planstate_plan}",
            f"#define OFF_PS_INSTRUMENT {self.planstate_instrument}",
            f"#define OFF_PLAN_NODE_ID {self.plan_node_id}",
            f"#define OFF_PLAN_TYPE {self.plan_type}",
        ]) + "\n"


INSTRUMENTATION_FIELDS = ("need_timer", "need_bufusage", "running", "starttime", "counter",
                          "firsttuple", "tuplecount", "startup", "total", "ntuples", "nloops")


def executor_layout(binary: str | os.PathLike[str]) -> ExecutorLayout:
    """Offsets of PlanState/Plan/Instrumentation members and the NodeTag values."""
    layouts, enums = lookup(binary, structs=["PlanState", "Plan", "Instrumentation"],
                            enums=["NodeTag"])
    ps, plan, ins = layouts["PlanState"], layouts["Plan"], layouts["Instrumentation"]
    return ExecutorLayout(
        planstate_type=ps.offset("type"), planstate_plan=ps.offset("plan"),
        planstate_instrument=ps.offset("instrument"),
        plan_node_id=plan.offset("plan_node_id"), plan_type=plan.offset("type"),
        instrumentation={k: ins.members[k].offset for k in INSTRUMENTATION_FIELDS
                         if k in ins.members},
        node_tags=enums["NodeTag"],
    )
