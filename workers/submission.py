"""Submitting executions: validate a call against the function registry, then create it.

Used by the CLI (``manage.py obelisk_submit``) and the REST API. A call that names an
unknown function or passes arguments that do not match the function's signature is refused
here, before anything is stored.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache

from executions import errors, store
from executions.ids import ExecutionId, FunctionFqn
from workers.registry import ArgumentError, load_components


class UnknownFunction(errors.NotFound):
    """No registered activity has this name."""

    code = "unknown_function"


@lru_cache(maxsize=8)
def _deployment_for(signature: tuple) -> str:
    from deployments.registration import ensure_code_deployment

    return ensure_code_deployment(load_components())


def current_deployment_id() -> str:
    functions = load_components()
    return _deployment_for(tuple(sorted((f, s.component_id.component_digest) for f, s in functions.items())))


def submit(
    ffqn: str,
    arguments: list | dict,
    *,
    execution_id: str | None = None,
    scheduled_at: datetime | None = None,
    paused: bool = False,
    metadata: dict[str, str] | None = None,
) -> tuple[str, store.CreateOutcome]:
    """Create a top-level execution of ``ffqn``; returns ``(execution id, outcome)``."""
    FunctionFqn.parse(ffqn)
    spec = load_components().get(ffqn)
    if spec is None:
        known = ", ".join(sorted(load_components())) or "none"
        raise UnknownFunction(f"unknown function `{ffqn}`; registered: {known}")
    try:
        params = spec.encode_arguments(arguments)
    except ArgumentError as error:
        raise errors.ValidationFailed(str(error)) from None
    execution_id = str(ExecutionId.parse(execution_id)) if execution_id else str(ExecutionId.generate())
    outcome = store.create(
        store.CreateRequest(
            execution_id=execution_id,
            ffqn=ffqn,
            params=params,
            component_id=spec.component_id,
            deployment_id=current_deployment_id(),
            scheduled_at=scheduled_at,
            paused=paused,
            metadata=metadata or {},
        )
    )
    return execution_id, outcome
