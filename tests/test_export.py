"""Exports read by their real readers: profkit's pprof files decoded by the npm
``pprof-format`` package (tests/js/pprof-read.mjs), its speedscope files opened by the
speedscope viewer from npm in headless Chromium, its collapsed stacks byte for byte the
folded files profkit writes. Inputs: the committed perf captures of PostgreSQL 18
backends (tests/fixtures/perf), folded and as a run directory, and empty inputs.

The readers are installed by ``make js`` (``npm ci`` in tests/js, part of ``make
setup``); a missing one is a failure, not a skip.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest
from proc_helpers import remove_chromium_singleton

from profkit.export import (
    ExportError,
    ProfileFacts,
    StackProfile,
    export_run,
    export_stacks,
    plan_node_of,
)
from profkit.export.protobuf import Message, varint
from profkit.parse.folded import functions_table, read_folded, stacks_table

ROOT = Path(__file__).resolve().parent.parent
PERF = ROOT / "tests" / "fixtures" / "perf"
JS = ROOT / "tests" / "js"
ARTIFACTS = ROOT / "tests" / "artifacts"
FOLDED = ["expected_pg18-query2.folded", "expected_pg18-query3.folded",
          "expected_clockloop.folded"]
BINARY = "/opt/pg/vanilla/bin/postgres"
RECORDED_BINARY = "/tmp/h5/pginst/bin/postgres"  # where pg18-query*.perf-script ran


def _need(path: Path, what: str) -> Path:
    if not path.exists():
        pytest.fail(f"{what} is not installed ({path} missing): run `make js` "
                    "(npm ci in tests/js)")
    return path


def pprof_read(path: Path) -> dict:
    """The file as the npm pprof-format package decodes it."""
    _need(JS / "node_modules" / "pprof-format", "the npm package pprof-format")
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: run scripts/setup-system.sh")
    cp = subprocess.run([node, str(JS / "pprof-read.mjs"), str(path)], capture_output=True,
                        text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return json.loads(cp.stdout)


def ints(counts: dict[str, float]) -> dict[str, int]:
    return {k: int(v) for k, v in counts.items()}


# --------------------------------------------------------------------------- protobuf


def test_varints_and_fields_are_protobufs_wire_format() -> None:
    # the examples of protobuf's "Encoding" documentation
    assert varint(1) == b"\x01"
    assert varint(150) == b"\x96\x01"
    assert varint(0) == b"\x00"
    assert varint(-1) == b"\xff" * 9 + b"\x01"          # int64 -1: ten bytes
    assert varint((1 << 63) - 1) == b"\xff" * 8 + b"\x7f"
    assert Message().int_(1, 150).bytes() == b"\x08\x96\x01"
    assert Message().string(2, "testing").bytes() == b"\x12\x07testing"
    assert Message().packed(4, [3, 270, 86942]).bytes() == bytes.fromhex("2206038e029ea705")
    # proto3: zero scalars are not written; repeated strings keep their empty elements
    assert Message().int_(1, 0).string(2, "").bytes() == b""
    assert Message().repeated_string(6, ["", "a"]).bytes() == b"\x32\x00\x32\x01a"
    with pytest.raises(ValueError):
        varint(1 << 64)


# --------------------------------------------------------------------------- pprof


def _table(name: str, build: str, mode: str) -> tuple[pd.DataFrame, dict[str, float]]:
    counts = read_folded(PERF / name)
    df = stacks_table(counts, run_id="r1", build=build, tool="perf")
    df["mode"] = mode
    return df, counts


@pytest.mark.parametrize("name", FOLDED)
def test_pprof_format_reads_every_stack_with_its_value(name: str, tmp_path: Path) -> None:
    df, counts = _table(name, "vanilla", "analyze_timing")
    facts = ProfileFacts(freq_hz=999, binary=BINARY, started_ns=1_764_547_200_000_000_000,
                         duration_ns=615_000_000)
    path = tmp_path / "p.pb.gz"
    path.write_bytes(export_stacks(df, "pprof", facts))
    assert path.read_bytes()[:2] == b"\x1f\x8b"  # gzipped, as the spec asks
    d = pprof_read(path)
    assert d["stringTable0"] == ""
    assert d["sampleType"] == [["samples", "count"], ["cpu", "nanoseconds"]]
    assert d["periodType"] == ["cpu", "nanoseconds"] and d["period"] == 1_001_001
    assert d["defaultSampleType"] == "cpu"
    assert d["timeNanos"] == "1764547200000000000" and d["durationNanos"] == "615000000"
    assert "cpu nanoseconds = samples x 1001001 ns (sampled at 999 Hz)" in d["comments"]
    # every stack, with its value: one sample per (stack, plan node), summed per stack
    got: dict[str, int] = {}
    for s in d["samples"]:
        assert s["values"][1] == s["values"][0] * 1_001_001
        got[s["stack"]] = got.get(s["stack"], 0) + s["values"][0]
        assert s["labels"]["build"] == "vanilla" and s["labels"]["mode"] == "analyze_timing"
        assert s["labels"]["tool"] == "perf" and s["labels"]["run"] == "r1"
        assert s["labels"].get("plan_node", "") == plan_node_of(s["stack"].split(";"))
    assert got == ints(counts)
    assert sum(got.values()) == sum(counts.values())
    # modules: the binary is mapping 1; the comm root frame has none, nor has perf's
    # "[unknown]" (no module known); a "[postgres]" frame (perf's unnamed frame in that
    # module) maps to the binary named postgres; the rest, unnamed, to the binary
    assert d["mappings"][0] == {"id": 1, "file": BINARY, "hasFunctions": True}
    for s in d["samples"]:
        frames = s["stack"].split(";")
        assert s["modules"][0] == ""
        assert s["modules"][1:] == ["" if f == "[unknown]" else BINARY for f in frames[1:]]


def test_pprof_plan_nodes_of_query2() -> None:
    """Query-2's plan (Aggregate over a Nested Loop of a Seq Scan and a Materialize of
    a Merge Join): samples are labelled with the node running, from the executor frames
    in each stack; planning and start-up samples have none."""
    counts = read_folded(PERF / "expected_pg18-query2.folded")
    by_node: dict[str, float] = {}
    for stack, w in counts.items():
        node = plan_node_of(stack.split(";"))
        by_node[node] = by_node.get(node, 0) + w
    assert set(by_node) == {"Aggregate", "Nested Loop", "Materialize", "Seq Scan",
                            "Merge Join", ""}
    assert sum(by_node.values()) == 201
    assert plan_node_of(["ExecAgg", "fetch_input_tuple", "ExecProcNodeInstr",
                         "ExecNestLoop", "ExecProcNodeInstr", "ExecMaterial",
                         "tuplestore_gettuple"]) == "Materialize"
    assert plan_node_of(["main", "PostgresMain", "exec_simple_query"]) == ""
    assert plan_node_of(["ExecHashJoin.isra.0"]) == "Hash Join"


def test_pprof_keeps_an_explicit_plan_node_column(tmp_path: Path) -> None:
    df = pd.DataFrame({"stack": ["postgres;main;ExecAgg", "postgres;main;ExecAgg"],
                       "weight": [3.0, 4.0], "build": ["b", "b"], "tool": ["perf", "perf"],
                       "unit": ["samples", "samples"], "plan_node": ["1 Aggregate", "7 Agg"]})
    path = tmp_path / "n.pb.gz"
    path.write_bytes(export_stacks(df, "pprof"))
    d = pprof_read(path)
    assert sorted((s["labels"]["plan_node"], s["values"][0]) for s in d["samples"]) == [
        ("1 Aggregate", 3), ("7 Agg", 4)]
    assert d["sampleType"] == [["samples", "count"]] and d["periodType"] is None


def test_pprof_of_two_builds_labels_each(tmp_path: Path) -> None:
    a, ca = _table("expected_pg18-query2.folded", "vanilla", "analyze_notiming")
    b, cb = _table("expected_pg18-query3.folded", "step3", "analyze_timing")
    path = tmp_path / "two.pb.gz"
    path.write_bytes(export_stacks(pd.concat([a, b], ignore_index=True), "pprof",
                                   ProfileFacts(freq_hz=999)))
    d = pprof_read(path)
    per: dict[tuple[str, str], dict[str, int]] = {}
    for s in d["samples"]:
        key = (s["labels"]["build"], s["labels"]["mode"])
        per.setdefault(key, {})
        per[key][s["stack"]] = per[key].get(s["stack"], 0) + s["values"][0]
    assert per == {("vanilla", "analyze_notiming"): ints(ca),
                   ("step3", "analyze_timing"): ints(cb)}
    # functions are shared between the builds: one Function per distinct frame
    frames = {f for c in (ca, cb) for st in c for f in st.split(";")}
    assert sorted(f["name"] for f in d["functions"]) == sorted(frames)


def test_pprof_units_instructions_and_annotations(tmp_path: Path) -> None:
    counts = {"postgres;main;ExecAgg;int8inc": 448_488_224, "postgres;main;do_syscall_64_[k]": 7,
              "python;run (client.py:12)": 2}
    path = tmp_path / "i.pb.gz"
    path.write_bytes(export_stacks(counts, "pprof", ProfileFacts(unit="instructions",
                                                                  tool="callgrind")))
    d = pprof_read(path)
    assert d["sampleType"] == [["instructions", "count"]]
    by = {s["stack"]: s for s in d["samples"]}
    assert by["postgres;main;ExecAgg;int8inc"]["values"] == [448_488_224]
    assert by["postgres;main;do_syscall_64_[k]"]["modules"][-1] == "[kernel.kallsyms]"
    fn = {f["name"]: f for f in d["functions"]}
    assert fn["do_syscall_64_[k]"]["systemName"] == "do_syscall_64"
    assert fn["run (client.py:12)"]["systemName"] == "run"
    assert fn["run (client.py:12)"]["file"] == "client.py"


def test_pprof_refuses_what_it_cannot_hold() -> None:
    with pytest.raises(ExportError, match="integer values.*speedscope"):
        export_stacks({"a;b": 1.5}, "pprof")
    a = StackProfile(ProfileFacts(unit="samples", build="x"), {("a;b", ""): 1})
    b = StackProfile(ProfileFacts(unit="instructions", build="y"), {("a;b", ""): 1})
    with pytest.raises(ExportError, match="one kind of value"):
        export_stacks([a, b], "pprof")
    with pytest.raises(ExportError, match="unknown export format 'svg'"):
        export_stacks({"a": 1}, "svg")
    with pytest.raises(ExportError, match="collapsed stacks hold one profile"):
        export_stacks([a, b], "collapsed")


# --------------------------------------------------------------------------- a run


@pytest.fixture(scope="module")
def perf_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict]]:
    """A real perf run directory: Query-2's recorded `perf script` text folded by
    profkit's collector (no PostgreSQL needed: the text is the fixture)."""
    from profkit.collect.perf import SCRIPT_TXT, fold_run
    from profkit.rundir import new_run

    base = tmp_path_factory.mktemp("profiles")
    rd = new_run("perf", workload="nested_loop", mode="analyze_notiming", base=base,
                 build_name="vanilla",
                 # the binary the capture's postgres frames name (perf script's module)
                 perf={"freq": 999, "call_graph": "fp", "binary": RECORDED_BINARY},
                 recording_seconds=0.25, started_at="2026-11-30T12:00:00+00:00")
    shutil.copyfile(PERF / "pg18-query2.perf-script.txt.gz", rd.file(SCRIPT_TXT + ".gz"))
    prof = fold_run(rd, check=False)
    yield rd.path, dict(prof.folding.modules)


