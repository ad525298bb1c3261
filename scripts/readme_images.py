"""Make the README's pictures from a `make demo` run: the overhead chart and a Query-2
flamegraph, as small PNGs under docs/img/.

- ``docs/img/overheads.png``: the run's chart (``overheads.svg``, written by
  profkit/render/bench_report.py beside report.md), rendered by headless Chromium;
- ``docs/img/query2-flamegraph.png``: ``flamegraphs/query2-vanilla.svg`` (the flamegraph
  `make demo` draws of vanilla's Query-2), rendered the same way, as it first appears;
- ``docs/img/SOURCE.md``: which run and which files they came from.

Both are quantised to a small palette so each stays a few tens of KB. The flamegraph must
be at least as new as the run's chart (`make demo` draws it after the benchmark), so the
two pictures come from one `make demo`.

Usage (after `make demo`, from the project root)::

    .venv/bin/python scripts/readme_images.py
    .venv/bin/python scripts/readme_images.py --run profiles/<run_id> \
        --flamegraph flamegraphs/query2-vanilla.svg
"""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--no-first-run", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--force-device-scale-factor=1"]
#: SVG lengths in these units, in CSS pixels (96 per inch).
_UNITS = {"": 1.0, "px": 1.0, "pt": 96 / 72, "in": 96.0, "cm": 96 / 2.54, "mm": 96 / 25.4}


class ImageError(Exception):
    """A picture cannot be made; the message says what to do."""


@dataclass(frozen=True)
class Picture:
    """One README picture: its source SVG, where the PNG goes, and its width on the page."""

    svg: Path
    png: Path
    width_px: int | None      # None: the SVG's own width
    colors: int


def svg_size(svg: Path) -> tuple[float, float]:
    """The SVG's width and height in CSS pixels (its root element's width/height, else
    its viewBox)."""
    text = svg.read_text(encoding="utf-8", errors="replace")
    start = text.find("<svg")
    if start < 0:
        raise ImageError(f"{svg}: not an SVG file (no <svg> element)")
    head = text[start:text.find(">", start) + 1]

    def attr(name: str) -> str | None:
        m = re.search(rf'\s{name}="([^"]+)"', head)
        return m.group(1) if m else None

    w, h = attr("width"), attr("height")
    size = []
    for v in (w, h):
        m = re.fullmatch(r"\s*([0-9.]+)\s*(px|pt|in|cm|mm|)\s*", v or "")
        size.append(float(m.group(1)) * _UNITS[m.group(2)] if m else None)
    if None in size:
        vb = attr("viewBox")
        if not vb:
            raise ImageError(f"{svg}: no width/height or viewBox on its <svg> element")
        _, _, vw, vh = (float(x) for x in vb.replace(",", " ").split())
        return vw, vh
    return size[0], size[1]  # type: ignore[return-value]


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
        if path:
            return path
    raise ImageError("headless Chromium not found: install it with scripts/setup-system.sh "
                     "(Debian package chromium)")


def screenshot(svg: Path, png: Path, width: int, height: int, work: Path) -> None:
    """Render *svg* scaled to *width* × *height* CSS pixels into *png* (headless Chromium,
    as an <img>: the SVG is drawn as it first appears, its scripts do not run)."""
    page = work / "page.html"
    shutil.copyfile(svg, work / "picture.svg")
    page.write_text('<!DOCTYPE html><html><head><style>html,body{margin:0;padding:0;'
                    'background:#fff;overflow:hidden}img{display:block}</style></head><body>'
                    f'<img src="picture.svg" width="{width}" height="{height}"></body></html>',
                    encoding="utf-8")
    argv = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={work / 'profile'}",
            f"--window-size={width},{height}", f"--screenshot={png}", page.as_uri()]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)      # Chromium and its helpers: our group only
        proc.wait()
        raise
    if proc.returncode != 0 or not png.exists():
        tail = out.decode(errors="replace").strip().splitlines()[-3:]
        raise ImageError(f"chromium could not render {svg} (exit {proc.returncode}): "
                         + " | ".join(tail))


