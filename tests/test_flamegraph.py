"""The flamegraph renderer: values in the SVG, and behaviour in headless Chromium."""
from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from proc_helpers import remove_chromium_singleton

from profkit.parse.folded import format_folded, read_folded
from profkit.parse.perf_script import fold_perf_script
from profkit.render.flamegraph import (
    INSTRUMENTATION_COLOR,
    SEARCH_COLOR,
    FlameGraph,
    diff_color,
    frame_color,
    frame_path,
    layout,
    render,
    to_iframe_html,
    write_svg,
)

PERF = Path(__file__).parent / "fixtures" / "perf"
PK: dict = {"weight": "samples", "vdso_names": True}   # profkit's reading: 1 per sample
ARTIFACTS = Path(__file__).parent / "artifacts"
SVGNS = "{http://www.w3.org/2000/svg}"

SMALL = {
    "postgres;main;ExecAgg;ExecProcNodeInstr;InstrStartNode": 10.0,
    "postgres;main;ExecAgg;ExecProcNodeInstr;ExecSeqScan": 25.0,
    "postgres;main;ExecAgg;ExecInterpExpr": 5.0,
    "postgres;main;ExecAgg": 2.0,
    "postgres;main;fib;fib;fib": 8.0,
}


def _frames(svg: str) -> list[dict]:
    """(name, depth, x, width, fill) of every frame box, parsed back from the XML."""
    root = ET.fromstring(svg.split("?>", 1)[1])
    out = []
    for g in root.iter(f"{SVGNS}g"):
        if g.get("data-n") is None:
            continue
        r = g.find(f"{SVGNS}rect")
        out.append({"name": g.get("data-n"), "depth": int(g.get("data-d")),
                    "x": float(r.get("x")), "w": float(r.get("width")),
                    "fill": r.get("fill"), "id": g.get("id"), "samples": float(g.get("data-w")),
                    "label": g.find(f"{SVGNS}text").text or "",
                    "title": g.find(f"{SVGNS}title").text})
    return out


def _distinct_prefixes(counts: dict[str, float]) -> set[tuple[str, ...]]:
    out = set()
    for s in counts:
        f = s.split(";")
        out.update(tuple(f[: i + 1]) for i in range(len(f)))
    return out


# ---------------------------------------------------------------- values

def test_one_rect_per_distinct_frame_and_widths_proportional() -> None:
    svg = render(SMALL, min_width_px=0)
    frames = _frames(svg)
    assert len(frames) == len(_distinct_prefixes(SMALL)) + 1  # + the "all" root
    total = sum(SMALL.values())
    plot_w = 1200 - 2 * 10
    for f in frames:
        assert f["w"] == pytest.approx(f["samples"] / total * plot_w, abs=0.006)
    by = {(f["name"], f["depth"]): f for f in frames}
    assert by[("all", 0)]["w"] == pytest.approx(plot_w)
    assert by[("ExecAgg", 3)]["samples"] == 42
    assert by[("ExecProcNodeInstr", 4)]["samples"] == 35
    # recursion: one box per level, each with the full 8 samples
    assert [by[("fib", d)]["samples"] for d in (3, 4, 5)] == [8, 8, 8]
    # children sorted by name, side by side inside their parent
    ea = by[("ExecAgg", 3)]
    ei, ep = by[("ExecInterpExpr", 4)], by[("ExecProcNodeInstr", 4)]
    assert ea["x"] <= ei["x"] < ep["x"] and ep["x"] + ep["w"] <= ea["x"] + ea["w"] + 0.01
    # tooltips carry name, samples and %
    assert by[("ExecSeqScan", 5)]["title"] == "ExecSeqScan (25 samples, 50.00%)"


def test_real_profile_layout_against_folded_totals() -> None:
    counts = read_folded(PERF / "expected_pg18-query3.folded")
    frames = layout(counts)
    total = sum(counts.values())
    assert frames[0].w == total == 608
    # every frame's width is the sum of the stacks that start with its path
    for i, f in enumerate(frames[1:40], 1):
        path = frame_path(frames, i)
        n = len(path)
        assert n == f.depth and path[-1] == f.name
        expect = sum(c for s, c in counts.items() if tuple(s.split(";")[:n]) == path)
        assert f.w == expect


def test_labels_truncated_to_fit() -> None:
    long = "a_really_long_function_name_that_cannot_possibly_fit_in_a_small_box"
    svg = render({f"p;{long}": 1.0, "p;short": 99.0}, min_width_px=0)
    by = {f["name"]: f for f in _frames(svg)}
    lab = by[long]["label"]
    assert lab == "" or (lab.endswith("..") and len(lab) * 12 * 0.59 <= by[long]["w"] + 1)
    assert by["short"]["label"] == "short"


