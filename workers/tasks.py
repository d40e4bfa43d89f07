"""The functions django-q2 worker processes run (handed out by ``workers.broker``)."""

from __future__ import annotations

from workers.executor import ActivityExecutor

_executor: ActivityExecutor | None = None


def executor() -> ActivityExecutor:
    """This process's executor, built on first use (after django-q2 forked the process,
    so every worker process gets its own executor id)."""
    global _executor
    if _executor is None:
        from deployments.registration import ensure_code_deployment
        from workers.registry import load_components

        functions = load_components()
        _executor = ActivityExecutor(functions, ensure_code_deployment(functions))
    return _executor


def claim_and_run() -> int:
    """Claim due executions of the served functions and run them; returns how many ran."""
    return executor().claim_and_run()
