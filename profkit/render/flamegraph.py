"""Folded stacks → a self-contained, interactive flamegraph SVG (written here, no vendored JS).

The idea is Brendan Gregg's flame graph (FlameGraph's flamegraph.pl): one box per
distinct stack prefix, the root at the bottom, a box's width proportional to the
samples of the stacks that pass through it, children sorted by name. What the SVG does:

- **zoom**: click a frame and it fills the width; its ancestors stay (faded, full width),
  frames outside it hide; "Reset Zoom" (or a click on ``all``) restores;
- **search**: the "Search" control (or ``/`` / Ctrl-F while the pointer is over the
  graph) prompts for a regular expression; matching frames turn magenta and the matched
  share of all samples (overlaps counted once) is shown at the bottom right;
- **tooltips**: each frame has an SVG ``<title>`` (name, samples, %) and hovering writes
  the same text into the details line at the bottom left;
- **provenance**: a title and a subtitle built from the caller's dict (build, PostgreSQL
  version, query, tool, samples, date, ...); the full dict is also embedded as JSON in
  ``<metadata>``;
- **colours**: a hash of the function name (MD5, so stable across runs and machines)
  picks a colour in a warm palette; the instrumentation family
  (:data:`profkit.parse.folded.INSTRUMENTATION_FUNCTIONS`) is always teal;
- **differential from repeated recordings** (``significance=FlameDiff``, *stacks* B's
  mean profile per execution): a frame is red (dearer in B) or blue (cheaper) only where
  the bootstrap interval of its change excludes 0, intensity by the size of the change,
  grey otherwise; the tooltip gives the change with its interval
  (:mod:`profkit.analyze.flamediff`);
- **share-based differential** (``diff_against=A``, labelled so in the legend): widths
  from B (the "after" profile), colours from the difference of each frame's samples with
  A normalised to B's total — red: more samples in B, blue: fewer, intensity
  proportional to the change, as in FlameGraph's difffolded.pl + flamegraph.pl. By
  default the difference is of *self* samples (FlameGraph's choice;
  ``diff_basis="total"`` colours whole subtrees). Frames present only in A cannot be
  drawn with B's widths; their samples are counted in the subtitle. Instrumentation
  frames keep a teal outline.

Several graphs in one HTML page do not interfere: every id, CSS class and the JS API
object carry a per-graph prefix (a content hash plus a per-process counter). The JS API
of a graph is ``window["fg_<prefix>"]`` with ``zoom(name_or_index)``, ``reset()``,
``search(regex) -> matched %``, ``clearSearch()``. :func:`to_iframe_html` wraps an SVG in
an ``<iframe srcdoc>`` for notebooks; :class:`FlameGraph` has ``_repr_html_`` (that
iframe) and a text ``__repr__``.
"""
from __future__ import annotations

import hashlib
import html
import itertools
import json
import math
import os
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from profkit.errors import ProfkitError
from profkit.parse.folded import as_counts, is_instrumentation

INSTRUMENTATION_COLOR = "rgb(0,168,160)"
SEARCH_COLOR = "rgb(230,0,230)"
MERGED_COLOR = "rgb(200,200,200)"
ROOT_NAME = "all"
_FONT_WIDTH = 0.59          # average glyph width / font size for Verdana-like fonts
_counter = itertools.count()

StacksLike = Mapping[str, float] | str | os.PathLike[str] | Any   # or a stacks DataFrame


class RenderError(ProfkitError):
    pass


# --------------------------------------------------------------------------- model

def _counts_of(stacks: StacksLike) -> dict[str, float]:
    counts = getattr(stacks, "counts", None)  # PerfFolding and similar
    if type(stacks) is dict and all(type(k) is str and type(v) is float
                                    for k, v in stacks.items()):
        out = stacks          # read_folded's own result: no copy (a million stacks)
    elif isinstance(counts, Mapping):
        out = {str(k): float(v) for k, v in counts.items()}
    else:
        try:
            out = as_counts(stacks)
        except (TypeError, ValueError) as e:
            raise RenderError(f"cannot render {type(stacks).__name__}: expected folded stacks "
                              "(a {stack: count} mapping, a stacks DataFrame or a folded file)"
                              ) from e
    for k, v in out.items():
        if not math.isfinite(v):
            raise RenderError(f"stack {k[:80]!r} has a count of {v}: counts must be finite")
    return out


@dataclass(frozen=True)
class Frame:
    """One drawn box: offsets in samples (``x``, ``w``), ``depth`` 0 = the root.

    No path is stored (memory stays linear in the number of frames, not quadratic in
    the depth): :func:`frame_path` finds it from the boxes that contain the frame.
    ``merged``: how many frames narrower than the minimum width this box stands for (0:
    a real frame)."""

    name: str
    depth: int
    x: float
    w: float
    self: float
    a_norm: float | None = None     # differential: A's value, normalised to B's total
    delta: float | None = None      # differential: B − A_norm on the chosen basis
    merged: int = 0
    key: str | None = None          # the stack path (only when layout(keys=True))


def _sort_key(stack: str) -> str:
    # the separator sorts below every character: the order of the frame tuples, i.e. a
    # depth-first walk of the stack tree with children by name
    return stack.replace(";", "\x00")


def _trie(counts: Mapping[str, float]) -> list:
    """A's stack tree for differentials: node = [total, self, children, seen]."""
    root: list = [0.0, 0.0, {}, True]
    for stack, w in counts.items():
        if w <= 0:
            continue
        root[0] += w
        node = root
        for name in stack.split(";"):
            ch = node[2].get(name)
            if ch is None:
                ch = node[2][name] = [0.0, 0.0, {}, False]
            ch[0] += w
            node = ch
        node[1] += w
    return root