def test_pprof_of_a_run_directory(perf_run: tuple[Path, dict], tmp_path: Path) -> None:
    run_dir, modules = perf_run
    path = tmp_path / "run.pb.gz"
    path.write_bytes(export_run(run_dir, "pprof"))
    d = pprof_read(path)
    counts = read_folded(run_dir / "stacks.folded")
    got: dict[str, int] = {}
    for s in d["samples"]:
        got[s["stack"]] = got.get(s["stack"], 0) + s["values"][0]
        assert {k: s["labels"][k] for k in ("build", "mode", "tool")} == {
            "build": "vanilla", "mode": "analyze_notiming", "tool": "perf"}
        # each frame's mapping is the module perf printed for it
        for frame, module in zip(s["stack"].split(";")[1:], s["modules"][1:], strict=True):
            assert module == modules[frame], (frame, module)
    assert got == ints(counts) and sum(got.values()) == 201
    # one mapping per module perf printed, the build's binary first
    assert [m["file"] for m in d["mappings"]][0] == RECORDED_BINARY
    assert {m["file"] for m in d["mappings"]} == {
        RECORDED_BINARY, "/usr/lib/x86_64-linux-gnu/libc.so.6", "[kernel.kallsyms]"}
    assert set(modules.values()) == {m["file"] for m in d["mappings"]}
    assert d["timeNanos"] == str(1_796_040_000 * 10**9)  # 2026-11-30T12:00:00Z
    assert d["durationNanos"] == str(250_000_000)
    assert d["period"] == 1_001_001
    assert any(c.startswith(f"profkit run {run_dir.name}: nested_loop") for c in d["comments"])
    # collapsed: the run's own stacks.folded, byte for byte
    assert export_run(run_dir, "collapsed") == (run_dir / "stacks.folded").read_bytes()


