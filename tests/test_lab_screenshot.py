"""JupyterLab serves the project's notebooks: start it the way `make lab` does (loopback,
no browser, a token), open a notebook page in headless Chromium, screenshot it, and
check the picture is a rendered page, not a blank or an error page.

The screenshot stays in tests/artifacts/lab-01_overhead.png (git-ignored) for a human
to look at.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from proc_helpers import remove_chromium_singleton

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts"
NOTEBOOK = "notebooks/01_overhead.ipynb"

pytestmark = pytest.mark.browser


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    pytest.fail("chromium is not installed: run scripts/setup-system.sh (package chromium)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"jupyter lab exited early with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.5)
    raise AssertionError(f"jupyter lab did not answer {url} within {timeout} s ({last})")


def stop(proc: subprocess.Popen) -> None:
    """Stop the server by pid (SIGINT twice is Jupyter's 'shut down now'), escalating."""
    if proc.poll() is not None:
        return
    for sig, t in ((signal.SIGINT, 0.5), (signal.SIGINT, 10), (signal.SIGTERM, 10)):
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(t)
            return
        except subprocess.TimeoutExpired:
            continue
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


@pytest.fixture
def lab(tmp_path):
    port, token = free_port(), secrets.token_hex(16)
    jupyter = Path(sys.executable).with_name("jupyter")
    argv = [str(jupyter), "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            f"--ServerApp.root_dir={ROOT}", f"--IdentityProvider.token={token}",
            "--ServerApp.open_browser=False", "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    log = (tmp_path / "lab.log").open("wb")
    # a private settings directory: no "fetch Jupyter news?" pop-up over the notebook,
    # and nothing written to the user's own JupyterLab settings
    settings = tmp_path / "lab-settings"
    news = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text('{"fetchNews": "false"}\n')
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "lab-workspaces")}
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/api/status?token={token}", proc)
        yield port, token, tmp_path / "lab.log"
    finally:
        stop(proc)
        log.close()
    assert proc.returncode is not None


def screenshot(url: str, png: Path, profile_dir: Path) -> subprocess.CompletedProcess:
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile_dir}",
            "--window-size=1400,900", "--virtual-time-budget=20000", f"--screenshot={png}",
            url]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        remove_chromium_singleton(profile_dir)


def test_lab_renders_a_notebook(lab, tmp_path):
    from PIL import Image

    port, token, log_path = lab
    # the server answers with the notebook's content over its REST API
    with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/contents/{NOTEBOOK}?token={token}", timeout=30) as r:
        assert r.status == 200 and b"Overhead" in r.read()
    # and without the token it refuses (loopback or not, the token is required)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/{NOTEBOOK}", timeout=30)
    assert e.value.code in (401, 403)

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    png = ARTIFACTS / "lab-01_overhead.png"
    png.unlink(missing_ok=True)
    url = f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK}?token={token}&reset"
    cp = screenshot(url, png, tmp_path / "chromium-profile")
    assert png.exists(), f"no screenshot; chromium said:\n{cp.stderr[-2000:]}"

    img = Image.open(png).convert("RGB")
    assert img.size == (1400, 900)
    small = img.resize((350, 225))
    colours = small.getcolors(maxcolors=350 * 225)
    assert colours is not None
    # a blank or error page has a handful of colours; JupyterLab's UI with a notebook's
    # cells (icons, syntax highlighting, anti-aliased text) has hundreds
    assert len(colours) > 50, len(colours)
    dominant = max(c for c, _ in colours) / (350 * 225)
    assert dominant < 0.95, dominant
    # JupyterLab opened the notebook: the server saw a kernel session or content request
    log = log_path.read_text(errors="replace")
    assert "01_overhead.ipynb" in log or "Kernel started" in log, log[-3000:]