def layout(counts: Mapping[str, float], *, min_fraction: float = 0.0,
           diff_against: Mapping[str, float] | None = None,
           diff_basis: Literal["self", "total"] = "self", keys: bool = False
           ) -> list[Frame]:
    """Frames of the merged stack tree: the root first, then by depth and offset;
    children side by side in name order. Consecutive sibling frames narrower than
    *min_fraction* of the total are merged into one box (``merged`` = how many), drawn
    if the merged box itself is wide enough; their descendants are not visited.

    The stacks are sorted once in tree order (a separator below every character), so
    every subtree is a contiguous range of them and its width a difference of prefix
    sums: the walk visits only the frames it draws and their direct children (a
    binary search skips each child's range), not every frame of every stack. Memory is
    the sorted stacks plus what is drawn, never a path per frame (which grows with the
    square of the depth). With *diff_against*, each frame also gets A's value on
    *diff_basis* normalised to this profile's total (``a_norm``) and the difference
    (``delta``). *keys*: every frame also carries its stack path (``key``; memory then
    grows with the depth)."""
    sk = sorted(_sort_key(k) for k, v in counts.items() if v > 0)
    if not sk:
        return []
    weights = [counts[k.replace("\x00", ";")] for k in sk]
    cum = [0.0, *itertools.accumulate(weights)]
    total = cum[-1]
    if total <= 0:
        return []
    limit = min_fraction * total
    a_root = _trie(diff_against) if diff_against is not None else None
    scale = (total / a_root[0]) if a_root is not None and a_root[0] > 0 else 0.0
    self_basis = diff_basis == "self"
    out: list[Frame] = []
    append = out.append
    n_keys = len(sk)
    # work: (range start, range end, prefix length in the sort key, depth, A node)
    todo: list[tuple[int, int, int, int, list | None]] = [(0, n_keys, -1, 0, a_root)]
    while todo:
        i, j, plen, depth, anode = todo.pop()
        pos = i
        if plen >= 0 and len(sk[pos]) == plen:   # the stack that ends at this frame
            pos += 1
        start = plen + 1                          # where a child's name begins
        run_n, run_x, run_w = 0, 0.0, 0.0
        while pos < j:
            key = sk[pos]
            stop = key.find("\x00", start)
            if stop < 0:
                stop = len(key)
            name = key[start:stop]
            last = sk[j - 1]
            if last.startswith(name, start) and (len(last) == stop or last[stop] == "\x00"):
                end = j                           # the last child (or the only one)
            else:
                end = bisect_left(sk, key[:stop] + "\x01", pos + 1, j)
            x, width = cum[pos], cum[end] - cum[pos]
            if width < limit:                     # narrow: joins its siblings' run
                if not run_n:
                    run_x = x
                run_n += 1
                run_w += width
                pos = end
                continue
            if run_n:
                _merged_box(append, depth + 1, run_n, run_x, run_w, limit)
                run_n, run_w = 0, 0.0
            slf = weights[pos] if len(key) == stop else 0.0
            child = None
            if anode is not None:
                child = anode[2].get(name)
                if child is not None:
                    child[3] = True
            path = key[:stop].replace("\x00", ";") if keys else None
            if a_root is not None:
                at, aself = (child[0], child[1]) if child is not None else (0.0, 0.0)
                a_norm = (aself if self_basis else at) * scale
                append(Frame(name, depth + 1, x, width, slf, a_norm,
                             (slf if self_basis else width) - a_norm, key=path))
            else:
                append(Frame(name, depth + 1, x, width, slf, key=path))
            todo.append((pos, end, stop, depth + 1, child))
            pos = end
        if run_n:
            _merged_box(append, depth + 1, run_n, run_x, run_w, limit)
    if a_root is not None:
        root = Frame(ROOT_NAME, 0, 0.0, total, 0.0, a_root[0] * scale, 0.0)
    else:
        root = Frame(ROOT_NAME, 0, 0.0, total, 0.0)
    out.sort(key=lambda f: (f.depth, f.x))
    return [root, *out]


def _merged_box(append: Callable[[Frame], None], depth: int, n: int, x: float, w: float,
                limit: float) -> None:
    if w >= limit and w > 0:
        append(Frame(f"[{n} narrow frame{'s' if n > 1 else ''}]", depth, x, w, 0.0, None,
                     None, merged=n))


def only_in_a(diff_against: Mapping[str, float], counts: Mapping[str, float]) -> float:
    """Samples of A (normalised to B's total) on stack paths B does not have at all."""
    a_root = _trie(diff_against)
    b_total = sum(v for v in counts.values() if v > 0)
    if a_root[0] <= 0:
        return 0.0
    b_root = _trie(counts)
    lost = 0.0
    todo = [(a_root, b_root)]
    while todo:
        a, b = todo.pop()
        for name, ac in a[2].items():
            bc = b[2].get(name) if b is not None else None
            if bc is None:
                lost += ac[0]
            else:
                todo.append((ac, bc))
    return lost * b_total / a_root[0]


def frame_path(frames: list[Frame], i: int) -> tuple[str, ...]:
    """The stack path of ``frames[i]`` (root excluded), from the frames containing it."""
    f = frames[i]
    path = [f.name]
    eps = 1e-9 * max(frames[0].w, 1.0) if frames else 0.0
    depth, x = f.depth, f.x
    for g in sorted((g for g in frames if 0 < g.depth < depth and g.x <= x + eps
                     and x < g.x + g.w - eps / 2), key=lambda g: -g.depth):
        if g.depth == depth - 1:
            path.append(g.name)
            depth = g.depth
    return tuple(reversed(path))


