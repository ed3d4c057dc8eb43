"""One writer per run folder: a second trainer pointed at a folder in use stops with a clear message.

The lock is an advisory `flock` on `<out>/run.lock`, which the kernel releases when its holder exits,
however it exits (kill -9 included): a stale lock cannot outlive a dead trainer, so there is nothing to
clean up by hand. The file says who holds it, for the message the next trainer shows.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = "run.lock"


class RunFolderInUse(RuntimeError):
    """Another process is training in this run folder."""


@contextmanager
def run_lock(out_dir: Path) -> Iterator[None]:
    """Hold the run folder's lock for the duration of the block; raise RunFolderInUse if it is taken."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / LOCK_FILE
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderInUse(
                f"{out_dir} is in use by another trainer ({_holder(path)}); wait for it to finish, "
                "or stop it, then rerun"
            ) from None
        handle.seek(0)
        handle.truncate()
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        handle.write(json.dumps(holder))
        handle.flush()
        yield


def _holder(path: Path) -> str:
    try:
        holder = json.loads(path.read_text())
        return f"pid {holder['pid']} on {holder['host']} since {holder['since']}"
    except (OSError, ValueError, KeyError):  # the holder may not have written its name yet
        return "holder unknown"