def make_png(pic: Picture, work: Path) -> tuple[int, int, int]:
    """Render, quantise and write one picture; returns (width, height, bytes)."""
    from PIL import Image

    w, h = svg_size(pic.svg)
    width = pic.width_px or round(w)
    height = round(h * width / w)
    raw = work / "raw.png"
    screenshot(pic.svg, raw, width, height, work)
    with Image.open(raw) as im:
        rgb = im.convert("RGB").crop((0, 0, width, height))
    small = rgb.quantize(colors=pic.colors, method=Image.Quantize.MEDIANCUT,
                         dither=Image.Dither.NONE)
    pic.png.parent.mkdir(parents=True, exist_ok=True)
    small.save(pic.png, format="PNG", optimize=True)
    return width, height, pic.png.stat().st_size


def _provenance(run: Path) -> dict:
    try:
        return json.loads((run / "provenance.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def source_note(run: Path, chart: Path, flame: Path, sizes: dict[str, tuple[int, int, int]]) -> str:
    prov = _provenance(run)
    run_id = prov.get("run_id") or run.resolve().name
    cmd = prov.get("command_line")
    cmd_text = " ".join(cmd) if isinstance(cmd, list) else str(cmd or "?")
    subtitle = ""
    m = re.search(r"<metadata[^>]*>(.*?)</metadata>", flame.read_text(encoding="utf-8"), re.S)
    if m:
        try:
            facts = json.loads(html.unescape(m.group(1))).get("provenance") or {}
        except (ValueError, AttributeError):
            facts = {}
        subtitle = ", ".join(f"{k} {facts[k]}" for k in
                             ("build", "query", "scale", "samples", "run", "date") if k in facts)
    lines = ["# Where the README's pictures come from", "",
             "Written by `scripts/readme_images.py`; regenerate after `make demo` with",
             "`.venv/bin/python scripts/readme_images.py`.", "",
             f"- run: `{run_id}` (`{cmd_text}`)",
             f"- `overheads.png`: that run's `{chart.name}`",
             f"- `query2-flamegraph.png`: `{flame.name}`" + (f" ({subtitle})" if subtitle else ""),
             ""]
    for name, (w, h, n) in sizes.items():
        lines.append(f"- `{name}`: {w} × {h} px, {n:,} bytes")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=ROOT / "profiles" / "latest",
                    help="the make demo (profkit reproduce) run directory (default: profiles/latest)")
    ap.add_argument("--flamegraph", type=Path, default=None,
                    help="the Query-2 flamegraph SVG (default: flamegraphs/query2-vanilla.svg "
                         "beside the run's profiles/ folder)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where the PNGs go")
    ap.add_argument("--chart-width", type=int, default=760, help="chart width in pixels")
    a = ap.parse_args(argv)
    try:
        run = a.run
        chart = run / "overheads.svg"
        if not chart.is_file():
            raise ImageError(f"{chart} not found: run `make demo` (or `profkit reproduce`) first, "
                             "or pass --run DIR of a profkit reproduce run")
        flame = a.flamegraph or run.resolve().parent.parent / "flamegraphs" / "query2-vanilla.svg"
        if not flame.is_file():
            raise ImageError(f"{flame} not found: `make demo` draws it after the benchmark "
                             "(not with --no-flamegraphs); or pass --flamegraph FILE")
        if flame.stat().st_mtime < chart.stat().st_mtime:
            raise ImageError(f"{flame} is older than {chart}: they are not from the same "
                             "make demo; run it again, or pass the matching --flamegraph")
        pics = [Picture(chart, a.out / "overheads.png", a.chart_width, 48),
                Picture(flame, a.out / "query2-flamegraph.png", None, 64)]
        sizes = {}
        with tempfile.TemporaryDirectory(prefix="readme-images-") as tmp:
            for pic in pics:
                work = Path(tmp) / pic.png.stem
                work.mkdir()
                sizes[pic.png.name] = make_png(pic, work)
                w, h, n = sizes[pic.png.name]
                print(f"{pic.png}: {w} x {h} px, {n:,} bytes (from {pic.svg})")
        (a.out / "SOURCE.md").write_text(source_note(run, chart, flame, sizes), encoding="utf-8")
    except (ImageError, OSError) as e:
        print(f"readme_images: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