def test_a_run_without_stacks_is_refused(tmp_path: Path) -> None:
    from profkit.rundir import new_run

    rd = new_run("bench", base=tmp_path)
    with pytest.raises(ExportError, match="holds no stacks.*perf or py-spy run"):
        export_run(rd.path, "pprof")
    with pytest.raises(ExportError, match="no such file or run"):
        export_run(tmp_path / "nothing-here", "pprof")


# --------------------------------------------------------------------------- collapsed


@pytest.mark.parametrize("name", FOLDED)
def test_collapsed_is_the_folded_file_byte_for_byte(name: str) -> None:
    data = (PERF / name).read_bytes()
    assert export_run(PERF / name, "collapsed") == data
    assert export_stacks(read_folded(PERF / name), "collapsed") == data
    df, _ = _table(name, "vanilla", "plain")
    assert export_stacks(df, "collapsed") == data


# --------------------------------------------------------------------------- empty


def test_empty_input_for_every_exporter(tmp_path: Path) -> None:
    empty = tmp_path / "empty.folded"
    empty.write_bytes(b"")
    assert export_run(empty, "collapsed") == b""
    assert export_stacks(stacks_table({}), "collapsed") == b""
    path = tmp_path / "empty.pb.gz"
    path.write_bytes(export_run(empty, "pprof", freq_hz=999))
    d = pprof_read(path)
    assert d["samples"] == [] and d["functions"] == [] and d["mappings"] == []
    assert d["sampleType"] == [["samples", "count"], ["cpu", "nanoseconds"]]
    doc = json.loads(export_run(empty, "speedscope"))
    assert doc["shared"]["frames"] == []
    (prof,) = doc["profiles"]
    assert prof["samples"] == [] and prof["weights"] == [] and prof["endValue"] == 0
    assert json.loads(export_stacks(stacks_table({}), "speedscope"))["profiles"][0][
        "samples"] == []


