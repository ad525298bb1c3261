"""Samples per plan node, read from a ``node_marker`` build's published running node (bcc).

The ``node_marker`` patch (profkit/patches/pg18|pg19/node_marker.patch) keeps, with the
setting ``track_executor_node`` on, the running plan node's EXPLAIN number (depth-first
pre-order, root 0) in a global of every backend and parallel worker::

    PgNodeMarker pg_node_marker = { int32 node_id; uint32 query_seq; int32 leader_pid;
                                    uint32 magic = 0x4e4f4445 };

This collector samples on a software clock (``PERF_COUNT_SW_CPU_CLOCK`` at *frequency*
Hz on every CPU: no PMU needed) with a bcc program that, for a sample of the backend
(its pid) or of one of its parallel workers (a ``postgres`` process whose marker's
``leader_pid`` is the backend), reads the 16-byte marker with ``bpf_probe_read_user`` at
its run-time address and counts the sample under (pid, node_id, query_seq).  node_id -1
is time outside any marked node (parse, plan, executor start/end, sending rows).  Every
process of a cluster is forked from the same postmaster, so the marker has one address
in all of them: the symbol's value plus the binary's load base read from
``/proc/PID/maps`` (postgres is a PIE).  The magic and the leader pid keep another
cluster's postgres processes (other binaries, other addresses) out.

A sample is a CPU-time sample: a process waiting for the CPU or for I/O is not sampled
(EXPLAIN ANALYZE's per-node times are wall times).

bcc is a library: nothing is started; the perf events and the program are detached in a
``finally`` (normal end, exception, Ctrl-C, SIGTERM).
"""
from __future__ import annotations

import contextlib
import os
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profkit.collect import kheaders
from profkit.collect.bpf import sigterm_raises
from profkit.errors import ProbeError
from profkit.processes import run, which

SYMBOL = "pg_node_marker"
MAGIC = 0x4E4F4445
MARKER_SIZE = 16
DEFAULT_FREQUENCY = 1999
OUTSIDE = -1
#: roles of a counted sample
LEADER, WORKER = 0, 1

BPF_TEMPLATE = r"""
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>

struct marker_t { s32 node_id; u32 query_seq; s32 leader_pid; u32 magic; };
struct key_t { u32 pid; s32 node_id; u32 query_seq; u32 role; };

BPF_HASH(counts, struct key_t, u64, 65536);
/* 0: samples of the backend, 1: its samples whose marker could not be read,
   2: samples of the backend whose marker had the wrong magic */
BPF_ARRAY(stats, u64, 4);

static inline void bump(int i) {
    u64 *v = stats.lookup(&i);
    if (v) __sync_fetch_and_add(v, 1);
}

int on_sample(struct bpf_perf_event_data *ctx) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (tgid == 0)
        return 0;
    int leader = tgid == __LEADER__;
    if (!leader) {
        char comm[16] = {};
        bpf_get_current_comm(&comm, sizeof(comm));
        if (comm[0] != 'p' || comm[1] != 'o' || comm[2] != 's' || comm[3] != 't' ||
            comm[4] != 'g' || comm[5] != 'r' || comm[6] != 'e' || comm[7] != 's' ||
            comm[8] != 0)
            return 0;
    } else {
        bump(0);
    }
    struct marker_t m = {};
    if (bpf_probe_read_user(&m, sizeof(m), (void *)__ADDR__ULL) != 0) {
        if (leader) bump(1);
        return 0;
    }
    if (m.magic != __MAGIC__) {
        if (leader) bump(2);
        return 0;
    }
    if (!leader && m.leader_pid != __LEADER__)
        return 0;
    struct key_t k = {};
    k.pid = tgid;
    k.node_id = m.node_id;
    k.query_seq = m.query_seq;
    k.role = leader ? 0 : 1;
    counts.increment(k);
    return 0;
}
"""


@dataclass(frozen=True)
class MarkerLocation:
    """Where the marker of a process lives."""

    binary: Path
    symbol_value: int   # st_value of pg_node_marker in the binary
    load_base: int      # the process's load bias (0 for a non-PIE binary)

    @property
    def address(self) -> int:
        return self.load_base + self.symbol_value


@dataclass(frozen=True)
class Marker:
    """The four fields of one process's marker, read once."""

    node_id: int
    query_seq: int
    leader_pid: int
    magic: int


