"""A trainer launched by a supervisor dies with it, so a killed orchestrator never leaves an orphan
training on (and racing the rerun for the run folder).

The supervisor (the `moe_proxy` asset, or `python -m moe_dag.training --nproc-per-node N` for the
torchrun workers it starts) puts its own pid in $MOE_DAG_LAUNCHER_PID. The trainer then asks Linux for
SIGKILL when its parent exits (prctl PR_SET_PDEATHSIG) and checks that its parent is still that pid: if
the launcher died before the request took effect, the trainer would never get the signal, so it stops.
Without the variable nothing changes: a run started by hand from a shell (under nohup, say) outlives
the shell as usual.

Linux only; elsewhere Dagster Pipes' forwarded termination is the one guard. PR_SET_PDEATHSIG fires when
the parent *thread* exits: launchers must start the trainer from a thread that lives as long as the
launch (Dagster runs a step on its process's main thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

LAUNCHER_PID_ENV = "MOE_DAG_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def launcher_env() -> dict[str, str]:
    """Environment for a child process that must not outlive this one."""
    return {LAUNCHER_PID_ENV: str(os.getpid())}


def die_with_launcher() -> None:
    """If $MOE_DAG_LAUNCHER_PID is set, die with our parent, and stop now if it is no longer that pid."""
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if launcher is None:
        return
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != int(launcher):
            raise SystemExit(f"the launcher (pid {launcher}) exited before training started; not training")
