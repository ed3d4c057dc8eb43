"""Servers that tests start on this machine: a free local port, a process in its own process group, and
that group stopped and checked gone, so a test leaves nothing running whatever the server started."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

GONE_SECONDS = 10  # children exit just after the process that started them


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_group(
    command: Sequence[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen:
    """`command` in a new process group (it and its children are stopped together by `stop_group`), its
    output appended to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_stoppable_by_sigterm,
        )


def _stoppable_by_sigterm() -> None:
    """Dagster's commands handle SIGTERM as SIGINT, and a shell that runs the tests in the background
    ignores SIGINT for its children: give it back its default so that SIGTERM stops them."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_group(process: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM to the process's group, SIGKILL to what is left after `timeout` s; then no process of the
    group may remain (AssertionError naming them otherwise)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the children, whether or not the leader stopped
    process.wait()
    deadline = time.monotonic() + GONE_SECONDS
    while (
        left := processes_where(lambda pid: os.getpgid(pid) == process.pid)
    ) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes of group {process.pid} still running: {left}"


def processes_with_environment(name: str, value: str) -> list[str]:
    """The command lines of this user's processes whose environment has `name=value`: what a test's
    servers left running, even a child that moved to a group of its own."""
    entry = f"{name}={value}".encode()
    return processes_where(lambda pid: entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))


def processes_where(test: Callable[[int], bool]) -> list[str]:
    """`pid: command line` of each live process (not a zombie) for which `test(pid)` holds."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if _state(pid) != "Z" and test(pid):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                found.append(f"{pid}: {command}")
        except (OSError, ProcessLookupError):  # ended meanwhile, or not ours to read
            continue
    return found


def _state(pid: int) -> str:
    # /proc/PID/stat: "pid (command) state ...", the command may hold spaces and parentheses.
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
