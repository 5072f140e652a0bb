"""Build a small C file once with the system C compiler and load it with ctypes.

The CPU kernels (paged attention, the small-batch linear) are single C files next to
the Python that calls them. Each is compiled on first use into the minillm cache,
keyed by its source, the flags, the compiler and this CPU, so an edit or a new
machine rebuilds it and everything else reuses the file. No compiler: `build`
returns None with the reason, and the caller takes its torch path.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from .paths import cache_dir

# Best first: vectorized for this machine and multi-threaded, then more portable builds.
FLAG_SETS = (["-O3", "-march=native", "-fopenmp"], ["-O3", "-fopenmp"], ["-O3"])


def _this_cpu() -> str:
    """What -march=native compiled for: a cache shared by different machines must not mix them."""
    try:
        with open("/proc/cpuinfo") as f:
            return "".join(line for line in f if line.startswith(("model name", "flags")))[:4000]
    except OSError:
        return platform.machine() + platform.processor()


def _compile(source: Path, flags: list[str]) -> Path:
    """Compile `source` with these flags into the cache (reused while source, flags and CPU match)."""
    cc = os.environ.get("CC", "cc")
    code = source.read_bytes()
    key = hashlib.sha256(code + " ".join([cc, *flags, sys.platform, _this_cpu()]).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"{source.stem}-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            subprocess.run([cc, *flags, "-shared", "-fPIC", "-std=c99", str(source), "-o", str(built), "-lm"],
                           check=True, capture_output=True, timeout=120)
            os.replace(built, target)            # atomic: a parallel build never sees half a file
    return target


def build(source: Path, extra_flags: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, "") or (None, why every flag set failed)."""
    errors = []
    for flags in FLAG_SETS:
        try:
            return ctypes.CDLL(str(_compile(source, [*flags, *extra_flags]))), ""
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", b"") or b""
            errors.append(f"{' '.join(flags)}: {e} {detail.decode(errors='replace')[-300:]}".strip())
    return None, "; ".join(errors)