def test_colours_deterministic_and_instrumentation_fixed() -> None:
    assert frame_color("ExecNestLoop") == frame_color("ExecNestLoop")
    assert frame_color("ExecNestLoop") != frame_color("ExecHashJoin")
    for name in ("InstrStartNode", "InstrStopNode", "ExecProcNodeInstr", "__vdso_clock_gettime",
                 "clock_gettime@@GLIBC_2.17", "[vdso]", "PostExecProcNodeInstr"):
        assert frame_color(name) == INSTRUMENTATION_COLOR
    m = re.fullmatch(r"rgb\((\d+),(\d+),(\d+)\)", frame_color("ExecInterpExpr"))
    assert m and int(m[1]) >= 205 and int(m[3]) <= 55          # warm: red high, blue low
    # same colour in another interpreter with another hash seed (no use of hash())
    code = ("from profkit.render.flamegraph import frame_color;"
            "print(frame_color('ExecNestLoop'), frame_color('fetch_input_tuple'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True).stdout
    assert out.split() == [frame_color("ExecNestLoop"), frame_color("fetch_input_tuple")]
    # and the same fills in two renders
    f1 = {(f["name"], f["depth"]): f["fill"] for f in _frames(render(SMALL))}
    f2 = {(f["name"], f["depth"]): f["fill"] for f in _frames(render(SMALL, title="other"))}
    assert f1 == f2
    assert f1[("InstrStartNode", 5)] == INSTRUMENTATION_COLOR


def test_differential_colours() -> None:
    before = {"p;main;slower": 10.0, "p;main;faster": 30.0, "p;main;same": 60.0}
    after = {"p;main;slower": 60.0, "p;main;faster": 10.0, "p;main;same": 130.0}  # total 200
    svg = render(after, diff_against=before, min_width_px=0)
    by = {f["name"]: f for f in _frames(svg)}
    # widths from "after"
    assert by["slower"]["samples"] == 60 and by["same"]["samples"] == 130
    # before normalised ×2: slower 20→60 (+40, red), faster 60→10 (−50, blue, the
    # largest change, full intensity), same 120→130 (+10, faint red)
    assert by["faster"]["fill"] == "rgb(0,0,255)" == diff_color(-50, 50)
    assert by["slower"]["fill"] == diff_color(40, 50) == "rgb(255,47,47)"
    assert by["same"]["fill"] == diff_color(10, 50)
    r, g, b = map(int, re.findall(r"\d+", by["same"]["fill"]))
    assert r == 255 and g == b > 180
    assert by["main"]["fill"] == "rgb(245,245,245)"               # no self samples either side
    assert "60 vs 20 before, +40.0 = +200.0%" in by["slower"]["title"]
    assert "differential" in svg and 'data-diff="1"' in svg


def test_differential_total_basis_and_only_in_a() -> None:
    before = {"p;a;x": 50.0, "p;gone": 50.0}
    after = {"p;a;x": 100.0}
    svg = render(after, diff_against=before, diff_basis="total", min_width_px=0)
    by = {f["name"]: f for f in _frames(svg)}
    assert "gone" not in by
    # total basis: a grew from 50 (normalised: 50) to 100 → red
    assert by["a"]["fill"].startswith("rgb(255,")
    assert "only before, not drawn" in svg


def test_ids_unique_across_graphs_and_namespaced_js() -> None:
    a, b = render(SMALL), render(SMALL)
    ids_a = set(re.findall(r'\bid="([^"]+)"', a))
    ids_b = set(re.findall(r'\bid="([^"]+)"', b))
    assert ids_a and ids_b and not ids_a & ids_b
    pa = re.search(r'data-profkit-flamegraph="([^"]+)"', a)[1]
    pb = re.search(r'data-profkit-flamegraph="([^"]+)"', b)[1]
    assert pa != pb
    assert all(i.startswith(pa + "-") for i in ids_a)
    # the script publishes one object per graph and no other global
    assert f'var P = "{pa}"' in a and 'window["fg_" + P]' in a
    css_classes = set(re.findall(r'class="([^"]+)"', a))
    assert all(c.startswith(pa + "-") for cl in css_classes for c in cl.split())


def test_wellformed_with_awkward_names() -> None:
    counts = {'p;operator<<(std::ostream&, "x")': 3.0, "p;a&b;<c>": 2.0, "p;ünï;日本": 1.0}
    svg = render(counts, title="<T&>", provenance={"query": 'SELECT "a" < 1 & 2'})
    names = {f["name"] for f in _frames(svg)}
    assert {'operator<<(std::ostream&, "x")', "a&b", "<c>", "ünï", "日本"} <= names


def test_provenance_title_and_metadata() -> None:
    prov = {"build": "vanilla", "pg": "18.6", "query": "Query-3", "tool": "perf",
            "samples": 608, "date": "2025-11-30"}
    svg = render(SMALL, title="Query-3 on vanilla", provenance=prov)
    root = ET.fromstring(svg.split("?>", 1)[1])
    texts = {t.get("id", "").rsplit("-", 1)[-1]: "".join(t.itertext())
             for t in root.iter(f"{SVGNS}text")}
    assert texts["title"] == "Query-3 on vanilla"
    assert "build: vanilla · pg: 18.6 · query: Query-3 · tool: perf · samples: 608" in (
        texts["subtitle"])
    meta = json.loads(root.find(f"{SVGNS}metadata").text)
    assert meta["provenance"] == prov and meta["total"] == 50


def test_empty_input_says_no_samples() -> None:
    for empty in ({}, {"a;b": 0.0}):
        svg = render(empty, title="nothing")
        root = ET.fromstring(svg.split("?>", 1)[1])
        assert "no samples" in "".join(root.itertext())
        assert _frames(svg) == []
    fg = FlameGraph({})
    assert "no samples" in repr(fg)


def test_min_width_prunes_tiny_frames() -> None:
    counts = {"p;big": 1_000_000.0, "p;tiny;deeper": 1.0}
    names = {f["name"] for f in _frames(render(counts))}
    assert "tiny" not in names and "deeper" not in names and "big" in names
    names0 = {f["name"] for f in _frames(render(counts, min_width_px=0))}
    assert {"tiny", "deeper"} <= names0


def test_iframe_and_notebook_repr() -> None:
    fold = fold_perf_script(PERF / "pg18-query3.perf-script.txt.gz", **PK)
    fg = FlameGraph(fold, title="Query-3")
    html_snippet = fg._repr_html_()
    assert html_snippet.startswith('<iframe srcdoc="&lt;!DOCTYPE html&gt;')
    assert "<svg" not in html_snippet                    # escaped inside srcdoc
    assert "&lt;svg" in html_snippet and 'sandbox="allow-scripts allow-modals"' in html_snippet
    assert to_iframe_html(fg.svg) == html_snippet
    r = repr(fg)
    assert r.startswith("<flamegraph 'Query-3': 608 samples") and "__vdso_clock_gettime 71.9%" in r
    d = FlameGraph(fold, diff_against=fold_perf_script(PERF / "pg18-query2.perf-script.txt.gz", **PK))
    assert repr(d).startswith("<differential flamegraph")


def test_render_from_stacks_dataframe_and_path(tmp_path: Path) -> None:
    fold = fold_perf_script(PERF / "clockloop.perf-script.txt", **PK)
    a = _frames(render(fold.stacks_df(), id_prefix="fgx"))
    b = _frames(render(PERF / "expected_clockloop.folded", id_prefix="fgx"))
    assert a == b


def test_cli_flamegraph(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from profkit.cli.flamegraph import flamegraph_cmd

    out = tmp_path / "q3.svg"
    r = CliRunner().invoke(flamegraph_cmd, [str(PERF / "pg18-query3.perf-script.txt.gz"),
                                            "-o", str(out), "--title", "Q3",
                                            "--meta", "build=vanilla"])
    assert r.exit_code == 0, r.output
    svg = out.read_text()
    assert "build: vanilla" in svg and ">Q3</text>" in svg and "samples: 608" in svg
    out2 = tmp_path / "diff.svg"
    r = CliRunner().invoke(flamegraph_cmd, ["--diff", str(PERF / "expected_pg18-query2.folded"),
                                            str(PERF / "pg18-query3.perf-script.txt.gz"),
                                            "-o", str(out2)])
    assert r.exit_code == 0, r.output
    assert 'data-diff="1"' in out2.read_text()
    r = CliRunner().invoke(flamegraph_cmd, [])
    assert r.exit_code == 2 and "give STACKS" in r.output and "--diff A B" in r.output


def test_cli_draws_a_differential_folded_file(tmp_path: Path) -> None:
    """A difffolded.pl file drawn alone is the differential of its two profiles (what
    flamegraph.pl makes of it), frame for frame the --diff of the two files."""
    from profkit.cli.flamegraph import flamegraph_cmd
    from profkit.parse.folded import diff_folded, format_diff_folded, write_folded

    a = read_folded(PERF / "expected_pg18-query2.folded")
    b = dict(a)
    top = max(b, key=b.get)
    b[top] *= 3
    d = diff_folded(a, b, normalise=False)
    (tmp_path / "ab.folded").write_text(format_diff_folded(d))
    write_folded(a, tmp_path / "a.folded")
    write_folded(b, tmp_path / "b.folded")
    one, two = tmp_path / "one.svg", tmp_path / "two.svg"
    r = CliRunner().invoke(flamegraph_cmd, [str(tmp_path / "ab.folded"), "-o", str(one)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(flamegraph_cmd, ["--diff", str(tmp_path / "a.folded"),
                                            str(tmp_path / "b.folded"), "-o", str(two)])
    assert r.exit_code == 0, r.output
    strip = lambda fr: [{k: v for k, v in f.items() if k != "id"} for f in fr]  # noqa: E731
    frames = strip(_frames(one.read_text()))
    assert frames == strip(_frames(two.read_text()))
    assert 'data-diff="1"' in one.read_text() and "BEFORE AFTER per stack" in one.read_text()
    # the widths are AFTER's: the tripled stack's leaf is red
    leaf = top.split(";")[-1]
    assert any(f["name"] == leaf and f["fill"] == "rgb(255,0,0)" for f in frames), leaf
    # on stdin too
    r = CliRunner().invoke(flamegraph_cmd, ["-", "-o", str(tmp_path / "in.svg")],
                           input=(tmp_path / "ab.folded").read_text())
    assert r.exit_code == 0, r.output
    assert strip(_frames((tmp_path / "in.svg").read_text())) == frames
    # several files with --merge: a differential one is refused, and says how to draw it
    r = CliRunner().invoke(flamegraph_cmd, ["--merge", str(tmp_path / "ab.folded"),
                                            str(tmp_path / "a.folded")])
    assert r.exit_code != 0 and "differential folded file" in r.output


# ---------------------------------------------------------------- headless Chromium

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class Browser:
    """Headless Chromium driven over the DevTools protocol (websocket-client)."""

    def __init__(self, profile_dir: Path, size: tuple[int, int] = (1200, 1000)) -> None:
        import websocket

        from profkit.processes import Background

        self.bg = Background(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile_dir}",
             "--remote-debugging-port=0", "--remote-allow-origins=*",
             f"--window-size={size[0]},{size[1]}", "about:blank"],
            stop_signal=signal.SIGTERM, stop_timeout=10, what="chromium")
        self.profile = profile_dir
        self.bg.start()
        try:
            port_file = profile_dir / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().strip()):
                if time.monotonic() > deadline or not self.bg.alive():
                    raise RuntimeError("chromium did not open its DevTools port")
                time.sleep(0.1)
            port = int(port_file.read_text().split()[0])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                page = next(t for t in json.load(r) if t["type"] == "page")
            self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30,
                                                  suppress_origin=True)
        except BaseException:
            self.bg.stop()
            remove_chromium_singleton(self.profile)
            raise
        self._id = 0
        self.call("Page.enable")

    def call(self, method: str, **params: object) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def open(self, url: str, ready: str) -> None:
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 20
        while not self.eval(ready):
            if time.monotonic() > deadline:
                raise RuntimeError(f"page {url} never satisfied {ready}")
            time.sleep(0.05)

    def eval(self, expr: str) -> object:
        res = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"JS error in {expr!r}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def click(self, x: float, y: float) -> None:
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                      clickCount=1)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.bg.stop()
            remove_chromium_singleton(self.profile)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    if not os.path.exists(CHROMIUM):
        pytest.fail("chromium is not installed: run scripts/setup-system.sh")
    import websocket  # noqa: F401  (dev extra: websocket-client)
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    singleton = Path(os.readlink(b.profile / "SingletonSocket")).parent
    assert singleton.is_dir() and singleton.name.startswith("org.chromium.Chromium.")
    try:
        yield b
    finally:
        b.close()
    assert not singleton.exists(), f"Chromium's {singleton} was left behind"


