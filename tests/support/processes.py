"""This repository's commands run as other processes, as a user runs them: ``manage.py``
commands on the current test database (``run``; ``refused`` checks a refusal is one line on
stderr and writes nothing), and the environment of a process that must not see this test
run's settings (``clean_env``). Used by ``tests/packaging/test_cli.py``, ``test_packaging.py``,
``test_demo.py``, ``test_shared_server.py`` and ``tests/store/test_retention.py``.

The processes are others: tests that use ``run`` are transactional, so that the commands
see what the test committed.

why: D106, D107 (commands named after the checkout, saying what happened in one line)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from executions.management.commands import _cli
from tests.support import helpers
from tests.support.clusters import BASE_DIR, current_database_url

REPO = Path(__file__).resolve().parents[2]
PROCESS_TIMEOUT = 60  # seconds; a safety limit only (a hanging command fails the test)
MAX_ERROR_LINE = 1000  # an error line quoting a 100 KB input must stay far below its size

# Everything the environment of this test run may hold that would leak into a subprocess:
# the site's and the test settings' variables, and paths that would make the repository
# importable in the host project.
LEAKING = ("DJANGO_", "OBELISK_", "DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV", "Q_")


def clean_env(**extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(LEAKING)}
    env.update(extra)
    return env


def run(*argv: str | bytes, stdout=subprocess.PIPE, unbuffered: bool = True) -> subprocess.CompletedProcess:
    """``python manage.py <argv>`` on the current test database; stdout/stderr as bytes
    (``stdout``: another file descriptor to write to instead; ``unbuffered``: as a
    terminal's, else block-buffered as a pipe's)."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="obelisk_site.settings",
        OBELISK_COMPONENT_MODULES="tests.support.components",
        DATABASE_URL=current_database_url(),
    )
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    return subprocess.run(
        [sys.executable, "manage.py", *argv],
        cwd=BASE_DIR,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        timeout=PROCESS_TIMEOUT,
    )


def error_line(result: subprocess.CompletedProcess) -> str:
    """The process's stderr, which must be exactly one line of valid UTF-8 and no traceback."""
    text = result.stderr.decode("utf-8")  # strict: a lone surrogate must never reach the terminal
    assert "Traceback" not in text, text
    lines = text.splitlines()
    assert len(lines) == 1, text[:2000]
    assert len(lines[0]) < MAX_ERROR_LINE, lines[0][:2000]
    return lines[0]


def refused(*argv: str | bytes, code: str, status: int = _cli.EXIT_ERROR) -> str:
    """The command exits with ``status``, one ``CommandError: <code>: ...`` line on stderr,
    nothing on stdout, and the execution tables exactly as they were."""
    before = helpers.db_snapshot()
    result = run(*argv)
    line = error_line(result)
    assert result.returncode == status, (result.returncode, line)
    assert line.startswith(f"CommandError: {code}: "), line
    assert result.stdout == b""
    assert helpers.db_snapshot() == before
    return line
