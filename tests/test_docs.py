"""The documentation: the README's front page, docs/*.md and what keeps them true.

- docs/cli.md is exactly what scripts/cli_reference.py generates from the click commands;
- every relative link of the README and docs/ reaches a file (and a heading there);
- the README shows the two set-up commands and its two pictures, small committed PNGs
  that scripts/readme_images.py makes from a `make demo` run (the script itself is run
  here on a chart and a flamegraph made from a fixture);
- no user-facing text names an internal issue number: a user has no such issue to read.

(tests/test_cli_commands.py checks that every command the README and docs/ show runs.)
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
IMG = DOCS / "img"
CLI_REFERENCE = ROOT / "scripts" / "cli_reference.py"
README_IMAGES = ROOT / "scripts" / "readme_images.py"
FIX = ROOT / "tests" / "fixtures"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


# --------------------------------------------------------------------- the CLI reference


def test_cli_reference_is_what_the_commands_say() -> None:
    cp = subprocess.run([sys.executable, str(CLI_REFERENCE), "--check", str(DOCS / "cli.md")],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, \
        cp.stderr + "\n(regenerate: .venv/bin/python scripts/cli_reference.py > docs/cli.md)"
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    # every command and every option of one of them is in it
    from profkit.cli import main

    for name in main.list_commands(None):  # type: ignore[arg-type]
        assert f"## `profkit {name}`" in text, name
    for opt in ("--builds", "--scale", "--reps", "--instr-scale", "--pg19", "--no-flamegraphs"):
        assert f"`{opt}`" in text.split("`profkit reproduce`\n", 1)[1].split("\n#", 1)[0], opt
    assert "usage: profkit-stackcollapse-perf" in text


def test_cli_reference_check_fails_when_the_page_drifts(tmp_path: Path) -> None:
    stale = tmp_path / "cli.md"
    stale.write_text((DOCS / "cli.md").read_text(encoding="utf-8").replace(
        "Interleaved repetitions per build and mode.", "Repetitions.", 1), encoding="utf-8")
    cp = subprocess.run([sys.executable, str(CLI_REFERENCE), "--check", str(stale)],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 1
    assert f"{stale} differs from the commands: run" in cp.stderr
    cp = subprocess.run([sys.executable, str(CLI_REFERENCE)], capture_output=True, text=True,
                        timeout=120, env={**os.environ, "COLUMNS": "37"})
    assert cp.stdout == (DOCS / "cli.md").read_text(encoding="utf-8"), "depends on the terminal"


# --------------------------------------------------------------------- links and front page


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def test_slug_is_githubs() -> None:
    assert slug("The arms, PostgreSQL 19, summary.csv and the vCPU") == \
        "the-arms-postgresql-19-summarycsv-and-the-vcpu"
    assert slug("`profkit parse perf-script`") == "profkit-parse-perf-script"
    assert slug("sampled_timing: what its estimate measured") == "sampled_timing-what-its-estimate-measured"


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_every_relative_link_reaches_its_file_and_heading() -> None:
    bad = []
    for page in pages():
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_readme_front_page_shows_before_it_tells() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", readme, flags=re.S)
    # the set-up is exactly the two commands, and they come first
    assert [ln.split("#")[0].strip() for ln in blocks[0].splitlines()] == ["make demo", "make test"]
    assert readme.index("make demo") < readme.index("![")
    # the two pictures, then the commands and notebooks, then the links to docs/
    shown = re.findall(r"!\[[^\]]+\]\((docs/img/[^)]+\.png)\)", readme)
    assert shown == ["docs/img/overheads.png", "docs/img/query2-flamegraph.png"]
    for page in ("commands", "cli", "benchmark", "variants", "flamegraphs", "notebooks",
                 "install", "testing", "layout"):
        assert f"(docs/{page}.md)" in readme, page
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        assert f"`{nb.stem}`" in readme, nb.stem
    assert len(readme.splitlines()) < 120, "the front page is a front page"


def test_readme_images_are_small_committed_pngs() -> None:
    from PIL import Image

    for name in ("overheads.png", "query2-flamegraph.png"):
        png = IMG / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert 2_000 < png.stat().st_size <= 120_000, (name, png.stat().st_size)
        with Image.open(png) as im:
            assert im.width >= 600 and im.height >= 200, (name, im.size)
            assert len(im.convert("RGB").getcolors(1 << 16) or []) >= 8, f"{name} is blank"
    source = (IMG / "SOURCE.md").read_text(encoding="utf-8")
    assert "- run: `" in source and "query2-vanilla.svg" in source


@pytest.mark.browser
def test_readme_images_script_renders_a_run(tmp_path: Path) -> None:
    """The script on a run made here: a chart from profkit's own plot_overheads and a
    flamegraph of a recorded fixture; then its refusal of a flamegraph older than the run."""
    from PIL import Image

    from profkit.render.bench_report import plot_overheads

    run = tmp_path / "profiles" / "20261201-000000-demo"
    flames = tmp_path / "flamegraphs"
    flames.mkdir(parents=True)
    import pandas as pd

    summary = pd.DataFrame([
        {"build": b, "mode": m, "n": 5, "median_ms": ms, "mean_ms": ms, "variance": 1.0,
         "overhead_pct": ov, "ci_low_pct": ov - 2, "ci_high_pct": ov + 2, "instr": 1e8,
         "instr_overhead_pct": ov / 2}
        for b, q2, q3 in (("vanilla", 30.0, 300.0), ("step3", 6.0, 250.0))
        for m, ms, ov in (("plain", 100.0, 0.0), ("analyze_notiming", 100 + q2, q2),
                          ("analyze_timing", 100 + q3, q3))])
    plot_overheads(summary, run / "overheads.png", run / "overheads.svg")
    (run / "provenance.json").write_text(json.dumps(
        {"run_id": run.name, "command_line": ["profkit", "reproduce", "--scale", "0.01"]}))
    svg = flames / "query2-vanilla.svg"
    subprocess.run([sys.executable, "-m", "profkit", "flamegraph",
                    str(FIX / "perf" / "clockloop.perf-stackcollapse.folded"), "-o", str(svg),
                    "--meta", "build=vanilla", "--meta", "run=20261201-000001-perf"],
                   check=True, capture_output=True, timeout=120)
    out = tmp_path / "img"
    cp = subprocess.run([sys.executable, str(README_IMAGES), "--run", str(run), "--out", str(out)],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    with Image.open(out / "overheads.png") as im:
        assert im.width == 760
        colours = {c for _, c in im.convert("RGB").getcolors(1 << 16)}
    assert len(colours) >= 8
    with Image.open(out / "query2-flamegraph.png") as im:
        assert im.size == (1200, 408)              # the SVG's own size
        rgb = im.convert("RGB")
        # the instrumentation frames (clock_gettime here) are drawn teal: G and B well above R
        teal = sum(n for n, (r, g, b) in rgb.getcolors(1 << 16) if g > r + 60 and b > r + 60)
        assert teal > 2_000, teal
    for name in ("overheads.png", "query2-flamegraph.png"):
        assert (out / name).stat().st_size < 120_000
    source = (out / "SOURCE.md").read_text()
    assert f"run: `{run.name}` (`profkit reproduce --scale 0.01`)" in source
    assert "build vanilla" in source and "run 20261201-000001-perf" in source
    # a flamegraph older than the run's chart is from another make demo: refused
    os.utime(svg, (1, 1))
    cp = subprocess.run([sys.executable, str(README_IMAGES), "--run", str(run), "--out", str(out)],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 1
    assert "is older than" in cp.stderr and "Traceback" not in cp.stderr
    cp = subprocess.run([sys.executable, str(README_IMAGES), "--run", str(tmp_path / "none")],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 1 and "run `make demo`" in cp.stderr


# --------------------------------------------------------------------- internal issue numbers

#: "issue 13", "Issue 3's", "(issue 14)", "issues 3 and 6", "issue #13", "#13" — not the
#: colours of an SVG ("#555", fill:#060) nor GNU patch's "Hunk #2".
# "issue" right after "-" or "/" is part of another project's file name
# (gprof2dot's tests/prof/issue29.prof, callgrind/googlecode-issue34.callgrind)
ISSUE_NUMBER = re.compile(r"(?<![-/])\bissues?\s*(?:no\.?\s*)?#?\s*\d+"
                          r"|(?<![\w&#\"':=/-])(?<!Hunk )#\d{1,4}\b", re.IGNORECASE)


def test_issue_number_pattern() -> None:
    for text in ("issue 13", "Issue 3's scales", "(issue 14)", "issues 3 and 6", "issue #13",
                 "see #13", "(#4)", "ISSUE13"):
        assert ISSUE_NUMBER.search(text), text
    for text in ('color="#555555"', "fill:#060", "Hunk #2 FAILED at 123.", "an issue with 3 nodes",
                 "issue-free", "&#8594;", "url#13", "callgrind/googlecode-issue34.callgrind",
                 "prof/issue29.prof"):
        assert not ISSUE_NUMBER.search(text), text


def user_facing_text() -> list[tuple[str, str]]:
    """(file, text) of everything a user reads: the README and docs/, the notebooks, profkit's
    code (its strings, help texts, report strings and comments), patch headers and what
    patches add, benchmarks, scripts and the project files. tests/ is not."""
    out = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in pages()]
    files = [*ROOT.glob("notebooks/*.py"), *ROOT.glob("notebooks/*.ipynb"),
             *(p for d in ("profkit", "benchmarks", "scripts") for p in (ROOT / d).rglob("*")
               if p.suffix in {".py", ".md", ".toml", ".c", ".h", ".sh", ".txt", ".pl", ".patch"}),
             *(ROOT / f for f in ("Makefile", "Vagrantfile", "environment.yml", "pyproject.toml"))]
    for p in sorted(set(files)):
        if "__pycache__" in p.parts or not p.is_file():
            continue
        text = p.read_text(encoding="utf-8", errors="replace")
        if p.suffix == ".patch":
            # profkit's words: the header above the first diff and the lines the patch adds
            # (the rest blanked, so line numbers stay the file's)
            lines = text.splitlines()
            first = next((i for i, ln in enumerate(lines) if ln.startswith(("diff ", "--- "))),
                         len(lines))
            text = "\n".join(ln if i < first or (ln.startswith("+") and not ln.startswith("+++"))
                             else "" for i, ln in enumerate(lines))
        out.append((str(p.relative_to(ROOT)), text))
    return out


def test_no_internal_issue_numbers_in_user_facing_text() -> None:
    texts = user_facing_text()
    assert len(texts) > 100 and any(f.startswith("profkit/patches/pg19/") for f, _ in texts)
    found = []
    for name, text in texts:
        for n, line in enumerate(text.splitlines(), 1):
            for m in ISSUE_NUMBER.finditer(line):
                found.append(f"{name}:{n}: {m.group(0)!r} in {line.strip()[:100]}")
    assert not found, ("say the target or the reason instead of an internal issue number:\n"
                       + "\n".join(found))
