"""The registry of functions: their names, typed signatures and components.

The decorators that fill it are the authoring API (``workers/activity.py``). An activity is registered under an Obelisk function name: ``name=`` if given, otherwise
``py:<package>/<module path>.<function>`` (``demo.activities.greet`` →
``py:demo/activities.greet``). Parameters and the return value are typed by the function's
annotations and validated with pydantic: at submission (a wrong call is refused before it
is stored), when the run starts, and when it returns. Payloads are JSON.

Functions are grouped in **components**: one per Python module, whose digest is the SHA-256
of the module's source, so the executions a version of the code created stay pinned to it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import TypeAdapter, ValidationError

from deployments.digests import component_digest
from executions.events import ComponentId, RetryConfig, canonical_json
from executions.ids import FunctionFqn

DEFAULT_MAX_RETRIES = 5
DEFAULT_BACKOFF = timedelta(milliseconds=100)
DEFAULT_TIMEOUT = timedelta(seconds=60)
DEFAULT_LOCK_DURATION = timedelta(seconds=10)


class RegistrationError(Exception):
    """A function cannot be registered (bad name, unsupported signature, ill-typed option,
    duplicate). One line that says what to write instead; ``where`` (``file:line`` of the
    function, when known) lets a worker's start-up error point at it (D99)."""

    def __init__(self, message: str, where: str | None = None):
        super().__init__(message)
        self.where = where


class ArgumentError(ValueError):
    """Arguments do not match the function's signature; the message says which and why."""


@dataclass(frozen=True)
class Parameter:
    name: str
    adapter: TypeAdapter
    annotation: Any
    default: Any = inspect.Parameter.empty

    def json_schema(self) -> dict:
        return self.adapter.json_schema()

    def describe(self) -> dict:
        """The parameter as stored in ``exports_json``: name, JSON Schema and, when it has
        one, its default as JSON, so a client without the code can validate a call."""
        entry = {"name": self.name, "type": self.json_schema()}
        if self.default is not inspect.Parameter.empty:
            entry["default"] = self.adapter.dump_python(self.default, mode="json")
        return entry


@dataclass(eq=False)
class Function:
    """A registered activity or workflow (its ``kind``): the callable, its typed signature
    and how it runs."""

    ffqn: str
    fn: Callable
    parameters: tuple[Parameter, ...]
    returns: TypeAdapter
    return_annotation: Any
    max_retries: int | None
    backoff: timedelta
    timeout: timedelta
    lock_duration: timedelta
    module: str
    kind: str = "activity"  # "activity" or "workflow"
    blocking: str = "await"  # workflows: how a run waits for a response ("await" or "interrupt")
    _component: ComponentId | None = field(default=None, repr=False)

    @property
    def retry_config(self) -> RetryConfig:
        return RetryConfig(max_retries=self.max_retries, retry_exp_backoff=self.backoff)

    @property
    def component_id(self) -> ComponentId:
        if self._component is None:
            self._component = component_of_module(self.module, self.kind)
        return self._component

    def __call__(self, *args, **kwargs):
        """Calling the decorated function directly runs it in-process (handy in tests)."""
        return self.fn(*args, **kwargs)

    # -- arguments ---------------------------------------------------------------------

    def encode_arguments(self, arguments: list | dict) -> list:
        """Validate a call's arguments (a JSON array, or an object by parameter name) and
        return the positional JSON array to store. Raises ``ArgumentError``."""
        if isinstance(arguments, dict):
            unknown = set(arguments) - {p.name for p in self.parameters}
            if unknown:
                raise ArgumentError(f"{self.ffqn}: unknown argument(s) {sorted(unknown)}")
            values = []
            for p in self.parameters:
                if p.name in arguments:
                    values.append(arguments[p.name])
                elif p.default is not inspect.Parameter.empty:
                    values.append(p.adapter.dump_python(p.default, mode="json"))
                else:
                    raise ArgumentError(f"{self.ffqn}: missing argument `{p.name}`")
            arguments = values
        if not isinstance(arguments, list):
            raise ArgumentError(
                f"{self.ffqn}: arguments must be a JSON array or object, not {type(arguments).__name__}"
            )
        required = sum(1 for p in self.parameters if p.default is inspect.Parameter.empty)
        if not required <= len(arguments) <= len(self.parameters):
            expected = f"{required}" if required == len(self.parameters) else f"{required} to {len(self.parameters)}"
            raise ArgumentError(f"{self.ffqn}: takes {expected} argument(s), got {len(arguments)}")
        encoded = []
        for p, value in zip(self.parameters, arguments, strict=False):
            encoded.append(
                p.adapter.dump_python(_validate(p.adapter, value, f"argument `{p.name}`", self.ffqn), mode="json")
            )
        for p in self.parameters[len(arguments) :]:
            encoded.append(p.adapter.dump_python(p.default, mode="json"))
        return encoded

    def decode_arguments(self, params: list) -> list:
        """Stored JSON parameters → Python values for the call."""
        if len(params) != len(self.parameters):
            raise ArgumentError(f"{self.ffqn}: takes {len(self.parameters)} argument(s), stored {len(params)}")
        return [
            _validate(p.adapter, v, f"argument `{p.name}`", self.ffqn, strict_json=True)
            for p, v in zip(self.parameters, params, strict=False)
        ]

    def encode_result(self, value: Any) -> Any:
        """The function's return value → JSON, checked against the return annotation."""
        if self.return_annotation is inspect.Signature.empty:
            return TypeAdapter(Any).dump_python(value, mode="json")
        checked = _validate(self.returns, value, "return value", self.ffqn)
        return self.returns.dump_python(checked, mode="json")

    def decode_result(self, value: Any) -> Any:
        """A stored JSON return value → the Python value the caller expects (a workflow
        receiving a child's result)."""
        if self.return_annotation is inspect.Signature.empty:
            return value
        return _validate(self.returns, value, "return value", self.ffqn, strict_json=True)

    def describe(self) -> dict:
        """The function's entry in its component's ``exports_json``."""
        return {
            "ffqn": self.ffqn,
            "parameter_types": [p.describe() for p in self.parameters],
            "return_type": self.returns.json_schema() if self.return_annotation is not inspect.Signature.empty else {},
            "extension": None,
            "submittable": True,
        }