# --------------------------------------------------------------------------- speedscope


def _stacks_of(doc: dict, i: int = 0) -> dict[str, float]:
    names = [f["name"] for f in doc["shared"]["frames"]]
    p = doc["profiles"][i]
    out: dict[str, float] = {}
    for sample, w in zip(p["samples"], p["weights"], strict=True):
        k = ";".join(names[j] for j in sample)
        out[k] = out.get(k, 0) + w
    return out


@pytest.mark.parametrize("name", FOLDED)
def test_speedscope_file_holds_every_stack(name: str) -> None:
    counts = read_folded(PERF / name)
    doc = json.loads(export_run(PERF / name, "speedscope"))
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    (p,) = doc["profiles"]
    assert p["type"] == "sampled" and p["unit"] == "none" and p["startValue"] == 0
    assert p["endValue"] == sum(counts.values())
    assert _stacks_of(doc) == counts
    names = [f["name"] for f in doc["shared"]["frames"]]
    assert len(names) == len(set(names))


def test_speedscope_one_profile_per_build_with_shared_frames() -> None:
    a, ca = _table("expected_pg18-query2.folded", "vanilla", "analyze_notiming")
    b, cb = _table("expected_pg18-query3.folded", "step3", "analyze_timing")
    doc = json.loads(export_stacks(pd.concat([a, b], ignore_index=True), "speedscope"))
    assert [p["name"] for p in doc["profiles"]] == ["vanilla analyze_notiming (perf)",
                                                    "step3 analyze_timing (perf)"]
    assert _stacks_of(doc, 0) == ca and _stacks_of(doc, 1) == cb
    frames = {f for c in (ca, cb) for st in c for f in st.split(";")}
    assert sorted(f["name"] for f in doc["shared"]["frames"]) == sorted(frames)


class _Files(SimpleHTTPRequestHandler):
    """/viewer/... → speedscope's built app (from npm); /data/... → the exports."""

    viewer: Path
    data: Path

    def translate_path(self, path: str) -> str:
        p = path.split("?", 1)[0].split("#", 1)[0]
        if p.startswith("/data/"):
            return str(self.data / p.removeprefix("/data/"))
        return str(self.viewer / p.removeprefix("/viewer/"))

    def log_message(self, *args: object) -> None:
        pass