def merge_profiles(profiles: Sequence[StacksLike], *, names: Sequence[str] | None = None,
                   normalise: bool = True, by_run: bool = False) -> dict[str, float]:
    """Many runs in one graph: each run scaled to the mean total (``normalise``; so every
    run weighs the same whatever its length or sampling rate), then summed. ``by_run``:
    each run under its own root frame (its name), side by side."""
    runs = [_counts_of(p) for p in profiles]
    if not runs:
        raise RenderError("merge needs at least one profile")
    if names is not None and len(names) != len(runs):
        raise RenderError(f"{len(names)} names for {len(runs)} profiles")
    totals = [math.fsum(v for v in r.values() if v > 0) for r in runs]
    live = [t for t in totals if t > 0]
    mean = math.fsum(live) / len(live) if live else 0.0
    out: dict[str, float] = {}
    for i, (r, t) in enumerate(zip(runs, totals, strict=True)):
        if t <= 0:
            continue
        k = mean / t if normalise else 1.0
        prefix = (names[i] if names else f"run{i + 1}").replace(";", ":") + ";" if by_run else ""
        for stack, v in r.items():
            if v > 0:
                key = prefix + stack
                out[key] = out.get(key, 0.0) + v * k
    return out


# --------------------------------------------------------------------------- colours

def frame_color(name: str) -> str:
    """The fill of a frame: teal for instrumentation, else a warm colour from the name's
    MD5 (deterministic across processes, unlike ``hash()``)."""
    if is_instrumentation(name):
        return INSTRUMENTATION_COLOR
    h = hashlib.md5(name.encode("utf-8", "surrogatepass")).digest()
    v1, v2, v3 = h[0] / 255.0, h[1] / 255.0, h[2] / 255.0
    # FlameGraph's "hot" family: red high, green spread, little blue
    r = 205 + int(50 * v3)
    g = int(230 * v1)
    b = int(55 * v2)
    return f"rgb({r},{g},{b})"


def diff_color(delta: float, max_abs: float) -> str:
    """Red for more samples in B, blue for fewer; white-ish for no change."""
    if max_abs <= 0 or abs(delta) < 1e-12:
        return "rgb(245,245,245)"
    k = min(1.0, abs(delta) / max_abs)
    fade = round(235 * (1.0 - k))
    return f"rgb(255,{fade},{fade})" if delta > 0 else f"rgb({fade},{fade},255)"


_CONTROL = {c: "\ufffd" for c in range(32) if c not in (9, 10, 13)}