def _validate(adapter: TypeAdapter, value: Any, what: str, ffqn: str, strict_json: bool = False) -> Any:
    try:
        if strict_json:
            return adapter.validate_json(canonical_json(value))
        return adapter.validate_python(value)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'value'}: {e['msg']}" for e in error.errors()
        )
        raise ArgumentError(f"{ffqn}: {what} is invalid: {problems}") from None


# ---------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------

_FUNCTIONS: dict[str, Function] = {}


def default_ffqn(fn: Callable) -> str:
    package, _, rest = fn.__module__.partition(".")
    interface = rest.replace(".", "/") or "functions"
    return f"py:{package}/{interface}.{fn.__name__}"


def register(spec: Function) -> Function:
    """Add a function to the registry; the same name twice must be the same function."""
    existing = _FUNCTIONS.get(spec.ffqn)
    if existing is not None and existing.fn.__qualname__ != spec.fn.__qualname__:
        raise RegistrationError(f"`{spec.ffqn}` is already registered by {existing.module}.{existing.fn.__qualname__}")
    _FUNCTIONS[spec.ffqn] = spec
    functools.update_wrapper(spec, spec.fn)
    return spec


def build(
    fn, name, max_retries, backoff, timeout, lock_duration, *, component_type: str = "activity", blocking="await"
) -> Function:
    """A registered function from its signature. A workflow's first parameter is its context
    (``WorkflowContext``), not an argument of the call. Every mistake is a
    ``RegistrationError`` raised here, when the module is imported, not at the first run."""
    try:
        return _build(fn, name, max_retries, backoff, timeout, lock_duration, component_type, blocking)
    except RegistrationError as error:
        error.where = error.where or _where(fn)
        raise


def _build(fn, name, max_retries, backoff, timeout, lock_duration, component_type, blocking) -> Function:
    ffqn = _ffqn(fn, name)
    _check_options(ffqn, max_retries, backoff, timeout, lock_duration)
    if inspect.iscoroutinefunction(fn):
        raise RegistrationError(f"{ffqn}: async functions are not supported yet; use a plain function")
    signature = inspect.signature(fn)
    declared = list(signature.parameters.values())
    if component_type == "workflow":
        _check_context_parameter(fn, ffqn, declared)
        declared = declared[1:]
    if blocking not in ("await", "interrupt"):
        raise RegistrationError(f'{ffqn}: blocking must be "await" or "interrupt", not {blocking!r}')
    parameters = []
    for p in declared:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY):
            raise RegistrationError(
                f"{ffqn}: parameter `{p.name}` must be positional (no *args, **kwargs or keyword-only)"
            )
        annotation = Any if p.annotation is inspect.Parameter.empty else p.annotation
        parameters.append(Parameter(p.name, TypeAdapter(annotation), annotation, p.default))
    returns = signature.return_annotation
    return Function(
        ffqn=ffqn,
        fn=fn,
        parameters=tuple(parameters),
        returns=TypeAdapter(Any if returns is inspect.Signature.empty else returns),
        return_annotation=returns,
        max_retries=max_retries,
        backoff=backoff,
        timeout=timeout,
        lock_duration=lock_duration,
        module=fn.__module__,
        kind=component_type,
        blocking=blocking,
    )


def check_target(target, decorator: str) -> None:
    """``@activity("name")`` passes the name where the function goes: say how to write it."""
    if isinstance(target, str):
        raise RegistrationError(f'{decorator} takes its options by keyword: write `{decorator}(name="{target}")`')


