"""Executions are pinned to their code, and move to new code only where it replays them.

One story with real ``manage.py obelisk_worker`` processes and two checkouts of one package
(v1 in one directory, v2 in another), each a deployment of its own:

- pinning: with only a v2 worker alive, a v1 execution made due stays pending, shown as
  "waiting for component … (not served)"; a v1 worker started again runs it;
- the dry run (``obelisk_deploy upgrade --dry-run``, in a process importing v2) reports the
  workflows whose change comes after what they recorded, and the ones guarded by
  ``ctx.patched``, as clean, and the reordered ones as nondeterministic, with a message;
- the upgrade moves only the clean ones, which then finish on v2's code; the others stay on
  v1, visibly; moved by force, they fail with exactly the message the dry run printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from executions import client, store
from executions.events import Ok
from executions.models import Delay
from executions.outcome import waiting_for_code
from executions.state_machine import State
from tests.support.clusters import current_database_url, outcomes, started_clusters, wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

COMMON = """\
from datetime import timedelta

from workers.activity import activity
from workers.workflow import workflow


@activity
def step(n: int) -> int:
    return n + 1
"""

V1 = (
    COMMON
    + """

@workflow(blocking="interrupt")
def steady(ctx, n: int) -> int:
    a = ctx.call(step, n)
    ctx.sleep(timedelta(hours=1))
    return a * 10


@workflow(blocking="interrupt")
def reordered(ctx, n: int) -> int:
    a = ctx.call(step, n)
    ctx.sleep(timedelta(hours=1))
    return a


@workflow(blocking="interrupt")
def guarded(ctx, n: int) -> int:
    a = ctx.call(step, n)
    ctx.sleep(timedelta(hours=1))
    return a
"""
)

V2 = (
    COMMON
    + """

@workflow(blocking="interrupt")
def steady(ctx, n: int) -> int:  # changed after what was recorded: clean
    a = ctx.call(step, n)
    ctx.sleep(timedelta(hours=1))
    return a * 100


@workflow(blocking="interrupt")
def reordered(ctx, n: int) -> int:  # sleeps first now: nondeterministic
    ctx.sleep(timedelta(hours=1))
    return ctx.call(step, n)


@workflow(blocking="interrupt")
def guarded(ctx, n: int) -> int:  # the same change, behind ctx.patched: clean
    if ctx.patched("sleep-first"):
        ctx.sleep(timedelta(hours=1))
        return ctx.call(step, n)
    a = ctx.call(step, n)
    ctx.sleep(timedelta(hours=1))
    return a
