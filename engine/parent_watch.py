"""die_with_parent: a child process that must not outlive the process that started it.

Workers die with their supervisor; a server started by LocalServer (reproduce, the benches,
the tests) dies with the Python that started it, so an interrupted bench leaves no engine
behind holding cores. Linux: PR_SET_PDEATHSIG; elsewhere nothing (workers still notice an
orphaned bus and exit on their own, after ORPHAN_S).
"""

from __future__ import annotations

import ctypes
import os
import signal

PARENT_ENV = "PAGEWARDEN_PARENT_PID"  # set by a parent that wants its `serve` child tied to it
PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None = None) -> bool:
    """Ask for SIGTERM when the parent exits. When `expected_parent` is given and the parent
    is already gone (this process was re-parented before the request took effect), raise
    SystemExit at once instead. Returns whether the request took effect."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        done = libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) == 0
    except OSError:
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        raise SystemExit(f"the parent process {expected_parent} is gone; not starting")
    return done


def die_with_parent_from_env() -> bool:
    """die_with_parent(PARENT_ENV's pid) when the environment names one, else nothing."""
    pid = os.environ.get(PARENT_ENV, "")
    return die_with_parent(int(pid)) if pid.isdigit() else False
