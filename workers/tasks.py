"""The functions django-q2 worker processes run (handed out by ``workers.broker``)."""

from __future__ import annotations

import gc
import logging
import time

from executions.outage import DATABASE_ERRORS, Outage
from workers import shutdown
from workers.executor import Executor

logger = logging.getLogger("obelisk.executor")
_executor: Executor | None = None
_outage = Outage(logger, "worker start")


def executor() -> Executor:
    """This process's executor, built on first use (after django-q2 forked the process,
    so every worker process gets its own executor id). Then everything the process has
    loaded (Django, the components, the executor) is frozen out of the garbage collector:
    it lives as long as the process, and a full collection scanned all of it again, about
    75 ms each, 15 % of a worker's CPU in a fan-out of 200 children (D132)."""
    global _executor
    if _executor is None:
        from workers import telemetry
        from workers.components import served_by_this_process

        telemetry.setup_from_environment()  # after the fork: this process's own exporters
        deployment_id, functions = served_by_this_process()  # the deployment its cluster chose
        _executor = Executor(functions, deployment_id)
        gc.freeze()  # what is loaded now lives as long as the process (D132)
    return _executor


def claim_and_run() -> int:
    """Claim due executions of the served functions and run them; returns how many ran."""
    if shutdown.stopping():
        shutdown.leave_if_told_alone()
        return 0
    try:
        runner = executor()
        _outage.recovered()
    except DATABASE_ERRORS as error:
        time.sleep(_outage.failed(error))
        return 0
    done = runner.claim_and_run()
    shutdown.leave_if_told_alone()
    return done
