"""The result objects front doors show: their console text and HTML, exactly."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from profkit.experiments.cell import CellResult
from profkit.experiments.probe_runs import ProbeRun
from profkit.experiments.profile import ProfileRun, top_functions
from profkit.experiments.reproduce import add_builds


def test_probe_run_console_is_lines_tables_notes_and_the_folder(tmp_path: Path) -> None:
    table = pd.DataFrame({"method": ["ltrace", "bcc"], "measured": [12, 14],
                          "per_second": [1.25, float("nan")]})
    run = ProbeRun("r1", tmp_path, [table], {"run_id": "r1"}, ["a note"], ["before"],
                   float_format=lambda v: f"{v:.1f}")
    assert run.console().splitlines() == [
        "before",
        "method  measured  per_second",
        "ltrace        12         1.2",
        "   bcc        14           -",
        "a note",
        f"written to {tmp_path}"]
    assert run._repr_html_().count("<table") == 1


def test_cell_result_shows_its_note_then_the_tables_before_the_main_one() -> None:
    counts = pd.DataFrame({"instructions": [1_000]})
    top = pd.DataFrame({"function": ["ExecProcNodeInstr"], "calls": [2009]})
    res = CellResult(top, "vanilla: 1,000 instructions", also=[counts])
    assert res.console().split("\n\n") == ["vanilla: 1,000 instructions",
                                           " instructions\n         1000",
                                           "         function  calls\nExecProcNodeInstr   2009"]
    html = res._repr_html_()
    assert html.index("1000") < html.index("ExecProcNodeInstr")


def test_profile_run_console_ends_with_the_artifacts_and_the_flamegraph(tmp_path: Path) -> None:
    functions = pd.DataFrame({"function": ["f", "g"], "module": ["m", "m"], "self": [3, 1],
                              "self_share": [0.75, 0.25], "total": [4, 1],
                              "total_share": [1.0, 0.25]})
    prof = SimpleNamespace(run=SimpleNamespace(path=tmp_path),
                           top=lambda n: functions.head(n))
    top = top_functions(prof, 1)
    assert top.to_dict("records") == [{"function": "f", "self": 3, "self_share": "75.0%",
                                       "total_share": "100.0%"}]
    run = ProfileRun(prof, tmp_path / "x.svg", ["run r: 4 samples"], [("top 1:", top)],
                     ["note: n"])
    assert run.console().splitlines() == [
        "run r: 4 samples", "top 1:",
        "function  self self_share total_share",
        "       f     3      75.0%      100.0%",
        "note: n", f"artifacts: {tmp_path}", f"flamegraph: {tmp_path / 'x.svg'}"]
    empty = ProfileRun(prof, None, tables=[("t:", functions.iloc[:0])])
    assert empty.console().splitlines() == ["t:", "(no rows)", f"artifacts: {tmp_path}"]


def test_reproduce_adds_the_pg19_builds_once() -> None:
    assert add_builds("vanilla,step3", "pg19/vanilla,step3") == "vanilla,step3,pg19/vanilla"
    assert add_builds("vanilla,", "pg19/vanilla") == "vanilla,pg19/vanilla"
