"""A replica ends when the front that started it ends, however the front ends.

The front keeps the write end of a pipe that is the replica's stdin and never writes to it.
When the front exits, even killed with SIGKILL, the kernel closes that end and the replica
reads end-of-file: it then sends itself SIGTERM, the graceful shutdown every `minillm serve`
has (run.py). No orphan keeps a port and a KV pool after its front is gone. (Linux's
prctl(PR_SET_PDEATHSIG) would fire when the *thread* that started the child exits, not the
process, and exists on Linux only; a pipe works everywhere.)
A front killed outright cannot remove its replicas' log directory either, so the replicas do:
each unlinks its own log (it keeps writing to the open file) and the last one out removes
the directory.
"""
from __future__ import annotations

import os
import signal
import sys
import threading


LOG_VARIABLE = "MINILLM_REPLICA_LOG"    # where the front writes this replica's output (replicas.py)


def remove_log(path: str | None) -> None:
    if not path:
        return
    for remove, target in ((os.unlink, path), (os.rmdir, os.path.dirname(path))):
        try:
            remove(target)
        except OSError:                        # gone already, or another replica's log still in it
            pass


def exit_with_parent() -> threading.Thread:
    """Watch stdin in a daemon thread; at end-of-file, SIGTERM this process."""
    def watch():
        try:
            while os.read(fd, 1 << 16):       # the file descriptor, not sys.stdin: a daemon thread
                pass                           # blocked in a buffered reader aborts the interpreter's exit
        except OSError:                        # stdin closed or not readable: the same news
            pass
        remove_log(os.environ.get(LOG_VARIABLE))
        os.kill(os.getpid(), signal.SIGTERM)

    fd = sys.stdin.fileno()

    thread = threading.Thread(target=watch, name="minillm-lifeline", daemon=True)
    thread.start()
    return thread