def _disp(name: str) -> str:
    """A frame name as SVG text: undecodable bytes and control characters (not allowed in
    XML) become U+FFFD; the graph's structure keeps the names apart anyway."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        name = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return name.translate(_CONTROL) if any(ord(c) < 32 for c in name) else name


def _wrap(text: str, n: int) -> list[str]:
    """*text* in lines of at most *n* characters, broken at spaces (a longer word
    stays whole)."""
    lines: list[str] = []
    cur = ""
    for word in text.split(" "):
        if cur and len(cur) + 1 + len(word) > max(n, 20):
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    if cur:
        lines.append(cur)
    return lines


def _label(name: str, width_px: float, font_size: float) -> str:
    n = int(width_px / (font_size * _FONT_WIDTH))
    if n < 3:
        return ""
    if len(name) <= n:
        return name
    return name[: n - 2] + ".."


# --------------------------------------------------------------------------- SVG

def _fmt(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".") if v != int(v) else str(int(v))


def _num(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,.1f}"


def _prefix(payload: str, id_prefix: str | None) -> str:
    if id_prefix:
        if not id_prefix.replace("_", "").isalnum() or not id_prefix[0].isalpha():
            raise RenderError(f"id_prefix {id_prefix!r} must be letters, digits and _ "
                              "and start with a letter")
        return id_prefix
    h = hashlib.sha1(f"{payload}\0{os.getpid()}\0{next(_counter)}".encode()).hexdigest()
    return "fg" + h[:10]


NOT_SIGNIFICANT_COLOR = "rgb(221,221,221)"


def significance_color(change: float, flag: int, max_abs: float) -> str:
    """A frame of a repeated-recordings differential: grey unless flagged; red (dearer
    in B) or blue (cheaper), from pale to full by |change| / *max_abs* — never as pale as
    the grey, so a flagged frame always shows."""
    if flag == 0:
        return NOT_SIGNIFICANT_COLOR
    k = min(1.0, abs(change) / max_abs) if max_abs > 0 else 1.0
    fade = round(200 * (1.0 - k))
    return f"rgb(255,{fade},{fade})" if flag > 0 else f"rgb({fade},{fade},255)"


def _signed(v: float) -> str:
    a = abs(v)
    if not math.isfinite(v):
        return "new" if v > 0 else "?"
    return f"{v:+.1f}" if a >= 10 else f"{v:+.2f}" if a >= 0.1 else f"{v:+.3f}"


def _plain(v: float) -> str:
    a = abs(v)
    return f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 0.1 else f"{v:.3f}"


def _pct_text(row: Mapping[str, Any]) -> str:
    pct = row["change_pct"]
    if not math.isfinite(pct):
        return "new in B"
    lo, hi = row["pct_low"], row["pct_high"]
    his = "+inf" if math.isinf(hi) else f"{hi:+.0f}"
    return f"{pct:+.1f} % [{lo:+.0f}, {his}]"


class _SigView:
    """What render() needs of a FlameDiff: each drawn frame's rows, colour and tooltip."""

    def __init__(self, diff: Any, basis: str) -> None:
        self.diff = diff
        self.basis = basis
        self.rows = {b: diff.lookup("path", b) for b in ("self", "total")}
        self.unit = "ms/exec" if diff.unit == "ms per execution" else "samples/rec"
        total = self.rows["total"]
        # paths only A has, at their top-most missing frame (drawn or not: see legend)
        self.only_a_tops = [
            path for path, r in total.items()
            if r["b_present"] == 0 and r["a_mean"] > 0 and (
                not path.rpartition(";")[0]
                or total.get(path.rpartition(";")[0], {}).get("b_present", 0) > 0)]
        self.drawn: set[str] = set()

    def max_abs(self, keys: Sequence[str | None]) -> float:
        rows = self.rows[self.basis]
        return max((abs(float(rows[k]["change"])) for k in keys
                    if k in rows and rows[k]["flag"] != 0), default=0.0)

    def legend(self) -> str:
        d = self.diff
        total = self.rows["total"]
        drawn = [p for p in self.only_a_tops if p in self.drawn]
        missing = [p for p in self.only_a_tops if p not in self.drawn]
        text = (f"repeated recordings, {d.n_a} A + {d.n_b} B, {d.unit}: red = dearer in B, "
                f"blue = cheaper, coloured only where the {d.confidence:.0%} bootstrap "
                f"interval of the {self.basis} change excludes 0, grey otherwise "
                f"({d.n_boot} resamples, seed {d.seed}); widths: B's mean")
        if drawn:
            ms = sum(float(total[p]["a_mean"]) for p in drawn)
            text += (f", and A's for the frames only A has ({_plain(ms)} {self.unit}, "
                     f"{sum(int(total[p]['flag'] != 0) for p in drawn)} of them flagged)")
        if missing:
            ms = sum(float(total[p]["a_mean"]) for p in missing)
            text += (f"; {_plain(ms)} {self.unit} only in A, not drawn"
                     f" ({sum(int(total[p]['flag'] != 0) for p in missing)} of those frames "
                     "flagged)")
        return text

    def meta(self) -> dict[str, Any]:
        d = self.diff
        return {"recordings_a": d.n_a, "recordings_b": d.n_b, "n_boot": d.n_boot,
                "seed": d.seed, "confidence": d.confidence, "unit": d.unit,
                "method": d.method, "basis": self.basis}

    def _part(self, basis: str, key: str | None) -> str:
        r = self.rows[basis].get(key or "")
        if r is None:
            return f"{basis}: none"
        word = ("dearer" if r["flag"] > 0 else "cheaper" if r["flag"] < 0
                else "no clear change: the interval includes 0")
        return (f"{basis} {_plain(r['a_mean'])} → {_plain(r['b_mean'])} {self.unit}, "
                f"change {_signed(r['change'])} [{_signed(r['low'])}, {_signed(r['high'])}]"
                f" {self.unit} = {_pct_text(r)}: {word}")

    def frame(self, f: Frame, name: str, pct: float, max_abs: float
              ) -> tuple[str, str, str]:
        """(fill, tooltip, extra data- attributes) of a drawn frame."""
        if f.depth == 0:
            r = None
            fill = "rgb(245,245,245)"
        else:
            r = self.rows[self.basis].get(f.key or "")
            fill = (significance_color(float(r["change"]), int(r["flag"]), max_abs)
                    if r is not None else NOT_SIGNIFICANT_COLOR)
        tot = self.rows["total"].get(f.key or "")
        where = "only in A" if tot is not None and tot["b_present"] == 0 else "in B"
        head = f"{name} ({_plain(f.w)} {self.unit} {where}, {pct:.2f}%)"
        if f.depth == 0:
            return fill, head, ""
        tip = f"{head}; {self._part('self', f.key)}; {self._part('total', f.key)}"
        attrs = ""
        if r is not None:
            attrs = (f' data-flag="{int(r["flag"])}" data-change="{float(r["change"]):.6g}" '
                     f'data-low="{float(r["low"]):.6g}" data-high="{float(r["high"]):.6g}"')
        return fill, tip, attrs


def check_size(name: str, v: Any, *, minimum: float, allow_zero: bool = False) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise RenderError(f"{name} must be a number, got {v!r}") from None
    if not math.isfinite(f) or f < minimum or (f == 0 and not allow_zero):
        lo = f"at least {minimum:g}" if minimum > 0 else "zero or more"
        raise RenderError(f"{name} must be a finite number of pixels, {lo}; got {v!r}")
    return f