def _ffqn(fn, name) -> str:
    if not callable(fn):
        raise RegistrationError(f"{fn!r} is not a function: decorate a `def`")
    if name is not None and not isinstance(name, str):
        raise RegistrationError(
            f'{default_ffqn(fn)}: name must be a string such as `name="myapp:billing/charge.run"`, '
            f"not {type(name).__name__} {name!r}"
        )
    try:
        return str(FunctionFqn.parse(name or default_ffqn(fn)))
    except Exception as error:
        raise RegistrationError(str(error)) from None


def _check_options(ffqn: str, max_retries, backoff, timeout, lock_duration) -> None:
    """The decorator's options, each of its type: a mistake such as ``backoff=1`` is refused
    with what to write instead (issue 36 item 10)."""
    if max_retries is not None and (type(max_retries) is not int or max_retries < 0):
        raise RegistrationError(
            f"{ffqn}: max_retries must be a whole number >= 0, or None to retry forever, not {max_retries!r}"
        )
    for what, value in (("backoff", backoff), ("timeout", timeout), ("lock_duration", lock_duration)):
        if not isinstance(value, timedelta):
            seconds = repr(value) if isinstance(value, int | float) and not isinstance(value, bool) else "..."
            raise RegistrationError(
                f"{ffqn}: {what} must be a timedelta, not {type(value).__name__} {value!r}: "
                f"write `{what}=timedelta(seconds={seconds})`"
            )
    if backoff < timedelta(0):
        raise RegistrationError(f"{ffqn}: backoff must not be negative")
    for what, value in (("timeout", timeout), ("lock_duration", lock_duration)):
        if value <= timedelta(0):
            raise RegistrationError(f"{ffqn}: {what} must be a positive timedelta")


CONTEXT_NAMES = ("ctx", "context", "_ctx", "_context", "_")


def _check_context_parameter(fn, ffqn: str, declared: list[inspect.Parameter]) -> None:
    """A workflow's first parameter is its ``WorkflowContext``: named ``ctx`` (or
    ``context``), or annotated ``WorkflowContext``. ``def f(x: int)`` would otherwise
    register, and every call of it be refused for its number of arguments."""
    if declared:
        first = declared[0]
        annotation = first.annotation
        named = getattr(annotation, "__name__", annotation) if annotation is not inspect.Parameter.empty else None
        positional = first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD)
        if positional and first.default is inspect.Parameter.empty:
            if isinstance(named, str) and named.rpartition(".")[2] == "WorkflowContext":
                return
            if first.name in CONTEXT_NAMES:
                return
    suggested = ", ".join(["ctx", *(_render(p) for p in declared)])
    raise RegistrationError(
        f"{ffqn}: a workflow takes its context as its first parameter: write `def {fn.__name__}({suggested})`"
    )


def _render(parameter: inspect.Parameter) -> str:
    """``x: int = 3`` as written (an annotation kept as text under ``from __future__ import
    annotations`` is shown as it was written, not quoted)."""
    text = {parameter.VAR_POSITIONAL: "*", parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "") + parameter.name
    if parameter.annotation is not inspect.Parameter.empty:
        annotation = parameter.annotation
        text += ": " + (annotation if isinstance(annotation, str) else inspect.formatannotation(annotation))
    if parameter.default is not inspect.Parameter.empty:
        text += f" = {parameter.default!r}"
    return text


def _where(fn) -> str | None:
    """``file:line`` of ``fn``'s ``def``, for a start-up error to point at."""
    code = getattr(fn, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else None


def lookup(ffqn: str) -> Function | None:
    """The registered function of that name, if this process imported it."""
    return _FUNCTIONS.get(ffqn)


def registered() -> dict[str, Function]:
    """Every function this process has registered so far, by name."""
    return dict(_FUNCTIONS)


def restore(saved: dict[str, Function]) -> None:
    """The registry as ``registered()`` found it, plus the modules imported since, minus
    the functions defined inside a function body (a test's own): ``obelisk_env``'s teardown."""
    for ffqn, spec in list(_FUNCTIONS.items()):
        if ffqn in saved:
            _FUNCTIONS[ffqn] = saved[ffqn]
        elif "<locals>" in getattr(spec.fn, "__qualname__", ""):
            del _FUNCTIONS[ffqn]


@functools.cache
def component_of_module(module: str, component_type: str = "activity") -> ComponentId:
    """A module's component of one type: its name and the digest of its type and source
    files (``deployments.digests``: the module's file, or its whole package).

    The type is hashed too: a module that defines activities and workflows has two
    components, and a digest keys its stored metadata (``t_component_metadata``), so the
    two must not share one."""
    name = module if component_type == "activity" else f"{module}:{component_type}"
    digest = component_digest(module, component_type)
    return ComponentId(component_type=component_type, name=name, component_digest=digest)