class _Chromium:
    """Headless Chromium over the DevTools protocol (websocket-client), stopped by pid."""

    def __init__(self, profile: Path) -> None:
        import websocket

        from profkit.processes import Background

        exe = shutil.which("chromium") or "/usr/bin/chromium"
        if not os.path.exists(exe):
            pytest.fail("chromium is not installed: run scripts/setup-system.sh")
        self.bg = Background(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--hide-scrollbars",
             f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "--remote-allow-origins=*", "--window-size=1400,900", "about:blank"],
            stop_signal=signal.SIGTERM, stop_timeout=10, what="chromium")
        self.profile = profile
        self.bg.start()
        try:
            port_file = profile / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().strip()):
                if time.monotonic() > deadline or not self.bg.alive():
                    raise RuntimeError("chromium did not open its DevTools port")
                time.sleep(0.1)
            port = int(port_file.read_text().split()[0])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                page = next(t for t in json.load(r) if t["type"] == "page")
            self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60,
                                                  suppress_origin=True)
        except BaseException:
            self.bg.stop()
            remove_chromium_singleton(self.profile)
            raise
        self._id = 0

    def call(self, method: str, **params: object) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expr: str) -> object:
        res = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"JS error in {expr!r}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expr: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not self.eval(expr):
            if time.monotonic() > deadline:
                raise AssertionError(f"the page never satisfied {expr}; it shows: "
                                     f"{str(self.eval('document.body.innerText'))[:500]!r}")
            time.sleep(0.1)

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


_ROW = re.compile(r"^(\d+) \([^)]*\)\n\t(\d+) \([^)]*\)\n\t(.+)$", re.M)


def _not_blank(png: Path) -> int:
    from PIL import Image

    img = Image.open(png).convert("RGB").resize((350, 225))
    colours = img.getcolors(maxcolors=350 * 225)
    assert colours is not None
    return len(colours)


def open_in_speedscope(export: bytes, label: str, title: str, tmp_path: Path
                       ) -> dict[str, tuple[int, int]]:
    """Serve speedscope's built app (npm package speedscope) and *export* on 127.0.0.1,
    open the file by ``#profileURL=`` in headless Chromium, wait for the toolbar to show
    *title* (the profile's name), screenshot the flamegraph
    and the Sandwich view (tests/artifacts/speedscope-LABEL-*.png), and return the
    Sandwich table as speedscope computed it: function → (total, self)."""
    viewer = _need(JS / "node_modules" / "speedscope" / "dist" / "release",
                   "the npm package speedscope")
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / f"{label}.speedscope.json").write_bytes(export)
    handler = type("Files", (_Files,), {"viewer": viewer, "data": data})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    browser = None
    try:
        port = server.server_address[1]
        browser = _Chromium(tmp_path / f"chromium-{label}")
        browser.call("Page.enable")
        url = (f"http://127.0.0.1:{port}/viewer/index.html#profileURL="
               f"http://127.0.0.1:{port}/data/{label}.speedscope.json")
        browser.call("Page.navigate", url=url)
        # the toolbar names the loaded file, and the flamegraph canvas is there
        browser.wait_for(f"document.body && document.body.innerText.includes({title!r})")
        browser.wait_for("document.querySelectorAll('canvas').length > 0")
        time.sleep(1.0)  # the first frames are drawn after the load event
        shot = browser.screenshot(ARTIFACTS / f"speedscope-{label}-time-order.png")
        assert _not_blank(shot) > 50
        # the Sandwich view: a DOM table, one row per function: total, self, name
        clicked = browser.eval("""(() => {
            const tab = [...document.querySelectorAll('div')].find(
                e => e.children.length <= 2 && (e.innerText || '').trim().endsWith('Sandwich'));
            if (!tab) return false; tab.click(); return true; })()""")
        assert clicked, "no Sandwich tab in speedscope's toolbar"
        browser.wait_for("document.body.innerText.includes('Symbol Name')")
        time.sleep(0.5)
        text = str(browser.eval("document.body.innerText"))
        browser.screenshot(ARTIFACTS / f"speedscope-{label}-sandwich.png")
    finally:
        if browser is not None:
            browser.close()
        server.shutdown()
        server.server_close()
    rows = {m[3]: (int(m[1]), int(m[2])) for m in _ROW.finditer(text)}
    assert rows, text[:2000]
    return rows


