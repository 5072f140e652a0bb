"""A real browser on a real lesson: JupyterLab 4 on loopback serves a scratch copy of lessons/,
headless Chromium (Debian's /usr/bin/chromium, driven by playwright; playwright's own browsers
are never downloaded) opens lesson 01 and runs its first cells through the UI (click a cell,
Shift+Enter), then the sampling playground's cell; a slider is dragged with the mouse, and the
picture and the caption must change. No cell run may show an error. A screenshot is saved under
pytest's tmp_path and its path printed (see it with `pytest -s`).

Skipped, saying why, where Chromium or playwright is missing (`.ci/run` installs Chromium)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("MINILLM_CHROMIUM", "/usr/bin/chromium")
LESSON = "01_naive_generation.ipynb"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    # a real browser on a shared 2-core machine has real timing: one rerun before a failure counts
    pytest.mark.flaky(reruns=1, reruns_delay=2),
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"no Chromium at {CHROMIUM}: `apt-get install -y chromium` (.ci/run does it) "
                              "to run the real-browser test"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (`pip install playwright`, "
                                                              "the test extra; its browsers are not needed)")

pytest.importorskip("jupyterlab", reason="JupyterLab is not installed (the course extra)")

# JupyterLab settings for a quiet, predictable page: every cell in the DOM, no news or update toasts.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": '{"windowingMode": "none"}',
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        '{"fetchNews": "false", "checkForUpdates": false}',
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyter_lab(tmp_path):
    """JupyterLab on 127.0.0.1 over a scratch copy of lessons/; yields (base url, token).
    Stopped afterwards by its process id (SIGTERM; then its process group, kernel included)."""
    root = tmp_path / "lessons"
    shutil.copytree(REPO / "lessons", root)
    settings = tmp_path / "settings"
    for name, text in SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(text)
    port, token = free_port(), "minillm-browser-test"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               MPLBACKEND="module://matplotlib_inline.backend_inline")
    log = open(tmp_path / "jupyter.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
         f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
         "--ServerApp.terminals_enabled=False"] + (["--allow-root"] if os.geteuid() == 0 else []),  # CI runs as root
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start:\n{(tmp_path / 'jupyter.log').read_text()[-3000:]}")
                time.sleep(0.3)
        yield base, token
    finally:
        server.send_signal(signal.SIGTERM)                 # by its process id: it shuts its kernels down
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(server.pid, signal.SIGKILL)          # whatever it started and left (a kernel), if anything
        except ProcessLookupError:
            pass
        server.wait(timeout=5)
        log.close()


def code_cell(page, text: str):
    """The notebook's code cell whose source contains `text`."""
    return page.locator(".jp-Notebook .jp-CodeCell").filter(
        has=page.locator(".jp-InputArea-editor", has_text=text)).first


def run_cell(page, cell, timeout_s: float = 120) -> None:
    """Click into the cell's editor, press Shift+Enter, wait until its prompt shows a number."""
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    prompt = cell.locator(".jp-InputPrompt")
    deadline = time.monotonic() + timeout_s
    while not prompt.inner_text().strip().strip("[]:").isdigit():      # "[*]:" while it runs, "[3]:" when done
        assert time.monotonic() < deadline, f"cell did not finish in {timeout_s} s: {cell.inner_text()[:200]}"
        time.sleep(0.2)
    errors = cell.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    for i in range(errors.count()):
        text = errors.nth(i).inner_text()
        assert "Error" not in text and "Traceback" not in text, f"the cell printed an error:\n{text[-2000:]}"


def test_lesson01_playground_in_a_real_browser(jupyter_lab, tmp_path):
    base, token = jupyter_lab
    started = time.monotonic()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/lab/tree/{LESSON}?token={token}")
            # loaded: all its code cells are on the page, and its kernel has started and is idle
            n_code = sum(c.cell_type == "code" for c in nbformat.read(REPO / "lessons" / LESSON, as_version=4).cells)
            page.wait_for_function(f"document.querySelectorAll('.jp-Notebook .jp-CodeCell').length >= {n_code}",
                                   timeout=60_000)
            page.locator("#jp-main-statusbar").get_by_text("| Idle").wait_for(timeout=90_000)

            # The first cells, top to bottom, up to the one that loads the model (a Colab setup cell
            # before it, if the lesson has one, does nothing here); then the two the playground needs.
            cells = page.locator(".jp-Notebook .jp-CodeCell")
            sources = [cells.nth(i).locator(".jp-InputArea-editor").inner_text() for i in range(cells.count())]
            loads = next((i for i, text in enumerate(sources) if "load_model(" in text), None)
            assert loads is not None, f"no cell of {LESSON} loads the model; cells: {[t[:60] for t in sources]}"
            for i in range(loads + 1):
                run_cell(page, cells.nth(i))
            run_cell(page, code_cell(page, "chat = tokenizer.apply_chat_template"))
            widget_cell = code_cell(page, "SamplingPlayground(")
            run_cell(page, widget_cell)

            caption = widget_cell.locator(".widget-html-content").filter(has_text="kept").first
            caption.wait_for(timeout=30_000)
            picture = widget_cell.locator(".widget-image").first
            picture.wait_for(timeout=30_000)
            before_caption, before_src = caption.inner_text(), picture.get_attribute("src")
            before_png = picture.screenshot()

            top_k = widget_cell.locator(".widget-slider").filter(has_text="top-k").first
            track = top_k.locator(".noUi-target").bounding_box()
            handle = top_k.locator(".noUi-handle").bounding_box()
            page.mouse.move(handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2)
            page.mouse.down()
            page.mouse.move(track["x"] + track["width"] * 0.12, track["y"] + track["height"] / 2, steps=8)
            page.mouse.up()

            readout = top_k.locator(".widget-readout")
            deadline = time.monotonic() + 30
            while caption.inner_text() == before_caption:
                assert time.monotonic() < deadline, "moving the top-k slider did not redraw the caption"
                time.sleep(0.2)
            k = int(readout.inner_text())
            assert 1 <= k <= 8, f"the slider was dragged to about an eighth of 0-30, it reads {k}"
            assert f"{k} token" in caption.inner_text(), caption.inner_text()
            deadline = time.monotonic() + 30
            while picture.get_attribute("src") == before_src:
                assert time.monotonic() < deadline, "moving the top-k slider did not change the picture"
                time.sleep(0.2)
            picture.scroll_into_view_if_needed()
            time.sleep(0.5)
            assert picture.screenshot() != before_png

            errors = page.locator(".jp-Notebook .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            assert all("Traceback" not in errors.nth(i).inner_text() for i in range(errors.count()))
            shot = tmp_path / "lesson01_sampling_playground.png"
            widget_cell.scroll_into_view_if_needed()
            page.screenshot(path=str(shot))
            print(f"\nscreenshot: {shot}  (top-k dragged to {k}: {caption.inner_text()!r}; "
                  f"{time.monotonic() - started:.0f} s in the browser)")
        except BaseException:
            page.screenshot(path=str(tmp_path / "failure.png"))
            print(f"\nscreenshot of the failure: {tmp_path / 'failure.png'}")
            raise
        finally:
            browser.close()
