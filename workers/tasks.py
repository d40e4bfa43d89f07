"""The functions django-q2 worker processes run (handed out by ``workers.broker``)."""

from __future__ import annotations

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
    so every worker process gets its own executor id)."""
    global _executor
    if _executor is None:
        from workers import telemetry
        from workers.components import served_by_this_process

        telemetry.setup_from_environment()  # after the fork: this process's own exporters
        deployment_id, functions = served_by_this_process()  # the deployment its cluster chose
        _executor = Executor(functions, deployment_id)
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
