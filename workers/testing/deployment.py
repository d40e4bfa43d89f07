"""Submitting from a process that has the components imported (tests, benchmarks, the demo).

It registers the deployment of the code this process imports (as a worker does at start)
and submits through ``executions.client``, pinned to that deployment. Processes without the
code — the REST API, the CLI — use ``executions.client`` directly, which validates against
what the workers stored.
"""

from __future__ import annotations

from functools import lru_cache

from executions import catalog, client
from workers.components import load_components


@lru_cache(maxsize=8)
def _deployment_for(signature: tuple) -> str:
    from deployments.registration import ensure_code_deployment

    return ensure_code_deployment(load_components())


def current_deployment_id() -> str:
    """The deployment of the components this process imports, registered on first use."""
    functions = load_components()
    return _deployment_for(tuple(sorted((f, s.component_id.component_digest) for f, s in functions.items())))


def submit(ffqn: str, arguments: list | dict, **options) -> tuple[str, object]:
    """``client.submit`` pinned to this process's code; returns ``(execution id, Submitted)``."""
    try:
        submitted = client.submit(ffqn, arguments, deployment_id=current_deployment_id(), **options)
    except catalog.UnknownDeployment:  # the tables were emptied since (tests): register again
        _deployment_for.cache_clear()
        submitted = client.submit(ffqn, arguments, deployment_id=current_deployment_id(), **options)
    return submitted.execution_id, submitted