def _center(b: Browser, elem_js: str) -> tuple[float, float]:
    r = b.eval(f"(function(){{var e={elem_js}; e.scrollIntoView({{block:'center'}});"
               f"var r=e.getBoundingClientRect(); return [r.left+r.width/2, r.top+r.height/2];}})()")
    assert isinstance(r, list)
    return float(r[0]), float(r[1])


@pytest.mark.browser
def test_zoom_search_in_chromium(browser: Browser) -> None:
    fold = fold_perf_script(PERF / "pg18-query3.perf-script.txt.gz", **PK)
    prov = {"build": "warmup (PostgreSQL 18.6, -O2 -fno-omit-frame-pointer)",
            "query": "Query-3 (EXPLAIN ANALYZE, TIMING on), scale 0.05",
            "tool": "perf record -F 999 -g", "samples": fold.samples}
    svg = render(fold, title="Query-3: where the time goes", provenance=prov,
                 id_prefix="fgtest1", min_width_px=0)
    path = ARTIFACTS / "flamegraph-query3.svg"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(svg)
    api = "window.fg_fgtest1"
    browser.open(path.as_uri(), f"typeof {api} === 'object'")
    browser.screenshot(ARTIFACTS / "flamegraph-query3.png")

    full = 1200 - 2 * 10
    # the widest ExecNestLoop box, clicked with the mouse
    sel = ("(function(){var best=null;document.querySelectorAll('g.fgtest1-f').forEach("
           "function(g){if(g.getAttribute('data-n')==='ExecNestLoop'&&(!best||"
           "+g.getAttribute('data-w')>+best.getAttribute('data-w')))best=g;});return best;})()")
    before_w = float(browser.eval(f"{sel}.querySelector('rect').getAttribute('width')"))
    assert before_w < full * 0.9
    x, y = _center(browser, f"{sel}.querySelector('rect')")
    browser.click(x, y)
    assert browser.eval(f"{api}.zoomed()") == "ExecNestLoop"
    after_w = float(browser.eval(f"{sel}.querySelector('rect').getAttribute('width')"))
    assert after_w == pytest.approx(full, abs=0.01)
    # ancestors stay at full width (faded); frames outside the subtree are hidden
    anc = browser.eval("""(function(){var out=[];document.querySelectorAll('g.fgtest1-f')
        .forEach(function(g){ if (g.classList.contains('fgtest1-parent')) out.push(
        [g.getAttribute('data-n'), +g.querySelector('rect').getAttribute('width')]);});
        return out;})()""")
    assert anc and all(w == pytest.approx(full, abs=0.01) for _, w in anc)
    assert {"all", "postgres", "ExecAgg"} <= {n for n, _ in anc}
    hidden = browser.eval("document.querySelectorAll('g.fgtest1-f.fgtest1-hide').length")
    assert isinstance(hidden, int) and hidden > 0
    assert browser.eval("document.getElementById('fgtest1-reset').classList"
                        ".contains('fgtest1-hide')") is False
    browser.screenshot(ARTIFACTS / "flamegraph-query3-zoomed.png")

    # the Reset Zoom control, clicked, restores the layout
    browser.click(*_center(browser, "document.getElementById('fgtest1-reset')"))
    assert browser.eval(f"{api}.zoomed()") is None
    assert float(browser.eval(f"{sel}.querySelector('rect').getAttribute('width')")) == (
        pytest.approx(before_w, abs=0.01))

    # search: the namespaced function with a regex; matched % from the stacks themselves
    regex = r"^(Instr|clock_gettime|__vdso)"
    pct = browser.eval(f"{api}.search({json.dumps(regex)})")
    total = sum(fold.counts.values())
    hit = sum(c for s, c in fold.counts.items() if any(re.search(regex, f)
                                                       for f in s.split(";")))
    assert pct == pytest.approx(100 * hit / total, abs=1e-6)
    assert browser.eval("document.getElementById('fgtest1-matched').textContent").startswith(
        f"Matched: {100 * hit / total:.1f}%")
    n_match = sum(1 for f in layout(fold.counts) if f.depth and re.search(regex, f.name))
    painted = browser.eval(f"document.querySelectorAll('g.fgtest1-f rect[fill=\"{SEARCH_COLOR}\"]')"
                           ".length")
    assert painted == n_match
    browser.screenshot(ARTIFACTS / "flamegraph-query3-search.png")
    browser.eval(f"{api}.clearSearch()")
    assert browser.eval(f"document.querySelectorAll('rect[fill=\"{SEARCH_COLOR}\"]').length") == 0


