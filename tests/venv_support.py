"""Fresh virtual environments for the Colab and Binder tests: a copy of this checkout (what
git tracks, plus new files it does not ignore), a venv with torch from the machine's local
CPU wheel (`pip install torch==2.13.0`, see scripts/setup.sh), and a notebook run by nbclient
with that venv's Python as the kernel. pip's cache is reused, so a second run downloads
nothing. No install byte-compiles what it installs (`--no-compile`, and PIP_COMPILE=0 for the
installs the notebooks and postBuild run): Python compiles what a run imports, and compiling
all of torch and transformers up front cost most of each install's CPU time."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCAL_TORCH = os.environ.get("MINILLM_LOCAL_TORCH", "2.13.0")


def sh(cmd, timeout=600, **kwargs) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def source_copy(dest: Path) -> Path:
    """This checkout's files (tracked, or new and not ignored) copied to `dest`: installs read
    the copy, so that building the package never writes into the repository."""
    files = sh(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO).split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def make_venv(path: Path, *packages: str) -> Path:
    """A new venv at `path` with the local torch wheel (and `packages`); returns its python."""
    base = getattr(sys, "_base_executable", sys.executable)
    sh([base, "-m", "venv", str(path)])
    python = path / "bin" / "python"
    pip(python, f"torch=={LOCAL_TORCH}", *packages)
    return python


def pip(python: Path, *args: str, cwd=None) -> None:
    if args:
        sh([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile", *args], cwd=cwd)


RUN_NOTEBOOK = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": sys.argv[2]}}).execute()
nbformat.write(nb, sys.argv[1])
print("ran", len([c for c in nb.cells if c.cell_type == "code"]), "code cells")
"""


def run_notebook(python: Path, notebook: Path, env: dict, timeout: int = 600) -> str:
    """Run `notebook` top to bottom in a kernel of `python` (nbclient), in its own folder;
    fails with the cell's error. Returns what the runner printed."""
    env = dict(env, PATH=os.pathsep.join([str(python.parent), env.get("PATH", "")]))  # the kernel's "python"
    return sh([str(python), "-c", RUN_NOTEBOOK, str(notebook), str(notebook.parent)],
              env=env, timeout=timeout, cwd=notebook.parent)


def clean_env(**extra: str) -> dict:
    """The environment without this venv's traces (a kernel must use the new venv's Python)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(REPO / ".venv")))
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PIP_COMPILE"] = "0"          # pip's --no-compile (PIP_NO_COMPILE=1 would mean the opposite)
    env.update(extra)
    return env
