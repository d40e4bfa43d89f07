"""The determinism guard (spec 002 §8.2): inside workflow code, the usual sources of time and
randomness raise a clear error that names the ``ctx`` call to use instead.

A workflow is replayed from its log after every crash, so it must compute the same thing
every time: wall-clock time, random numbers and fresh UUIDs would differ on replay. The
durable versions live on the context and are recorded in the log on the first run
(``ctx.now()``, ``ctx.random_u64()``, ``ctx.random_string()``, ``ctx.uuid()``).

``guard_module(module)`` (called by ``@workflow`` for the module that defines the workflow)
rebinds that module's own names: ``time``, ``random``, ``uuid``, ``os``, ``secrets`` and
``datetime`` become proxies whose non-deterministic functions are guarded, and names
imported from them (``from time import time``, ``from datetime import datetime``) become
their guarded versions. Nothing global is patched: other modules, the engine, ``logging``
and libraries see the standard library as it is. A guarded function raises only while a
workflow runs in the calling thread (``guarding()``); otherwise it behaves as the original.
"""

from __future__ import annotations

import contextlib
import datetime as _datetime
import functools
import os
import random
import secrets
import threading
import time
import types
import uuid

_state = threading.local()


class DeterminismError(RuntimeError):
    """Workflow code called something that differs on replay."""


@contextlib.contextmanager
def guarding():
    """Workflow code runs inside (in this thread)."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def _check(name: str, instead: str) -> None:
    if getattr(_state, "depth", 0):
        raise DeterminismError(
            f"`{name}` is not deterministic and cannot be used in a workflow (it would differ on replay); "
            f"use `{instead}`"
        )


def _guard(original, name: str, instead: str):
    @functools.wraps(original)
    def guarded(*args, **kwargs):
        _check(name, instead)
        return original(*args, **kwargs)

    return guarded


class _RealTypeChecks(type):
    """The guarded classes stand in for the real ones in type checks, so ``isinstance(
    ctx.now(), datetime)`` holds in a guarded module and annotations validate as the real
    types (pydantic asks ``__get_pydantic_core_schema__``)."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, cls._real)

    def __subclasscheck__(cls, subclass):
        return issubclass(subclass, cls._real)


class _GuardedDateTime(_datetime.datetime, metaclass=_RealTypeChecks):
    """``datetime.datetime`` with ``now``/``utcnow``/``today`` guarded."""

    _real = _datetime.datetime

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        return handler(_datetime.datetime)

    @classmethod
    def now(cls, tz=None):
        _check("datetime.now()", "ctx.now()")
        return super().now(tz)

    @classmethod
    def utcnow(cls):
        _check("datetime.utcnow()", "ctx.now()")
        return super().now(_datetime.UTC).replace(tzinfo=None)

    @classmethod
    def today(cls):
        _check("datetime.today()", "ctx.now()")
        return super().today()


class _GuardedDate(_datetime.date, metaclass=_RealTypeChecks):
    _real = _datetime.date

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        return handler(_datetime.date)

    @classmethod
    def today(cls):
        _check("date.today()", "ctx.now().date()")
        return super().today()


_RANDOM = "ctx.random_u64(...) or ctx.random_string(...)"
# module -> {attribute: (what the error calls it, what to use instead)}
_GUARDED: dict[types.ModuleType, dict[str, tuple[str, str]]] = {
    time: {
        name: (f"time.{name}()", "ctx.now()")
        for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns")
    }  # fmt: skip
    | {"sleep": ("time.sleep()", "ctx.sleep(timedelta(...))")},
    random: {
        name: (f"random.{name}()", _RANDOM)
        for name in (
            "random",
            "randint",
            "randrange",
            "choice",
            "choices",
            "shuffle",
            "sample",
            "uniform",
            "getrandbits",
            "randbytes",
            "gauss",
        )
    },  # fmt: skip
    uuid: {"uuid1": ("uuid.uuid1()", "ctx.uuid()"), "uuid4": ("uuid.uuid4()", "ctx.uuid()")},
    os: {"urandom": ("os.urandom()", _RANDOM), "getrandom": ("os.getrandom()", _RANDOM)},
    secrets: {
        name: (f"secrets.{name}()", _RANDOM)
        for name in ("token_bytes", "token_hex", "token_urlsafe", "randbelow", "choice", "randbits")
    },  # fmt: skip
}


class _GuardedModule(types.ModuleType):
    """A stand-in for a standard module inside a workflow module: guarded functions, the
    rest delegated to the real module."""

    def __init__(self, real: types.ModuleType, overrides: dict):
        super().__init__(real.__name__, real.__doc__)
        self.__dict__.update(overrides)
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)


def _guarded_callables() -> dict[int, object]:
    """id(original) -> guarded replacement, for names imported from the guarded modules."""
    out: dict[int, object] = {id(_datetime.datetime): _GuardedDateTime, id(_datetime.date): _GuardedDate}
    for module, names in _GUARDED.items():
        for attribute, (name, instead) in names.items():
            original = getattr(module, attribute, None)
            if original is not None:
                out[id(original)] = _guard(original, name, instead)
    return out


def _proxies(replacements: dict[int, object]) -> dict[int, types.ModuleType]:
    """id(module) -> its stand-in, whose guarded functions are ``replacements``'."""
    proxies = {id(_datetime): _GuardedModule(_datetime, {"datetime": _GuardedDateTime, "date": _GuardedDate})}
    for module, names in _GUARDED.items():
        overrides = {a: replacements[id(getattr(module, a))] for a in names if hasattr(module, a)}
        proxies[id(module)] = _GuardedModule(module, overrides)
    return proxies


_REPLACEMENTS: dict[int, object] | None = None


def guard_module(module: types.ModuleType) -> None:
    """Rebind ``module``'s names of non-deterministic functions and modules to guarded ones
    (idempotent)."""
    global _REPLACEMENTS
    if _REPLACEMENTS is None:
        callables = _guarded_callables()
        _REPLACEMENTS = {**callables, **_proxies(callables)}
    namespace = vars(module)
    for name, value in list(namespace.items()):
        replacement = _REPLACEMENTS.get(id(value))
        if replacement is not None:
            namespace[name] = replacement