@pytest.mark.browser
def test_two_graphs_in_one_page_do_not_interfere(browser: Browser) -> None:
    q3 = fold_perf_script(PERF / "pg18-query3.perf-script.txt.gz", **PK)
    q2 = fold_perf_script(PERF / "pg18-query2.perf-script.txt.gz", **PK)
    a = render(q3, title="Query-3")
    b = render(q2, title="Query-3 → Query-2 (differential)", diff_against=q3)
    pa = re.search(r'data-profkit-flamegraph="([^"]+)"', a)[1]
    pb = re.search(r'data-profkit-flamegraph="([^"]+)"', b)[1]
    page = ARTIFACTS / "two-flamegraphs.html"
    page.write_text("<!DOCTYPE html><html><body>" + a.split("?>", 1)[1] + b.split("?>", 1)[1]
                    + "</body></html>")
    browser.open(page.as_uri(), f"typeof window.fg_{pa} === 'object' && "
                                f"typeof window.fg_{pb} === 'object'")
    widths_b = browser.eval(f"Array.from(document.querySelectorAll('g.{pb}-f rect'))"
                            ".map(function(r){return r.getAttribute('width')})")
    assert browser.eval(f"window.fg_{pa}.zoom('ExecNestLoop')") is True
    assert browser.eval(f"window.fg_{pb}.zoomed()") is None
    assert browser.eval(f"Array.from(document.querySelectorAll('g.{pb}-f rect'))"
                        ".map(function(r){return r.getAttribute('width')})") == widths_b
    browser.eval(f"window.fg_{pb}.search('ExecNestLoop')")
    assert browser.eval(f"document.getElementById('{pa}-matched').textContent") == " "
    assert browser.eval(f"document.getElementById('{pb}-matched').textContent").startswith(
        "Matched:")
    browser.screenshot(ARTIFACTS / "two-flamegraphs.png")