def render(
    stacks: StacksLike,
    *,
    title: str = "Flame Graph",
    provenance: Mapping[str, Any] | None = None,
    subtitle: str | None = None,
    diff_against: StacksLike | None = None,
    diff_basis: Literal["self", "total"] = "self",
    width: float = 1200,
    frame_height: float = 16,
    font_size: float = 12.0,
    min_width_px: float = 0.1,
    count_name: str = "samples",
    id_prefix: str | None = None,
    inverted: bool = False,
    significance: Any = None,
) -> str:
    """Render folded stacks (mapping, ``stacks`` DataFrame, folded path or a PerfFolding)
    as an SVG string. See the module docstring for what the graph does.

    ``diff_against``: the "before" profile; the result is differential (widths from
    *stacks*, colours from the normalised difference). ``provenance``: facts printed in
    the subtitle (unless ``subtitle`` is given) and embedded as JSON. ``min_width_px``:
    sibling frames narrower than this are merged into one box (flamegraph.pl's
    ``--minwidth``), which keeps a profile of a million stacks light in a browser.
    ``inverted``: an icicle graph (the root at the top, callees below).

    ``significance``: a :class:`profkit.analyze.flamediff.FlameDiff` of repeated
    recordings; *stacks* is then B's mean profile, with A's for the stacks only A has
    (:func:`~profkit.analyze.flamediff.union_profile`, ms per execution), and each
    frame is coloured only where the interval of its change on *diff_basis* (by stack
    path) excludes 0: red dearer in B, blue cheaper, intensity by the size of the
    change; grey otherwise. Its tooltip gives the change with its interval, in the unit
    and in %, self and total. Not together with ``diff_against`` (the share-based differential).
    """
    width = check_size("width", width, minimum=100)
    frame_height = check_size("frame height", frame_height, minimum=1)
    font_size = check_size("font size", font_size, minimum=1)
    min_width_px = check_size("minimum frame width", min_width_px, minimum=0,
                               allow_zero=True)
    if diff_basis not in ("self", "total"):
        raise RenderError(f"diff_basis must be 'self' or 'total', not {diff_basis!r}")
    counts = _counts_of(stacks)
    a_counts = _counts_of(diff_against) if diff_against is not None else None
    if significance is not None and a_counts is not None:
        raise RenderError("give diff_against (a share-based differential) or significance "
                          "(repeated recordings), not both")
    sig = _SigView(significance, diff_basis) if significance is not None else None
    provenance = dict(provenance or {})
    title = _disp(title)
    subtitle = _disp(subtitle) if subtitle is not None else None
    pad = 10.0
    plot_w = width - 2 * pad
    min_fraction = min_width_px / plot_w
    frames = layout(counts, min_fraction=min_fraction, diff_against=a_counts,
                    diff_basis=diff_basis, keys=sig is not None)
    total = frames[0].w if frames else 0.0
    merged = sum(f.merged for f in frames)

    lost_a = 0.0
    max_abs = 0.0
    if a_counts is not None and frames:
        lost_a = only_in_a(a_counts, counts)
        max_abs = max((abs(f.delta or 0.0) for f in frames if f.depth > 0 and not f.merged),
                      default=0.0)

    h = hashlib.sha1()
    for part in (title, json.dumps(provenance, default=str, sort_keys=True), subtitle or "",
                 f"{width}:{total!r}:{len(counts)}:{len(frames)}:{inverted}:{sig is not None}"):
        h.update(part.encode("utf-8", "surrogatepass"))
    p = _prefix(h.hexdigest(), id_prefix)
    if subtitle is None:
        subtitle = " · ".join(f"{k}: {v}" for k, v in provenance.items())
    legend = ""
    if a_counts is not None:
        legend = (f"share-based differential ({diff_basis} {count_name}, each profile as a "
                  "share of its own total; no interval: a colour may be noise): red = more "
                  "than before, blue = fewer; before normalised to this total")
        if lost_a > 0:
            legend += f"; {_num(round(lost_a, 1))} only before, not drawn"
    if sig is not None:
        sig.drawn = {f.key for f in frames if f.key}
        max_abs = sig.max_abs([f.key for f in frames if f.depth > 0 and not f.merged])
        legend = sig.legend()
    if merged:
        legend += ("; " if legend else "") + (
            f"{merged:,} frames narrower than {min_width_px:g} px merged into grey boxes")

    max_depth = max((f.depth for f in frames), default=0)
    legend_y = 3 * font_size + 24     # below title and subtitle
    legend_lines = _wrap(legend, int(plot_w / (font_size * _FONT_WIDTH))) if legend else []
    ctl_y = legend_y + (font_size + 4) * len(legend_lines) + (4 if legend_lines else 0)
    top = ctl_y + 10                  # frames start below the controls
    bottom = 2 * font_size + 10       # details line
    height = int(top + (max_depth + 1) * frame_height + bottom)
    if not frames:
        height = int(top + 3 * frame_height + bottom)

    e = html.escape
    out: list[str] = []
    w = out.append
    w('<?xml version="1.0" standalone="no"?>\n')
    w(f'<svg version="1.1" id="{p}-svg" width="{_fmt(width)}" height="{height}" '
      f'viewBox="0 0 {_fmt(width)} {height}" xmlns="http://www.w3.org/2000/svg" '
      f'xmlns:xlink="http://www.w3.org/1999/xlink" data-profkit-flamegraph="{p}" '
      f'data-total="{_fmt(total)}" data-width="{_fmt(width)}" data-pad="{_fmt(pad)}" '
      f'data-fontsize="{_fmt(font_size)}" '
      f'data-diff="{2 if sig is not None else 1 if a_counts is not None else 0}">\n')
    meta_d: dict[str, Any] = {
        "title": title, "provenance": provenance, "total": total, "count_name": count_name,
        "differential": ("repeated recordings" if sig is not None else
                         "share-based" if a_counts is not None else False),
        "diff_basis": diff_basis if a_counts is not None or sig is not None else None}
    if sig is not None:
        meta_d["bootstrap"] = sig.meta()
    meta = json.dumps(meta_d, default=str, sort_keys=True)
    w(f'<metadata id="{p}-provenance">{e(meta, quote=False)}</metadata>\n')
    w(f"<style>\n"
      f"#{p}-svg text {{ font-family: Verdana, 'DejaVu Sans', sans-serif; "
      f"font-size: {_fmt(font_size)}px; fill: rgb(0,0,0); }}\n"
      f"#{p}-svg .{p}-title {{ font-size: {_fmt(font_size + 5)}px; }}\n"
      f"#{p}-svg .{p}-sub {{ fill: rgb(80,80,80); }}\n"
      f"#{p}-svg .{p}-ctl {{ cursor: pointer; fill: rgb(40,40,160); }}\n"
      f"#{p}-svg .{p}-ctl:hover {{ text-decoration: underline; }}\n"
      f"#{p}-svg .{p}-f {{ cursor: pointer; }}\n"
      f"#{p}-svg .{p}-f text {{ pointer-events: none; }}\n"
      f"#{p}-svg .{p}-f:hover rect {{ stroke: rgb(0,0,0); stroke-width: 0.5; }}\n"
      f"#{p}-svg .{p}-parent {{ opacity: 0.5; }}\n"
      f"#{p}-svg .{p}-hide {{ display: none; }}\n"
      f"#{p}-svg .{p}-instr rect {{ stroke: {INSTRUMENTATION_COLOR}; stroke-width: 1.5; }}\n"
      f"</style>\n")
    w(f'<rect x="0" y="0" width="{_fmt(width)}" height="{height}" fill="rgb(250,250,246)"/>\n')
    w(f'<text class="{p}-title" id="{p}-title" x="{width / 2:.1f}" y="{font_size + 10:.1f}" '
      f'text-anchor="middle">{e(title)}</text>\n')
    max_sub = int(plot_w / (font_size * _FONT_WIDTH))
    sub_text = subtitle if len(subtitle) <= max_sub else subtitle[: max_sub - 2] + ".."
    w(f'<text class="{p}-sub" id="{p}-subtitle" x="{width / 2:.1f}" '
      f'y="{2 * font_size + 16:.1f}" text-anchor="middle"><title>{e(subtitle)}</title>'
      f'{e(sub_text)}</text>\n')
    if legend:
        # one text element (its id is the legend's); a long legend wraps into tspans
        w(f'<text class="{p}-sub" id="{p}-legend" x="{width / 2:.1f}" y="{legend_y:.1f}" '
          f'text-anchor="middle">')
        for i, line in enumerate(legend_lines):
            w(e(line) if i == 0 else
              f'<tspan x="{width / 2:.1f}" dy="{_fmt(font_size + 4)}">{e(line)}</tspan>')
        w("</text>\n")
    w(f'<text class="{p}-ctl {p}-hide" id="{p}-reset" x="{pad:.1f}" y="{ctl_y:.1f}">'
      f'Reset Zoom</text>\n')
    w(f'<text class="{p}-ctl" id="{p}-search" x="{width - pad:.1f}" y="{ctl_y:.1f}" '
      f'text-anchor="end">Search</text>\n')
    w(f'<text class="{p}-ctl {p}-hide" id="{p}-clear" x="{width - pad - 70:.1f}" '
      f'y="{ctl_y:.1f}" text-anchor="end">Reset Search</text>\n')
    w(f'<text id="{p}-details" x="{pad:.1f}" y="{height - font_size + 2:.1f}"> </text>\n')
    w(f'<text id="{p}-matched" x="{width - pad:.1f}" y="{height - font_size + 2:.1f}" '
      f'text-anchor="end"> </text>\n')

    w(f'<g id="{p}-frames">\n')
    if not frames:
        w(f'<text id="{p}-empty" x="{width / 2:.1f}" y="{top + frame_height * 2:.1f}" '
          f'text-anchor="middle">no samples</text>\n')
    base_y = top + max_depth * frame_height
    for i, f in enumerate(frames):
        x = pad + f.x / total * plot_w
        fw = f.w / total * plot_w
        y = top + f.depth * frame_height if inverted else base_y - f.depth * frame_height
        pct = 100.0 * f.w / total
        name = _disp(f.name)
        instr = is_instrumentation(f.name) if f.depth else False
        if f.merged:
            fill = MERGED_COLOR
            tip = (f"{f.merged:,} frames narrower than {min_width_px:g} px, merged "
                   f"({_num(f.w)} {count_name}, {pct:.2f}%)")
        elif sig is not None:
            fill, tip, extra_attrs = sig.frame(f, name, pct, max_abs)
        elif a_counts is not None:
            fill = diff_color(f.delta or 0.0, max_abs) if f.depth else "rgb(245,245,245)"
            an = f.a_norm or 0.0
            bval = f.self if diff_basis == "self" else f.w
            change = (f"{(f.delta or 0.0) / an * 100:+.1f}%" if an > 0 else "new")
            tip = (f"{name} ({_num(f.w)} {count_name}, {pct:.2f}%; {diff_basis}: "
                   f"{_num(bval)} vs {_num(round(an, 1))} before, "
                   f"{(f.delta or 0.0):+,.1f} = {change})")
        else:
            fill = "rgb(235,235,235)" if f.depth == 0 else frame_color(f.name)
            tip = f"{name} ({_num(f.w)} {count_name}, {pct:.2f}%)"
        cls = f"{p}-f" + (f" {p}-instr" if instr and (a_counts is not None or sig is not None)
                          else "")
        attrs = (f'class="{cls}" id="{p}-f{i}" data-n="{e(name)}" data-x="{_fmt(f.x)}" '
                 f'data-w="{_fmt(f.w)}" data-d="{f.depth}" data-s="{_fmt(f.self)}"')
        if f.merged:
            attrs += f' data-m="{f.merged}"'
        if a_counts is not None:
            attrs += f' data-delta="{(f.delta or 0.0):.3f}"'
        if sig is not None and not f.merged:
            attrs += extra_attrs
        w(f"<g {attrs}><title>{e(tip)}</title>"
          f'<rect x="{x:.2f}" y="{y:.1f}" width="{fw:.2f}" height="{_fmt(frame_height - 1)}" '
          f'fill="{fill}" rx="2" ry="2"/>'
          f'<text x="{x + 3:.2f}" y="{y + frame_height - 4.5:.1f}">'
          f"{e(_label(name, fw, font_size))}</text></g>\n")
    w("</g>\n")
    w('<script type="text/ecmascript"><![CDATA[\n')
    w(_JS.replace("__P__", p).replace("__SEARCH_COLOR__", SEARCH_COLOR)
      .replace("__COUNT__", count_name.replace('"', "")))
    w("]]></script>\n</svg>\n")
    return "".join(out)