def check_sandwich(rows: dict[str, tuple[int, int]], counts: dict[str, float]) -> None:
    """Every row speedscope shows has the total and self profkit counts from the folded
    input (total once per stack, as both count it), and the top self functions are there."""
    fn = functions_table(counts, root_is_process=False)
    want = {f: (int(t), int(s)) for f, t, s in zip(fn["function"], fn["total"], fn["self"],
                                                   strict=True)}
    for f, got in rows.items():
        assert want[f] == got, (f, got, want[f])
    assert set(fn["function"][:10]) <= set(rows)


@pytest.mark.browser
def test_speedscope_viewer_opens_the_export(tmp_path: Path) -> None:
    """speedscope's own app loads the file, draws it, and its Sandwich table — computed
    by speedscope from the file — gives every function's total and self samples as
    profkit counts them from the folded input."""
    name = "expected_pg18-query3.folded"
    counts = read_folded(PERF / name)
    rows = open_in_speedscope(export_run(PERF / name, "speedscope"), "query3", name, tmp_path)
    assert len(rows) >= 30
    check_sandwich(rows, counts)
    # Query-3 (TIMING on): the vDSO clock read is the function with the most self samples
    assert rows["__vdso_clock_gettime"] == (441, 437)


# --------------------------------------------------------------------------- a live run


@pytest.mark.pg
@pytest.mark.browser
def test_exports_of_a_live_perf_run(pg_cluster, _nested_loop_loaded, tmp_path: Path) -> None:
    """Query-2 recorded by perf on the vanilla build now (the collector `make demo`'s
    flamegraphs use), exported as pprof and speedscope and read by both readers."""
    from profkit.collect import perf
    from profkit.pg.workloads import get_workload
    from profkit.rundir import open_run

    sql = get_workload("nested_loop").query("analyze_notiming")
    with pg_cluster.connect() as conn:
        perf.run_query(conn, sql)  # warm-up, not recorded
        with open_run("perf", build=pg_cluster.build, workload="nested_loop",
                      mode="analyze_notiming", base=tmp_path / "profiles",
                      tools=("gcc",)) as rd:
            rec, _res = perf.record_query(pg_cluster, conn, sql, run=rd, reps=3,
                                          scale=_nested_loop_loaded, query_name="Query-2")
    prof = perf.fold_run(rec.run_dir)
    run_dir = Path(rec.run_dir)
    counts = read_folded(run_dir / "stacks.folded")
    assert sum(counts.values()) == prof.folding.samples > 0
    path = tmp_path / "live.pb.gz"
    path.write_bytes(export_run(run_dir, "pprof"))
    d = pprof_read(path)
    got: dict[str, int] = {}
    nodes: set[str] = set()
    for s in d["samples"]:
        got[s["stack"]] = got.get(s["stack"], 0) + s["values"][0]
        assert s["values"][1] == s["values"][0] * 1_001_001
        assert {k: s["labels"][k] for k in ("build", "mode", "tool")} == {
            "build": "vanilla", "mode": "analyze_notiming", "tool": "perf"}
        nodes.add(s["labels"].get("plan_node", ""))
    assert got == ints(counts)
    assert "Nested Loop" in nodes or "Aggregate" in nodes, nodes
    postgres = str(pg_cluster.build.postgres)
    assert d["mappings"][0]["file"] == postgres
    assert d["durationNanos"] == str(round(float(
        json.loads((run_dir / "provenance.json").read_text())["recording_seconds"]) * 1e9))
    # speedscope's toolbar names the profile: build, mode, tool
    rows = open_in_speedscope(export_run(run_dir, "speedscope"), "live-query2",
                              "vanilla analyze_notiming (perf)", tmp_path)
    check_sandwich(rows, counts)


# --------------------------------------------------------------------------- magic


