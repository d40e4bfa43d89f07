"""Submitting executions: validate a call against the function registry, then create it.

Used by the CLI (``manage.py obelisk_submit``) and the REST API. A call that names an
unknown function, passes arguments that do not match the function's signature or cannot be
stored (NUL characters, lone surrogates, NaN, nesting deeper than ``MAX_JSON_DEPTH``), or
gives an invalid execution id is refused here, before anything is stored. Messages quote
user input only through ``errors.excerpt``.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache

from executions import conf, errors, store
from executions.events import check_storable
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
    """Create a top-level execution of ``ffqn``; returns ``(execution id, outcome)``.

    ``execution_id=None`` generates one; any other value (also ``""``) must be a valid
    top-level id.
    """
    FunctionFqn.parse(ffqn)
    if execution_id is not None:
        parsed_id = ExecutionId.parse(execution_id)
        if not parsed_id.is_top_level:
            raise errors.InvalidId(
                f"a submitted execution needs a top-level id `E_<ULID>`, got `{errors.excerpt(execution_id)}`"
            )
        execution_id = str(parsed_id)
    else:
        execution_id = str(ExecutionId.generate())
    spec = load_components().get(ffqn)
    if spec is None:
        known = ", ".join(sorted(load_components())) or "none"
        raise UnknownFunction(f"unknown function `{errors.excerpt(ffqn)}`; registered: {errors.excerpt(known, 300)}")
    # Before the registry's validation, which recurses (50,000 nested arrays would be a
    # RecursionError); the store checks the encoded params again.
    check_storable(arguments, "arguments", max_depth=conf.get("MAX_JSON_DEPTH"))
    try:
        params = spec.encode_arguments(arguments)
    except ArgumentError as error:
        raise errors.ValidationFailed(errors.excerpt(str(error), 500)) from None
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