# The script below is this project's own. It keeps every name inside one closure and
# publishes one object, window["fg_" + prefix], so graphs in one page stay independent.
_JS = r"""
(function () {
  "use strict";
  var P = "__P__";
  var svg = document.getElementById(P + "-svg");
  if (!svg) { return; }
  var W = +svg.getAttribute("data-width"), PAD = +svg.getAttribute("data-pad");
  var FS = +svg.getAttribute("data-fontsize"), TOTAL = +svg.getAttribute("data-total");
  var PW = W - 2 * PAD;
  var details = document.getElementById(P + "-details");
  var matchedText = document.getElementById(P + "-matched");
  var resetCtl = document.getElementById(P + "-reset");
  var clearCtl = document.getElementById(P + "-clear");
  var searchCtl = document.getElementById(P + "-search");
  var holder = document.getElementById(P + "-frames");
  var nodes = holder.querySelectorAll("g." + P + "-f");
  var frames = [];
  for (var i = 0; i < nodes.length; i++) {
    var g = nodes[i], r = g.querySelector("rect");
    frames.push({g: g, r: r, t: g.querySelector("text"), n: g.getAttribute("data-n"),
                 x: +g.getAttribute("data-x"), w: +g.getAttribute("data-w"),
                 d: +g.getAttribute("data-d"), fill: r.getAttribute("fill"),
                 tip: g.querySelector("title").textContent});
  }
  var zoomed = null, term = null;

  function label(name, w) {
    var n = Math.floor(w / (FS * 0.59));
    if (n < 3) { return ""; }
    return name.length <= n ? name : name.substring(0, n - 2) + "..";
  }
  function place(f, x, w) {
    f.r.setAttribute("x", x.toFixed(2));
    f.r.setAttribute("width", w.toFixed(2));
    f.t.setAttribute("x", (x + 3).toFixed(2));
    f.t.textContent = label(f.n, w);
  }
  function cls(el, name, on) {
    if (on) { el.classList.add(P + "-" + name); } else { el.classList.remove(P + "-" + name); }
  }
  function zoom(f) {
    if (typeof f === "number") { f = frames[f]; }
    else if (typeof f === "string") {
      var best = null;
      frames.forEach(function (c) { if (c.n === f && (!best || c.w > best.w)) { best = c; } });
      f = best;
    }
    if (!f) { return false; }
    if (f.d === 0) { reset(); return true; }
    var x0 = f.x, w0 = f.w, eps = 1e-9 * TOTAL, k = PW / w0;
    frames.forEach(function (c) {
      var inside = c.x >= x0 - eps && c.x + c.w <= x0 + w0 + eps;
      if (c.d >= f.d && inside) {
        cls(c.g, "hide", false); cls(c.g, "parent", false);
        place(c, PAD + (c.x - x0) * k, c.w * k);
      } else if (c.d < f.d && c.x <= x0 + eps && c.x + c.w >= x0 + w0 - eps) {
        cls(c.g, "hide", false); cls(c.g, "parent", true);
        place(c, PAD, PW);
      } else {
        cls(c.g, "hide", true);
      }
    });
    zoomed = f;
    cls(resetCtl, "hide", false);
    return true;
  }
  function reset() {
    var k = PW / TOTAL;
    frames.forEach(function (c) {
      cls(c.g, "hide", false); cls(c.g, "parent", false);
      place(c, PAD + c.x * k, c.w * k);
    });
    zoomed = null;
    cls(resetCtl, "hide", true);
  }
  function search(re) {
    var rx;
    try { rx = (re instanceof RegExp) ? re : new RegExp(re); } catch (err) {
      matchedText.textContent = "bad regex: " + err.message; return null;
    }
    var hits = [];
    frames.forEach(function (c) {
      if (c.d > 0 && rx.test(c.n)) { c.r.setAttribute("fill", "__SEARCH_COLOR__"); hits.push(c); }
      else { c.r.setAttribute("fill", c.fill); }
    });
    // matched share of all samples: union of the hit intervals, overlaps counted once
    hits.sort(function (a, b) { return a.x - b.x || b.w - a.w; });
    var sum = 0, end = -1;
    hits.forEach(function (c) {
      var s = Math.max(c.x, end), e = c.x + c.w;
      if (e > s) { sum += e - s; }
      if (e > end) { end = e; }
    });
    var pct = TOTAL > 0 ? 100 * sum / TOTAL : 0;
    term = String(re);
    matchedText.textContent = "Matched: " + pct.toFixed(1) + "% (" + hits.length + " frames)";
    cls(clearCtl, "hide", false);
    return pct;
  }
  function clearSearch() {
    frames.forEach(function (c) { c.r.setAttribute("fill", c.fill); });
    matchedText.textContent = " ";
    term = null;
    cls(clearCtl, "hide", true);
  }
  function promptSearch() {
    var t = window.prompt("Search frames (regular expression):", term || "");
    if (t !== null && t !== "") { search(t); }
  }
  holder.addEventListener("click", function (ev) {
    var g = ev.target.closest ? ev.target.closest("g." + P + "-f") : null;
    if (!g) { return; }
    for (var j = 0; j < frames.length; j++) {
      if (frames[j].g === g) { zoom(frames[j]); break; }
    }
  });
  holder.addEventListener("mouseover", function (ev) {
    var g = ev.target.closest ? ev.target.closest("g." + P + "-f") : null;
    if (g) { details.textContent = g.querySelector("title").textContent; }
  });
  holder.addEventListener("mouseout", function () { details.textContent = " "; });
  resetCtl.addEventListener("click", reset);
  clearCtl.addEventListener("click", clearSearch);
  searchCtl.addEventListener("click", promptSearch);
  svg.addEventListener("mouseenter", function () { window.__profkitActiveFlamegraph = P; });
  window.addEventListener("keydown", function (ev) {
    var active = window.__profkitActiveFlamegraph === P ||
      document.querySelectorAll("svg[data-profkit-flamegraph]").length === 1;
    if (!active) { return; }
    if ((ev.key === "f" && (ev.ctrlKey || ev.metaKey)) || ev.key === "/") {
      ev.preventDefault(); promptSearch();
    } else if (ev.key === "Escape") { clearSearch(); reset(); }
  });
  window["fg_" + P] = {zoom: zoom, reset: reset, search: search, clearSearch: clearSearch,
                       prefix: P, zoomed: function () { return zoomed ? zoomed.n : null; }};
})();
"""


