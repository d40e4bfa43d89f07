"""The stored catalogue: deployments, their components and the functions they export.

A process that imports none of the user's code (the web API, the CLI) validates and
submits calls from what the workers stored here (``t_component_metadata.exports_json``):
each exported function with a JSON Schema per parameter and its default. Deployments are
immutable, so what is read about one is cached for the life of the process.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker

from executions import errors
from executions.events import ComponentId
from executions.ids import parse_deployment_id
from executions.models import Deployment, DeploymentComponent

_NO_DEFAULT = inspect.Parameter.empty


class UnknownFunction(errors.NotFound):
    """No deployment exports a function of this name."""

    code = "unknown_function"


class UnknownDeployment(errors.NotFound):
    """No deployment has this id."""

    code = "unknown_deployment"


@dataclass(frozen=True)
class StoredParameter:
    name: str
    schema: dict
    default: Any = _NO_DEFAULT

    @property
    def required(self) -> bool:
        return self.default is _NO_DEFAULT

    @cached_property
    def validator(self) -> Draft202012Validator:
        return Draft202012Validator(self.schema, format_checker=FormatChecker())


@dataclass(frozen=True)
class StoredFunction:
    """An exported function as stored: enough to validate and create a call of it."""

    ffqn: str
    component_id: ComponentId
    deployment_id: str
    parameters: tuple[StoredParameter, ...]
    return_schema: dict

    def encode_arguments(self, arguments: list | dict) -> list:
        """A call's arguments (a JSON array, or an object by parameter name) → the
        positional JSON array to store, each value checked against its parameter's schema.
        ``ValidationFailed`` says which argument and why."""
        if isinstance(arguments, dict):
            arguments = self._positional(arguments)
        if not isinstance(arguments, list):
            raise errors.ValidationFailed(
                f"{self.ffqn}: arguments must be a JSON array or object, not {type(arguments).__name__}"
            )
        required = sum(1 for p in self.parameters if p.required)
        if not required <= len(arguments) <= len(self.parameters):
            expected = f"{required}" if required == len(self.parameters) else f"{required} to {len(self.parameters)}"
            raise errors.ValidationFailed(f"{self.ffqn}: takes {expected} argument(s), got {len(arguments)}")
        for parameter, value in zip(self.parameters, arguments, strict=False):
            _check(parameter, value, self.ffqn)
        return list(arguments) + [p.default for p in self.parameters[len(arguments) :]]

    def _positional(self, arguments: dict) -> list:
        names = [p.name for p in self.parameters]
        unknown = set(arguments) - set(names)
        if unknown:
            shown = errors.excerpt(", ".join(sorted(map(str, unknown))))
            raise errors.ValidationFailed(f"{self.ffqn}: unknown argument(s) {shown}")
        values = []
        for parameter in self.parameters:
            if parameter.name in arguments:
                values.append(arguments[parameter.name])
            elif parameter.required:
                raise errors.ValidationFailed(f"{self.ffqn}: missing argument `{parameter.name}`")
            else:
                values.append(parameter.default)
        return values

    def describe(self) -> dict:
        return {
            "ffqn": self.ffqn,
            "component": self.component_id.name,
            "component_type": self.component_id.component_type,
            "component_digest": self.component_id.component_digest,
            "deployment_id": self.deployment_id,
            "parameters": [
                {"name": p.name, "schema": p.schema, **({} if p.required else {"default": p.default})}
                for p in self.parameters
            ],
            "return_schema": self.return_schema,
        }


def _check(parameter: StoredParameter, value: Any, ffqn: str) -> None:
    error = next(iter(parameter.validator.iter_errors(value)), None)
    if error is not None:
        where = ".".join(str(part) for part in error.absolute_path) or "value"
        raise errors.ValidationFailed(
            f"{ffqn}: argument `{parameter.name}` is invalid: {where}: {errors.excerpt(error.message, 200)}"
        )


@dataclass(frozen=True)
class DeploymentInfo:
    deployment_id: str
    created_at: datetime
    last_active_at: datetime | None
    status: str
    digest: str
    description: str | None
    created_by: str | None
    manifest: str
    components: tuple[tuple[str, str, str], ...]  # (name, type, digest)


_FUNCTIONS_OF: dict[str, dict[str, StoredFunction]] = {}


def functions_of(deployment_id: str) -> dict[str, StoredFunction]:
    """Every function a deployment exports, by name. A deployment is immutable, so what is
    found is kept for the life of the process (a submit pinned to a known deployment then
    costs no query); an unknown id is asked again each time."""
    cached = _FUNCTIONS_OF.get(deployment_id)
    if cached is None:
        cached = _read_functions(deployment_id)
        if cached and len(_FUNCTIONS_OF) < 256:
            _FUNCTIONS_OF[deployment_id] = cached
    return cached


def forget() -> None:
    """Drop what this process keeps about deployments (for tests, whose tables are emptied)."""
    _FUNCTIONS_OF.clear()


def _read_functions(deployment_id: str) -> dict[str, StoredFunction]:
    functions: dict[str, StoredFunction] = {}
    rows = DeploymentComponent.objects.filter(deployment_id=deployment_id).select_related("component")
    for row in rows:
        component_id = ComponentId(
            component_type=row.component_type, name=row.component_name, component_digest=row.component_id
        )
        for export in row.component.exports_json:
            if not export.get("submittable", True):
                continue
            parameters = tuple(
                StoredParameter(p["name"], p.get("type") or {}, p.get("default", _NO_DEFAULT))
                for p in export.get("parameter_types", [])
            )
            functions[export["ffqn"]] = StoredFunction(
                export["ffqn"], component_id, deployment_id, parameters, export.get("return_type") or {}
            )
    return functions


def active_deployment_id() -> str | None:
    return Deployment.objects.filter(status="active").values_list("deployment_id", flat=True).first()


def find_function(ffqn: str, deployment_id: str | None = None) -> StoredFunction:
    """The function as the given deployment exports it; without one, as the active
    deployment does, else as the newest deployment that exports it."""
    if deployment_id is not None:
        parse_deployment_id(deployment_id)  # a malformed id is `invalid_id`, before any query
        if not functions_of(deployment_id) and not Deployment.objects.filter(pk=deployment_id).exists():
            raise UnknownDeployment(f"unknown deployment `{errors.excerpt(deployment_id)}`")
        searched = iter([deployment_id])
    else:
        searched = _search_order()
    first = None
    for candidate in searched:
        first = first or candidate
        found = functions_of(candidate).get(ffqn)
        if found is not None:
            return found
    known = ", ".join(sorted(functions_of(first))) if first else ""
    raise UnknownFunction(
        f"unknown function `{errors.excerpt(ffqn)}`; "
        + (f"exported: {errors.excerpt(known, 300)}" if known else "no deployment is registered yet: start a worker")
    )


def _search_order():
    """The active deployment, then the 20 newest others, read only as far as a search goes
    (a function the active deployment exports costs one query)."""
    active = active_deployment_id()
    if active is not None:
        yield active
    newest = Deployment.objects.order_by("-created_at").values_list("deployment_id", flat=True)[:20]
    yield from (d for d in newest if d != active)


def list_functions(deployment_id: str | None = None) -> list[StoredFunction]:
    """The functions of a deployment (the active one by default), by name."""
    if deployment_id is not None:  # malformed, empty or with a NUL (PostgreSQL's error): `invalid_id`
        parse_deployment_id(deployment_id)
    deployment_id = deployment_id or active_deployment_id()
    if deployment_id is None:
        return []
    if not Deployment.objects.filter(pk=deployment_id).exists():
        raise UnknownDeployment(f"unknown deployment `{errors.excerpt(deployment_id)}`")
    return sorted(functions_of(deployment_id).values(), key=lambda f: f.ffqn)


def _info(deployment: Deployment) -> DeploymentInfo:
    components = tuple(
        (c.component_name, c.component_type, c.component_id) for c in deployment.components.order_by("component_name")
    )
    return DeploymentInfo(
        deployment.deployment_id,
        deployment.created_at,
        deployment.last_active_at,
        deployment.status,
        deployment.digest,
        deployment.description,
        deployment.created_by,
        deployment.deployment_toml,
        components,
    )


def list_deployments(limit: int = 100) -> list[DeploymentInfo]:
    return [_info(d) for d in Deployment.objects.order_by("-created_at")[:limit]]


def get_deployment(deployment_id: str) -> DeploymentInfo:
    """The deployment ``deployment_id``: ``InvalidId`` (400) unless it looks like
    ``Dep_<ULID>``, ``UnknownDeployment`` (404) if none has it."""
    parse_deployment_id(deployment_id)
    deployment = Deployment.objects.filter(pk=deployment_id).first()
    if deployment is None:
        raise UnknownDeployment(f"unknown deployment `{errors.excerpt(deployment_id)}`")
    return _info(deployment)