# ---------------------------------------------------------------- scale, icicle, merge (issue 12)

def _parse_back(svg: str) -> dict[str, float]:
    """Folded counts rebuilt from a rendered SVG: each frame's self samples under the
    path of the boxes that contain it (parents found by depth and offset)."""
    frames = _frames(svg)
    by_depth: dict[int, list[dict]] = {}
    for f in frames:
        by_depth.setdefault(f["depth"], []).append(f)
    root = next(f for f in frames if f["depth"] == 0)
    root_x = float(root["x"])
    out: dict[str, float] = {}
    root_el = ET.fromstring(svg.split("?>", 1)[1])
    selfs = {g.get("id"): float(g.get("data-s")) for g in root_el.iter(f"{SVGNS}g")
             if g.get("data-n") is not None}
    xs = {g.get("id"): float(g.get("data-x")) for g in root_el.iter(f"{SVGNS}g")
          if g.get("data-n") is not None}
    ws = {g.get("id"): float(g.get("data-w")) for g in root_el.iter(f"{SVGNS}g")
          if g.get("data-n") is not None}
    del root_x
    for f in frames:
        if f["depth"] == 0 or selfs[f["id"]] == 0:
            continue
        path = [f["name"]]
        x, d = xs[f["id"]], f["depth"]
        while d > 1:
            d -= 1
            parent = next(p for p in by_depth[d]
                          if xs[p["id"]] <= x + 1e-9 and x < xs[p["id"]] + ws[p["id"]])
            path.append(parent["name"])
        out[";".join(reversed(path))] = selfs[f["id"]]
    return out