@dataclass
class NodeSamples:
    """What one recording counted: samples per (process, node, query), and totals."""

    pid: int                       # the backend (parallel leader)
    binary: Path
    address: int
    frequency: int
    #: (pid, node_id, query_seq, role) -> samples
    raw: dict[tuple[int, int, int, int], int]
    backend_samples: int           # every sample of the backend (counted or not)
    read_errors: int               # backend samples whose marker could not be read
    bad_magic: int
    seconds: float
    #: the backend's query_seq before the recording: markers of executions started
    #: before it are not counted as node time (they are left in ``raw``)
    seq_before: int
    worker_pids: tuple[int, ...] = field(default_factory=tuple)

    def _in_window(self, node: int, seq: int, role: int) -> bool:
        # a worker's query_seq is its own (1 for its one query); the leader's must be new
        return node == OUTSIDE or role == WORKER or seq > self.seq_before

    @property
    def node_samples(self) -> dict[int, int]:
        """node_id -> samples (leader and workers), node ids >= 0 only."""
        out: dict[int, int] = {}
        for (_p, node, seq, role), n in self.raw.items():
            if node != OUTSIDE and self._in_window(node, seq, role):
                out[node] = out.get(node, 0) + n
        return dict(sorted(out.items()))

    @property
    def worker_node_samples(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for (_p, node, _s, role), n in self.raw.items():
            if role == WORKER and node != OUTSIDE:
                out[node] = out.get(node, 0) + n
        return dict(sorted(out.items()))

    @property
    def outside(self) -> int:
        """Samples of the backend outside any marked node (node_id -1)."""
        return sum(n for (_p, node, _s, role), n in self.raw.items()
                   if node == OUTSIDE and role == LEADER)

    @property
    def stale(self) -> int:
        """Backend samples in a node of an execution started before the recording."""
        return sum(n for (_p, node, seq, role), n in self.raw.items()
                   if not self._in_window(node, seq, role))

    @property
    def total(self) -> int:
        return sum(self.node_samples.values()) + self.outside

    def shares(self) -> dict[int, float]:
        """node_id -> share of the node samples (exclusive: samples land on the
        innermost running node), summing to 1 over the plan's nodes."""
        ns = self.node_samples
        tot = sum(ns.values())
        return {k: v / tot for k, v in ns.items()} if tot else {}


# ---------------------------------------------------------------------------
# where the marker is


def marker_symbol(binary: str | os.PathLike[str]) -> int:
    """The value of ``pg_node_marker`` in *binary* (ProbeError if the build has none)."""
    cp = run([which("nm"), "--defined-only", str(binary)], timeout=120, what="nm",
             check=False)
    for line in cp.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == SYMBOL and parts[1] in "dDbB":
            return int(parts[0], 16)
    raise ProbeError(f"{binary} has no {SYMBOL} symbol: it is not a node_marker build. "
                     "Build it with `profkit build node_marker` (or pg19/node_marker) and run "
                     "the query there")


def _elf_pie_min_vaddr(binary: Path) -> tuple[bool, int]:
    """(is the binary position-independent, lowest PT_LOAD p_vaddr)."""
    from elftools.elf.elffile import ELFFile

    with open(binary, "rb") as f:
        elf = ELFFile(f)
        pie = elf["e_type"] == "ET_DYN"
        loads = [s["p_vaddr"] - s["p_offset"] for s in elf.iter_segments()
                 if s["p_type"] == "PT_LOAD"]
    return pie, min(loads) if loads else 0


def load_base(pid: int, binary: Path) -> int:
    """The load bias of *binary* in process *pid* (from /proc/PID/maps)."""
    pie, min_vaddr = _elf_pie_min_vaddr(binary)
    if not pie:
        return 0
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError as e:
        raise ProbeError(f"cannot read /proc/{pid}/maps ({e.strerror}): is the backend "
                         "alive, and are you root?") from None
    real = os.path.realpath(binary)
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and os.path.realpath(parts[5].strip()) == real \
                and int(parts[2], 16) == 0:
            return int(parts[0].split("-")[0], 16) - min_vaddr
    raise ProbeError(f"process {pid} has no mapping of {binary}: it does not run that binary")


def locate(pid: int, binary: str | os.PathLike[str] | None = None) -> MarkerLocation:
    """The marker's address in process *pid* (its own executable unless *binary*)."""
    if binary is None:
        try:
            binary = os.readlink(f"/proc/{pid}/exe")
        except OSError as e:
            raise ProbeError(f"cannot read /proc/{pid}/exe ({e.strerror}): the backend has "
                             "exited, or run as root") from None
    b = Path(str(binary).replace(" (deleted)", ""))
    return MarkerLocation(b, marker_symbol(b), load_base(pid, b))


def read_marker(pid: int, location: MarkerLocation | None = None) -> Marker:
    """Read process *pid*'s marker now, through /proc/PID/mem (root)."""
    loc = location or locate(pid)
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as f:
            f.seek(loc.address)
            data = f.read(MARKER_SIZE)
    except OSError as e:
        raise ProbeError(f"cannot read process {pid}'s memory ({e.strerror}): run as root"
                         ) from None
    node_id, seq, leader, magic = struct.unpack("<iIiI", data)
    if magic != MAGIC:
        raise ProbeError(f"process {pid}: no node marker at {loc.address:#x} (magic "
                         f"{magic:#x}): a binary without the node_marker patch?")
    return Marker(node_id, seq, leader, magic)


# ---------------------------------------------------------------------------
# recording


def bpf_text(pid: int, address: int) -> str:
    return (BPF_TEMPLATE.replace("__LEADER__", str(int(pid)))
            .replace("__ADDR__", str(int(address))).replace("__MAGIC__", str(MAGIC)))


@contextlib.contextmanager
def _bcc_program(text: str) -> Iterator[Any]:
    bcc = kheaders.import_bcc()
    env = kheaders.ensure_bcc_env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        try:
            b = bcc.BPF(text=text.encode(), cflags=["-Wno-ignored-attributes",
                                                   "-Wno-unused-function",
                                                   "-Wno-duplicate-decl-specifier"])
        except Exception as e:  # noqa: BLE001 - bcc reports compile errors as Exception
            raise kheaders.BccUnavailable(f"bcc could not compile the sampler: {e}") from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        yield b
    finally:
        b.cleanup()  # detaches the perf events and unloads the program


def record_node_samples(pid: int, runner: Callable[[], Any], *,
                        frequency: int = DEFAULT_FREQUENCY,
                        binary: str | os.PathLike[str] | None = None,
                        out_dir: str | os.PathLike[str] | None = None) -> NodeSamples:
    """Sample backend *pid* (and its parallel workers) at *frequency* Hz while
    ``runner()`` runs, and count the samples per plan node.

    The backend must run a node_marker build with ``track_executor_node`` on for the
    queries *runner* sends (``SET track_executor_node = on`` on its connection). Raises
    :class:`ProbeError` when the binary has no marker, and re-raises the runner's
    exception after detaching.
    """
    if not 1 <= int(frequency) <= 20000:
        raise ProbeError(f"frequency {frequency} Hz: choose 1 ... 20000")
    loc = locate(pid, binary)
    before = read_marker(pid, loc)
    text = bpf_text(pid, loc.address)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "node_marker.bpf.c").write_text(text)
    bcc = kheaders.import_bcc()
    with _bcc_program(text) as b, sigterm_raises():
        b.attach_perf_event(ev_type=bcc.PerfType.SOFTWARE,
                            ev_config=bcc.PerfSWConfig.CPU_CLOCK,
                            fn_name=b"on_sample", sample_freq=int(frequency), cpu=-1)
        t0 = time.monotonic()
        runner()
        secs = time.monotonic() - t0
        raw: dict[tuple[int, int, int, int], int] = {}
        for k, v in b[b"counts"].items():
            key = (int(k.pid), int(k.node_id), int(k.query_seq), int(k.role))
            raw[key] = raw.get(key, 0) + int(v.value)
        st = b[b"stats"]
        stats = [int(st[st.Key(i)].value) for i in range(3)]
    workers = tuple(sorted({p for (p, _n, _s, role) in raw if role == WORKER}))
    return NodeSamples(pid=pid, binary=loc.binary, address=loc.address,
                       frequency=int(frequency), raw=raw, backend_samples=stats[0],
                       read_errors=stats[1], bad_magic=stats[2], seconds=secs,
                       seq_before=before.query_seq, worker_pids=workers)


def samples_frame(ns: NodeSamples) -> Any:
    """The raw counts as a DataFrame: pid, role, node_id, query_seq, samples."""
    import pandas as pd

    rows = [{"pid": p, "role": "leader" if r == LEADER else "worker", "node_id": n,
             "query_seq": s, "samples": c} for (p, n, s, r), c in sorted(ns.raw.items())]
    return pd.DataFrame(rows, columns=["pid", "role", "node_id", "query_seq", "samples"])


def merge(a: Mapping[int, int], b: Mapping[int, int]) -> dict[int, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out
