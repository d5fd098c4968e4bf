"""Which process writes a running run, and whether that process is still alive.

A run left ``running`` is aborted on the next open only when its writer is known dead: the GUI's
engine worker and a CLI benchmark may share one database, and neither may abort the other's live run.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

log = logging.getLogger(__name__)

# create_time is a float from /proc; two reads of the same process agree far better than this.
_START_TOLERANCE_S = 1.0


@dataclass(frozen=True, slots=True)
class Owner:
    host: str
    pid: int
    started_s: float  # process creation time (epoch seconds): a reused pid has another


def current_owner() -> Owner:
    import psutil

    return Owner(socket.gethostname(), os.getpid(), psutil.Process().create_time())


def is_alive(owner: Owner | None) -> bool | None:
    """True/False for a writer on this host; None when it ran on another host (cannot tell)."""
    import psutil

    if owner is None or owner.pid is None:
        return False  # no owner recorded: nothing can still be writing it
    if owner.host != socket.gethostname():
        return None
    try:
        proc = psutil.Process(owner.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped by its parent
            return False
        started_s = proc.create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # it exists (another user's process): do not abort what may be live
    if owner.started_s is not None and abs(started_s - owner.started_s) > _START_TOLERANCE_S:
        return False  # the pid now belongs to another process
    return True