_frame_name = st.text(alphabet=st.characters(blacklist_characters=";\x00",
                                             blacklist_categories=("Cs", "Cc")),
                      min_size=1, max_size=12).filter(lambda s: s.strip() == s and s != "")


def _two_counts(stack: str) -> bool:
    from profkit.parse.folded import _is_count

    rest, sep, last = stack.rpartition(" ")
    return bool(sep and rest.strip() and _is_count(last.encode("utf-8", "surrogateescape")))


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.lists(_frame_name, min_size=1, max_size=6).map(";".join)
                       # a line starting with "#" is a comment in folded files; a stack
                       # ending in " <number>" ("0 0" with count 1 is "0 0 1") reads as a
                       # differential line, as in flamegraph.pl: no format can tell them apart
                       .filter(lambda s: not s.startswith("#") and not _two_counts(s)),
                       st.integers(1, 1000), min_size=1, max_size=25))
def test_round_trip_folded_render_parse_back(counts: dict[str, int]) -> None:
    """folded → write → read → render → parse the SVG back: the same counts."""
    text = format_folded(counts)
    back = read_folded(io.StringIO(text))
    assert back == {k: float(v) for k, v in counts.items()}
    assert _parse_back(render(back, min_width_px=0)) == back


def test_deep_stack_layout_is_linear() -> None:
    depth = 20_000
    counts = {";".join(f"f{i}" for i in range(depth)): 3.0, "f0;other": 1.0}
    frames = layout(counts)
    assert len(frames) == depth + 2           # all + 20,000 + "other"
    assert frames[-1].depth == depth and frames[-1].w == 3.0
    assert not hasattr(frames[1], "path")     # no per-frame path tuple (quadratic memory)
    assert frame_path(frames, 2) == ("f0", "f1")
    svg = render(counts)
    assert svg.count('class="fg') >= depth