def test_profkit_export_line_magic(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   perf_run: tuple[Path, dict]) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "profkit")
    run_dir, _ = perf_run
    out = tmp_path / "m.pb.gz"
    assert ip.run_line_magic("profkit_export", f"{run_dir} --format pprof -o {out}") == out
    assert out.read_bytes() == export_run(run_dir, "pprof")
    assert f"wrote {out}" in capsys.readouterr().out
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        got = ip.run_line_magic("profkit_export",
                                f"{PERF / 'expected_clockloop.folded'} -f collapsed")
    finally:
        os.chdir(cwd)
    assert got == Path("expected_clockloop.folded")
    assert (tmp_path / got).read_bytes() == (PERF / "expected_clockloop.folded").read_bytes()
    # errors: one line, the kernel lives on
    assert ip.run_line_magic("profkit_export", f"{tmp_path / 'none'} -f pprof") is None
    assert "no such file or run" in capsys.readouterr().err
    empty = tmp_path / "empty.folded"
    empty.write_bytes(b"")
    assert ip.run_line_magic("profkit_export", f"{empty} -f pprof -o {out}") is None
    assert f"{empty}: no stack counts found" in capsys.readouterr().err
    assert out.read_bytes() == export_run(run_dir, "pprof")  # the earlier export stays
    assert ip.run_line_magic("profkit_export", f"{run_dir} -f svg") is None
    assert "invalid choice: 'svg'" in capsys.readouterr().err
    assert ip.run_line_magic("profkit_export", "--help") is None
    assert "pprof" in capsys.readouterr().out


def test_perf_script_text_is_folded_as_profkit_collectors_do(tmp_path: Path) -> None:
    """A `perf script` text (here the Query-2 capture) exports like its run: one per
    sample, each frame in the module perf printed."""
    from profkit.parse.perf_script import fold_perf_script

    text = PERF / "pg18-query2.perf-script.txt.gz"
    fold = fold_perf_script(text, weight="samples", vdso_names=True)
    path = tmp_path / "t.pb.gz"
    path.write_bytes(export_run(text, "pprof", freq_hz=999))
    d = pprof_read(path)
    got: dict[str, int] = {}
    for s in d["samples"]:
        got[s["stack"]] = got.get(s["stack"], 0) + s["values"][0]
        assert s["labels"]["tool"] == "perf"
        for frame, module in zip(s["stack"].split(";")[1:], s["modules"][1:], strict=True):
            assert module == fold.modules[frame]
    assert got == ints(fold.counts) and sum(got.values()) == 201
    assert export_run(text, "collapsed") == (PERF / "expected_pg18-query2.folded").read_bytes()


def test_several_runs_make_one_file(perf_run: tuple[Path, dict], tmp_path: Path) -> None:
    run_dir, _ = perf_run
    q3 = PERF / "expected_pg18-query3.folded"
    path = tmp_path / "two.pb.gz"
    path.write_bytes(export_run([run_dir, q3], "pprof", freq_hz=999))
    d = pprof_read(path)
    per: dict[str, dict[str, int]] = {}
    for s in d["samples"]:
        got = per.setdefault(s["labels"]["run"], {})
        got[s["stack"]] = got.get(s["stack"], 0) + s["values"][0]
    assert per == {run_dir.name: ints(read_folded(run_dir / "stacks.folded")),
                   q3.name: ints(read_folded(q3))}
    doc = json.loads(export_run([run_dir, q3], "speedscope"))
    assert [p["name"] for p in doc["profiles"]] == ["vanilla analyze_notiming (perf)", q3.name]
    assert _stacks_of(doc, 1) == read_folded(q3)
    with pytest.raises(ExportError, match="collapsed stacks hold one profile"):
        export_run([run_dir, q3], "collapsed")


def test_times_from_provenance() -> None:
    from profkit.export.source import _ns

    # pk-record.sh writes UTC with Z; profkit's own runs, local time with an offset
    assert _ns("2026-11-30T12:00:00Z") == 1_796_040_000 * 10**9
    assert _ns("2026-11-30T13:00:00.250000+01:00") == 1_796_040_000 * 10**9 + 250_000_000
    assert _ns("2026-11-30T12:00:00") is None   # no offset: not an instant
    assert _ns("") is None and _ns(None) is None and _ns("yesterday") is None


def test_latest_is_the_newest_run_with_stacks(perf_run: tuple[Path, dict]) -> None:
    from profkit.export.source import load_source
    from profkit.rundir import new_run, update_latest

    run_dir, _ = perf_run
    base = run_dir.parent
    bench = new_run("bench", base=base, run_id="29991231-235959-bench")  # newer, no stacks
    update_latest(bench.path)
    src = load_source("latest", root=base)
    assert src.origin == str(run_dir) and src.facts.build == "vanilla"
    with pytest.raises(ExportError, match="no run with stacks under"):
        load_source("latest", root=bench.path)