def demo_views(runs: Sequence[tuple[str, StacksLike]], out_dir: str | os.PathLike[str], *,
               slug: str, what: str, provenance: Mapping[str, Any] | None = None
               ) -> list[Path]:
    """`make demo`'s icicle and merged graphs: an icicle of the first run
    (``<slug>-<name>-icicle.svg``) and every run merged into one graph, each normalised to
    the same total and drawn under its own root frame (``<slug>-merged.svg``)."""
    out = Path(out_dir)
    facts = dict(provenance or {})
    name0, first = runs[0]
    paths = [render_to_file(first, out / f"{slug}-{name0}-icicle.svg", inverted=True,
                            title=f"{name0}: {what} (icicle)",
                            provenance={**facts, "view": "icicle: callers above callees"})]
    names = [n for n, _ in runs]
    counts = [_counts_of(c) for _, c in runs]
    merged = merge_profiles(counts, names=names, by_run=True)
    paths.append(render_to_file(
        merged, out / f"{slug}-merged.svg", title=f"{' + '.join(names)}: {what} (merged)",
        count_name="samples (normalised)",
        provenance={**facts, "merged runs": ", ".join(
            f"{n} ({sum(c.values()):,.0f} samples)" for n, c in zip(names, counts, strict=True)),
            "normalised": "each run scaled to the mean total"}))
    return paths