def test_narrow_frames_merge_into_one_box() -> None:
    counts = {"p;big": 10_000.0, **{f"p;tiny{i}": 1.0 for i in range(500)},
              **{f"p;tiny0;deeper{i}": 0.001 for i in range(10)}}
    svg = render(counts, min_width_px=1.0)
    frames = _frames(svg)
    merged = [f for f in frames if f["name"].endswith("narrow frames]")]
    assert len(merged) == 1 and merged[0]["name"] == "[500 narrow frames]"
    assert merged[0]["samples"] == pytest.approx(500.01)
    assert merged[0]["fill"] == "rgb(200,200,200)"
    assert not any(f["name"].startswith(("tiny", "deeper")) for f in frames)
    assert "frames narrower than 1 px merged" in svg
    # with no minimum every frame is drawn
    assert len(_frames(render(counts, min_width_px=0))) == 1 + 1 + 1 + 500 + 10


def test_icicle_puts_the_root_on_top() -> None:
    up = {(f["name"], f["depth"]): f for f in _frames(render(SMALL))}
    root_el = ET.fromstring(render(SMALL, inverted=True).split("?>", 1)[1])
    ys = {}
    for g in root_el.iter(f"{SVGNS}g"):
        if g.get("data-n") is not None:
            ys[(g.get("data-n"), int(g.get("data-d")))] = float(g.find(f"{SVGNS}rect").get("y"))
    assert ys[("all", 0)] < ys[("postgres", 1)] < ys[("main", 2)]
    assert set(ys) == set(up)                       # the same boxes, flipped


def test_merge_normalises_each_run() -> None:
    from profkit.render.flamegraph import merge_profiles

    a = {"p;x": 90.0, "p;y": 10.0}                 # 100 samples
    b = {"p;x": 100.0, "p;z": 900.0}               # 1,000 samples
    m = merge_profiles([a, b])                    # each run scaled to the mean, 550
    assert m["p;x"] == pytest.approx(90 * 5.5 + 100 * 0.55)
    assert m["p;z"] == pytest.approx(900 * 0.55)
    assert sum(m.values()) == pytest.approx(1100)
    side = merge_profiles([a, b], names=["A", "B"], by_run=True)
    assert side["A;p;x"] == pytest.approx(495.0) and side["B;p;z"] == pytest.approx(495.0)
    raw = merge_profiles([a, b], normalise=False)
    assert raw["p;x"] == 190.0


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf"), 20, "wide"])
def test_bad_widths_are_refused(bad: object) -> None:
    from profkit.render.flamegraph import RenderError

    with pytest.raises(RenderError, match="width must be a"):
        render(SMALL, width=bad)  # type: ignore[arg-type]
    with pytest.raises(RenderError, match="minimum frame width"):
        render(SMALL, min_width_px=-1)


def test_non_utf8_names_render_as_valid_xml(tmp_path: Path) -> None:
    f = tmp_path / "latin1.folded"
    f.write_bytes(b"p;caf\xe9 1\np;caf\xe8 2\np;ctl\x01 3\n")
    svg = render(read_folded(f), min_width_px=0)
    out = write_svg(svg, tmp_path / "x.svg")
    ET.fromstring(out.read_bytes().split(b"?>", 1)[1])        # well-formed
    names = {fr["name"] for fr in _frames(svg)}
    assert "caf\ufffd" in names and "ctl\ufffd" in names


def test_cli_stdin_merge_icicle_and_bad_width(tmp_path: Path) -> None:
    from profkit.cli.flamegraph import flamegraph_cmd

    q3 = PERF / "expected_pg18-query3.folded"
    q2 = PERF / "expected_pg18-query2.folded"
    r = CliRunner().invoke(flamegraph_cmd, ["-", "-o", str(tmp_path / "in.svg")],
                           input=q3.read_bytes())
    assert r.exit_code == 0, r.output
    assert _frames((tmp_path / "in.svg").read_text())[0]["samples"] == 608
    r = CliRunner().invoke(flamegraph_cmd, ["--merge", str(q3), str(q2), "--icicle",
                                            "-o", str(tmp_path / "m.svg")])
    assert r.exit_code == 0, r.output
    svg = (tmp_path / "m.svg").read_text()
    assert _frames(svg)[0]["samples"] == pytest.approx((608 + 201), abs=0.01)
    assert "merged runs: expected_pg18-query3 (608), expected_pg18-query2 (201)" in svg
    for args, msg in ((["--width", "-3", str(q3)], "--width must be a finite number"),
                      (["--width", "nan", str(q3)], "--width must be a finite number"),
                      ([str(q3), str(q2)], "pass --merge"),
                      (["--merge", str(q3)], "at least two")):
        r = CliRunner().invoke(flamegraph_cmd, args)
        assert r.exit_code == 2 and msg in r.output, (args, r.output)