"""
)


def checkout(directory: Path, package: str, source: str) -> Path:
    root = directory / package
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "flows.py").write_text(textwrap.dedent(source))
    return directory


def deploy_command(code: Path, package: str, *arguments: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(code),
        "OBELISK_COMPONENT_MODULES": f"{package}.flows",
        "DJANGO_SETTINGS_MODULE": "obelisk_site.settings",
        "DATABASE_URL": current_database_url(),
    }
    command = [sys.executable, "manage.py", "obelisk_deploy", *arguments]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def deployment_in_log(cluster) -> str:
    line = next(line for line in cluster.log().splitlines() if "deployment Dep_" in line)
    return line.split("deployment ")[1].split(",")[0]


def fire_delays(execution_id: str) -> None:
    for delay_id in Delay.objects.filter(execution_id=execution_id).values_list("delay_id", flat=True):
        store.fire_delay(delay_id)


def waiting_on_its_delay(execution_id: str) -> bool:
    return Delay.objects.filter(execution_id=execution_id).exists() and (
        store.get_state(execution_id).state == State.BLOCKED_BY_JOIN_SET
    )


def test_pinned_executions_move_to_new_code_only_where_it_replays_them(request, tmp_path):
    package = f"upgr_{uuid.uuid4().hex[:10]}"
    v1 = checkout(tmp_path / "v1", package, V1)
    v2 = checkout(tmp_path / "v2", package, V2)
    env_of = {code: {"PYTHONPATH": str(code), "OBELISK_COMPONENT_MODULES": f"{package}.flows"} for code in (v1, v2)}
    ffqn = {name: f"py:{package}/flows.{name}" for name in ("steady", "reordered", "guarded")}
    with started_clusters(request, tmp_path) as start:
        old_worker = start(env=env_of[v1])
        v1_id = deployment_in_log(old_worker)
        submitted = {
            name: [client.submit(ffqn[name], [n], deployment_id=v1_id).execution_id for n in (1, 2)]
            for name in ("steady", "reordered", "guarded")
        }
        probe = client.submit(ffqn["steady"], [5], deployment_id=v1_id).execution_id
        every = [*(e for ids in submitted.values() for e in ids), probe]
        wait_until(lambda: all(waiting_on_its_delay(e) for e in every), timeout=60, what="every workflow sleeping")
        old_worker.stop()

        new_worker = start(env=env_of[v2])
        v2_id = deployment_in_log(new_worker)
        assert v2_id != v1_id

        # Pinning: due now, the probe waits for v1's code, visibly, and v2's worker leaves it alone.
        fire_delays(probe)
        wait_until(lambda: store.get_state(probe).state == State.PENDING_AT, timeout=30, what="probe due")
        v1_digest = store.get_state(probe).component_id_input_digest
        wait_until(lambda: v1_digest in store.not_served(), timeout=30, what="the dashboard's not-served count")
        time.sleep(2)  # v2's worker was told of it (a NOTIFY) and had time to take it
        assert store.get_state(probe).state == State.PENDING_AT
        assert waiting_for_code(store.get_state(probe), store.served_digests()) == (
            f"waiting for component {v1_digest} (not served)"
        )
        old_again = start(env=env_of[v1])
        assert outcomes([probe], timeout=60) == {probe: Ok(60)}
        old_again.stop()

        # The dry run, in a process importing v2, writes nothing.
        report_path = tmp_path / "report.json"
        before = [store.get_state(e).next_version for e in every]
        dry = deploy_command(v2, package, "upgrade", "--dry-run", v1_id, v2_id, "--json", str(report_path))
        assert dry.returncode == 0, dry.stderr
        assert [store.get_state(e).next_version for e in every] == before
        report = json.loads(report_path.read_text())
        verdicts = {v["execution_id"]: v for v in report["executions"] if v["ffqn"] in ffqn.values()}
        clean = {e for e, v in verdicts.items() if v["clean"]}
        assert clean == set(submitted["steady"] + submitted["guarded"])
        assert {e for e, v in verdicts.items() if not v["clean"]} == set(submitted["reordered"])
        assert all(verdicts[e]["message"] for e in submitted["reordered"])
        assert f"{len(report['executions']) - 2} clean, 2 nondeterministic" in dry.stdout

        # The upgrade moves the clean ones; they finish on v2's code.
        applied = deploy_command(v2, package, "upgrade", v1_id, v2_id)
        assert applied.returncode == 0, applied.stderr
        assert "2 stay on" in applied.stdout
        for e in submitted["steady"] + submitted["guarded"]:  # each move is in the audit trail
            assert [(a.action, a.via) for a in client.audit_trail(e)] == [("upgrade", "cli")]
        for e in every[:-1]:
            fire_delays(e)
        moved = submitted["steady"] + submitted["guarded"]
        assert outcomes(moved, timeout=60) == {
            submitted["steady"][0]: Ok(200),
            submitted["steady"][1]: Ok(300),
            submitted["guarded"][0]: Ok(2),
            submitted["guarded"][1]: Ok(3),
        }

        # The refused ones stay on v1, waiting for its code; forced onto v2, they fail as reported.
        for e in submitted["reordered"]:
            wait_until(lambda e=e: store.get_state(e).state == State.PENDING_AT, timeout=30, what="reordered due")
            assert store.get_state(e).component_id_input_digest == v1_digest
            assert waiting_for_code(store.get_state(e), store.served_digests()) is not None
            state = store.get_state(e)
            store.upgrade_execution_component(
                e,
                old_digest=v1_digest,
                new_digest=verdicts[e]["to_digest"],
                deployment_id=v2_id,
                version=state.next_version,
                force=True,
            )
        failed = outcomes(submitted["reordered"], timeout=60)
        for e in submitted["reordered"]:
            assert failed[e].kind == "nondeterminism_detected", failed[e]
            assert failed[e].detail == verdicts[e]["message"]