def write_svg(svg: str, path: str | os.PathLike[str]) -> Path:
    """Write an SVG string to *path* (parents created)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(svg, encoding="utf-8")
    return out


def render_to_file(stacks: StacksLike, path: str | os.PathLike[str], **kwargs: Any) -> Path:
    """:func:`render` and write the SVG to *path*."""
    return write_svg(render(stacks, **kwargs), path)


def _svg_height(svg: str) -> int:
    head = svg[: svg.find(">", svg.find("<svg")) + 1]
    i = head.find(' height="')
    if i < 0:
        return 600
    try:
        return int(float(head[i + 9: head.find('"', i + 9)]))
    except ValueError:
        return 600


def to_iframe_html(svg: str, *, height: int | None = None) -> str:
    """An ``<iframe srcdoc=...>`` holding *svg*: isolated, so graphs never share ids or
    scripts, and it scales to the cell's width."""
    body = svg.split("?>", 1)[1].lstrip() if svg.startswith("<?xml") else svg
    doc = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><style>html,body{margin:0;"
           "padding:0;background:#fff}svg{width:100%;height:auto;display:block}</style>"
           "</head><body>" + body + "</body></html>")
    h = height or _svg_height(svg) + 8
    return (f'<iframe srcdoc="{html.escape(doc, quote=True)}" '
            f'style="width:100%;height:{h}px;border:0" '
            f'sandbox="allow-scripts allow-modals"></iframe>')


class FlameGraph:
    """A rendered flamegraph for notebooks: ``_repr_html_`` shows it in an iframe,
    ``repr()`` summarises it as text, :meth:`save` writes the SVG."""

    def __init__(self, stacks: StacksLike, **kwargs: Any) -> None:
        self.counts = _counts_of(stacks)
        self.options = kwargs
        diff = kwargs.get("diff_against")
        self.diff_counts = _counts_of(diff) if diff is not None else None
        self.svg = render(self.counts, **{**kwargs, "diff_against": self.diff_counts})

    @property
    def total(self) -> float:
        return float(sum(v for v in self.counts.values() if v > 0))

    def top_self(self, n: int = 5) -> list[tuple[str, float]]:
        """The *n* functions with the most self samples, with their share."""
        selfs: dict[str, float] = {}
        for stack, v in self.counts.items():
            leaf = stack.rsplit(";", 1)[-1]
            selfs[leaf] = selfs.get(leaf, 0.0) + v
        tot = self.total or 1.0
        return [(k, v / tot) for k, v in sorted(selfs.items(), key=lambda kv: -kv[1])[:n]]

    def save(self, path: str | os.PathLike[str]) -> Path:
        return write_svg(self.svg, path)

    def _repr_html_(self) -> str:
        return to_iframe_html(self.svg)

    def __repr__(self) -> str:
        title = self.options.get("title", "Flame Graph")
        kind = "differential flamegraph" if self.diff_counts is not None else "flamegraph"
        if not self.counts or self.total <= 0:
            return f"<{kind} {title!r}: no samples>"
        tops = ", ".join(f"{k} {v:.1%}" for k, v in self.top_self())
        return (f"<{kind} {title!r}: {_num(self.total)} samples, {len(self.counts)} stacks; "
                f"top self: {tops}>")