def test_cli_leaves_out_stray_lines_and_refuses_an_empty_input(tmp_path: Path) -> None:
    """As flamegraph.pl and inferno: a line that is not 'stack COUNT' is left out of the
    graph and counted in one warning; an input with no stack counts draws nothing and fails
    (flamegraph.pl: "No stack counts found", exit 2), where profkit once drew an empty
    graph of 0 samples and exited 0."""
    from profkit.cli.flamegraph import flamegraph_cmd

    f = tmp_path / "stray.folded"
    f.write_text("p;main;scan 31\np;main 6\nA NOTE PASTED IN\np;main;sort 1\n"
                 "p;x 12V.43\np;main;scan 19\n\np;main 274\n")
    out = tmp_path / "stray.svg"
    r = CliRunner().invoke(flamegraph_cmd, [str(f), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert (f"profkit: {f}: ignored 2 lines that are not 'frame;frame COUNT' (line 3 "
            "'A NOTE PASTED IN', line 5 'p;x 12V.43'); the graph leaves them out") in r.stderr
    assert _frames(out.read_text())[0]["samples"] == 31 + 6 + 1 + 19 + 274
    # the same file in --merge and --diff, and on stdin
    r = CliRunner().invoke(flamegraph_cmd, ["-", "-o", str(tmp_path / "in.svg")],
                           input=f.read_bytes())
    assert r.exit_code == 0 and "profkit: stdin: ignored 2 lines" in r.stderr, r.output
    q2 = PERF / "expected_pg18-query2.folded"
    r = CliRunner().invoke(flamegraph_cmd, ["--diff", str(q2), str(f),
                                            "-o", str(tmp_path / "d.svg")])
    assert r.exit_code == 0 and r.stderr.count("ignored 2 lines") == 1, r.output
    assert _frames((tmp_path / "d.svg").read_text())[0]["samples"] == 331
    for empty in ("", "\n# nothing here\n", "NOT A STACK\nNOR THIS\n", "a;b 0\n"):
        (tmp_path / "e.folded").write_text(empty)
        r = CliRunner().invoke(flamegraph_cmd, [str(tmp_path / "e.folded"),
                                                "-o", str(tmp_path / "e.svg")])
        assert r.exit_code == 1, (empty, r.output)
        assert "no stack counts found" in r.stderr and "nothing to draw" in r.stderr
        assert not (tmp_path / "e.svg").exists()
        r = CliRunner().invoke(flamegraph_cmd, ["--merge", str(q2), str(tmp_path / "e.folded"),
                                                "-o", str(tmp_path / "e.svg")])
        assert r.exit_code == 1 and "no stack counts found" in r.stderr, (empty, r.output)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.lists(st.sampled_from(["a", "b", "ab", "a-b", "c"]), min_size=1,
                                max_size=5).map(";".join),
                       st.integers(1, 50), min_size=1, max_size=40),
       st.sampled_from([0.0, 0.01, 0.05, 0.2]))
def test_layout_against_brute_force(counts: dict[str, int], min_fraction: float) -> None:
    """Every drawn frame's width is the sum of the stacks under its path; frames are at
    least the minimum wide; children (drawn and merged) fit inside their parent."""
    fc = {k: float(v) for k, v in counts.items()}
    frames = layout(fc, min_fraction=min_fraction)
    total = sum(fc.values())
    limit = min_fraction * total
    assert frames[0].w == total
    for i, f in enumerate(frames[1:], 1):
        assert f.w >= limit
        if f.merged:
            continue
        path = frame_path(frames, i)
        assert len(path) == f.depth
        under = sum(c for s, c in fc.items() if tuple(s.split(";")[:f.depth]) == path)
        assert f.w == pytest.approx(under)
        assert f.self == fc.get(";".join(path), 0.0)
        kids = [g for g in frames if g.depth == f.depth + 1 and f.x <= g.x < f.x + f.w]
        assert sum(g.w for g in kids) + f.self <= f.w + 1e-9
        if min_fraction == 0:
            assert sum(g.w for g in kids) + f.self == pytest.approx(f.w)
