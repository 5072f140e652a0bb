"""The README's first command, `make course`, run as the README says by the user running the
tests (root in CI, as in Docker images and cloud VMs): it must start JupyterLab (passing
--allow-root for root), print its URL with the token, and serve lessons/, which headless
Chromium (Debian's /usr/bin/chromium, driven by playwright, as in tests/test_browser.py) loads
at /lab, where lesson 00 is opened from the file browser and shows its title with a started
kernel. Then it is stopped as a container or a closed terminal stops it (SIGTERM to its process
group; Ctrl-C at a terminal asks JupyterLab to confirm first) and no process of it, its kernel
included, may be left.

Twice: with a display (DISPLAY set; $BROWSER, a script that leaves a mark, must be called) and
without one (DISPLAY unset, as on a server or in a container: no browser may be started). The
port comes from PORT in one run and JUPYTER_PORT in the other. Setup is not repeated: the test
runs only when scripts/setup.sh's stamp is current (`make test` has just run setup).

Skipped, saying why, where Chromium or playwright is missing (`.ci/run` installs Chromium)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("MINILLM_CHROMIUM", "/usr/bin/chromium")
LESSON = "00_setup_and_tour.ipynb"


def setup_is_current() -> bool:
    """scripts/setup.sh's own test: its stamp (pyproject.toml + setup.sh) matches the venv's."""
    stamp = hashlib.sha256((REPO / "pyproject.toml").read_bytes()
                           + (REPO / "scripts/setup.sh").read_bytes()).hexdigest()[:16]
    path = REPO / ".venv/.setup-stamp"
    return path.exists() and path.read_text().strip() == stamp


pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    # a real browser on a shared 2-core machine has real timing: one rerun before a failure counts
    pytest.mark.flaky(reruns=1, reruns_delay=2),
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"no Chromium at {CHROMIUM}: `apt-get install -y chromium` (.ci/run does it) "
                              "to run the real-browser test"),
    pytest.mark.skipif(not (REPO / ".venv/bin/jupyter").exists() or not setup_is_current(),
                       reason="setup is not current (no .venv/bin/jupyter, or .venv/.setup-stamp is stale): "
                              "run `make setup` first; this test does not reinstall"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (`pip install playwright`, "
                                                              "the test extra; its browsers are not needed)")

# A fake browser for $BROWSER (Python's webbrowser, which Jupyter uses, runs it with the URL).
FAKE_BROWSER = "#!/bin/sh\necho \"$@\" > \"$(dirname \"$0\")/browser-opened\"\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_of(group: int, marker: str) -> list[str]:
    """Live processes in process group `group` or whose command line holds `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:                                    # it ended while we looked
            continue
        if fields[0] != "Z" and (int(fields[2]) == group or marker in cmdline):
            found.append(f"{proc.name}: {cmdline.strip()[:200]}")
    return found


def course_env(tmp_path: Path, display: bool) -> dict:
    """The user's environment, with Jupyter's state under tmp_path and a display or none."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PORT", "JUPYTER_PORT", "IP")}
    browser = tmp_path / "browser.sh"
    browser.write_text(FAKE_BROWSER)
    browser.chmod(0o755)
    settings = tmp_path / "settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
    settings.parent.mkdir(parents=True)
    settings.write_text('{"fetchNews": "false", "checkForUpdates": false}')   # no toasts, no network
    env.update(BROWSER=str(browser), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"), JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    if display:
        env["DISPLAY"] = ":99"           # nothing listens there: only the fake browser is ever started
    return env


def wait_for_url(server: subprocess.Popen, log: Path, port: int) -> tuple[str, str]:
    """The server's printed URL (127.0.0.1 form) and its token, once it answers (JupyterLab prints
    the URL before it listens, and looking for a browser can take seconds in between)."""
    deadline = time.monotonic() + 90
    pattern = re.compile(rf"http://127\.0\.0\.1:{port}/lab\?token=(\w+)")
    while True:
        found = pattern.search(log.read_text())
        if found:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={found.group(1)}", timeout=5)
                return found.group(0), found.group(1)
            except OSError:
                pass
        if server.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"`make course` printed no URL with a token on port {port} "
                        f"(exit code {server.poll()}):\n{log.read_text()[-4000:]}")
        time.sleep(0.3)


def open_lesson(url: str, tmp_path: Path) -> None:
    """/lab in headless Chromium; lesson 00 opened from the file browser shows its title and its
    kernel goes idle."""
    nb = nbformat.read(REPO / "lessons" / LESSON, as_version=4)
    title = next(line[2:].strip() for cell in nb.cells if cell.cell_type == "markdown"
                 for line in cell.source.splitlines() if line.startswith("# "))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(url)                                   # the printed URL: /lab?token=...
            item = page.locator(".jp-DirListing-item").filter(has_text=LESSON).first
            item.wait_for(timeout=60_000)                    # the file browser lists lessons/
            item.dblclick()
            page.locator(".jp-Notebook h1").filter(has_text=title).first.wait_for(timeout=60_000)
            page.locator("#jp-main-statusbar").get_by_text("| Idle").wait_for(timeout=60_000)
            assert "/lab/tree/" + LESSON in page.url, page.url
            page.screenshot(path=str(tmp_path / "lesson00.png"))
        except BaseException:
            page.screenshot(path=str(tmp_path / "failure.png"))
            print(f"\nscreenshot of the failure: {tmp_path / 'failure.png'}")
            raise
        finally:
            browser.close()


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS `make course` opens a browser without DISPLAY")
@pytest.mark.parametrize("display", [True, False], ids=["display", "no-display"])
def test_make_course_serves_lesson00(tmp_path, display):
    port = free_port()
    port_arg = f"PORT={port}" if display else f"JUPYTER_PORT={port}"
    env = course_env(tmp_path, display)
    log = tmp_path / "make-course.log"
    with open(log, "w") as out:
        server = subprocess.Popen(["make", "course", port_arg], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    marker = str(tmp_path / "runtime")                      # in the server's kernel's command line
    try:
        url, token = wait_for_url(server, log, port)
        status = f"http://127.0.0.1:{port}/api/status"
        assert json.load(urllib.request.urlopen(f"{status}?token={token}", timeout=10))["kernels"] == 0
        with pytest.raises(urllib.error.HTTPError, match="403"):     # the token is needed
            urllib.request.urlopen(status, timeout=10)
        open_lesson(url, tmp_path)
        assert json.load(urllib.request.urlopen(f"{status}?token={token}", timeout=10))["kernels"] == 1
        assert processes_of(-1, marker), "lesson 00's kernel is not running"

        os.killpg(server.pid, signal.SIGTERM)               # make, and JupyterLab, which stops its kernel
        server.wait(timeout=60)                             # make ends once JupyterLab has
        deadline = time.monotonic() + 20
        while left := processes_of(server.pid, marker):
            assert time.monotonic() < deadline, "processes left after stopping it:\n" + "\n".join(left)
            time.sleep(0.3)
        text = log.read_text()
        assert "Running as root is not recommended" not in text, text[-3000:]
        assert "Shutting down 1 kernel" in text, text[-3000:]
        opened = (tmp_path / "browser-opened")
        if display:
            assert opened.exists(), f"with a display, `make course` did not open a browser:\n{text[-3000:]}"
        else:
            assert not opened.exists(), f"without a display, `make course` started a browser: {opened.read_text()}"
            assert "--no-browser" in text, text[:2000]                  # make echoes the command it runs
    finally:
        try:
            os.killpg(server.pid, signal.SIGKILL)           # only where something went wrong above
        except ProcessLookupError:
            pass
        server.wait(timeout=10)
        for line in processes_of(-1, marker):               # a kernel this test's server started
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
