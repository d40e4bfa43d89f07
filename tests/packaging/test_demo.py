"""``./scripts/demo.sh``, the README's first command, run as a user runs it: a subprocess with
its own SQLite file (``OBELISK_VAR_DIR`` in a temporary directory), a real worker cluster,
and output a person reads and pastes from.

It uses this checkout's ``.venv`` (made by ``scripts/test.sh`` before the tests run), so no
installation happens here; it runs once per test suite, in the SQLite pass.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from django.db import connection

from tests.support.processes import REPO, clean_env

pytestmark = pytest.mark.slow

# A top-level id, or a child's (``E_<ULID>.<join set>_<n>.<index>…``): what obelisk_status takes.
EXECUTION_ID = re.compile(r"\bE_[0-9A-Z]{26}(?:\.[^\s]+)?")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's output, and the environment to run more commands on its database."""
    if connection.vendor != "sqlite":
        pytest.skip("runs once per test suite, in the SQLite pass: the demo uses its own SQLite file")
    var = tmp_path_factory.mktemp("demo") / "var"
    env = clean_env(OBELISK_VAR_DIR=str(var), PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    result = subprocess.run(
        [str(REPO / "scripts" / "demo.sh")], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    env.update(
        DJANGO_SECRET_KEY=(var / "dev-secret-key").read_text().strip(),
        OBELISK_COMPONENT_MODULES="demo.activities,demo.workflows",
    )
    return result.stdout, env


def test_the_demo_prints_each_submission_as_a_call(demo):
    """Submit lines showed Python tuples (``greet('world',)``): they show the call, its
    arguments as JSON."""
    output, _ = demo
    assert 'py:demo/activities.greet("world"): succeeds at once' in output, output
    assert "py:demo/activities.flaky(2): " in output, output
    assert 'py:demo/workflows.welcome_team(["Ada", "Grace", "Linus"]): ' in output, output
    assert "',)" not in output and "('" not in output, output


def test_every_id_the_demo_prints_can_be_pasted_into_obelisk_status(demo):
    """The tree printed children as suffixes (``n:js_1.0``) that ``obelisk_status`` refused:
    every id in the output, children included, is a full id that it shows."""
    output, env = demo
    tree = output[output.index("tree of executions") :]
    ids = EXECUTION_ID.findall(tree)
    children = [execution_id for execution_id in ids if "." in execution_id]
    assert len(children) >= 4, tree  # three greetings and the child workflow (and its greeting)
    for execution_id in (ids[0], *children):
        status = subprocess.run(
            [sys.executable, "manage.py", "obelisk_status", execution_id],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith(f"{execution_id}  py:demo/"), status.stdout
        assert "result: ok " in status.stdout, status.stdout
