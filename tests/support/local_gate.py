"""Where a local child's run is, told by marker files: the hooks of
``tests/support/local_components.py`` (a module of its own, so that the workflows' determinism
guard, which rebinds ``time`` and ``os`` in a workflow's module only, leaves them alone).

Test code only: the engine has no hook for this. A marker line is one ``write`` on an
``O_APPEND`` file; a gate is a file the test creates to let a waiting run go on.
"""

from __future__ import annotations

import os
import threading
import time


def note(marker: str, line: str) -> None:
    """Append ``line`` (one whole line) to ``marker``."""
    fd = os.open(marker, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def where() -> str:
    """``<pid> <thread name>``: which process and thread a run is in."""
    return f"{os.getpid()} {threading.current_thread().name.replace(' ', '_')}"


def hold(gate: str, seconds: float) -> bool:
    """Wait until the file ``gate`` exists, for up to ``seconds``, in short sleeps (an
    interrupt raised in a thread lands between two of them); True if it appeared."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.exists(gate):
            return True
        time.sleep(0.02)
    return os.path.exists(gate)


def spin(seconds: float) -> None:
    """Keep busy for ``seconds`` in short sleeps (a thread's interrupt lands in between)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.02)
