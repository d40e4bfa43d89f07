"""The determinism guard (spec 002 §8.2): inside workflow code, the usual sources of time and
randomness raise a clear error that names the ``ctx`` call to use instead.

A workflow is replayed from its log after every crash, so it must compute the same thing
every time: wall-clock time, random numbers and fresh UUIDs would differ on replay. The
durable versions live on the context and are recorded in the log on the first run
(``ctx.now()``, ``ctx.random_u64()``, ``ctx.random_string()``, ``ctx.uuid()``).

Two ways in, both covered (D99):

- the workflow module's own names: ``guard_module(module)`` (called by ``@workflow`` for the
  module that defines the workflow) rebinds them: ``time``, ``random``, ``uuid``, ``os``,
  ``secrets`` and ``datetime`` become proxies whose non-deterministic functions (and
  classes: ``random.Random()`` without a seed, ``SystemRandom``, ``datetime.now()``) are
  guarded, and names imported from them (``from time import time``) their guarded versions;
- imports executed by that module's code while a workflow runs (``import time`` inside the
  workflow function, ``from time import time``, ``import datetime as d``): an import hook
  (``builtins.__import__``, wrapped once) hands such an import the same proxies. Any other
  import, or one outside a workflow run, gets the real module after one thread-local read.

Nothing else is patched: other modules, the engine's own code in the workflow's thread
(clock reads, ULIDs, store writes), ``logging`` and libraries see the standard library as
it is. A guarded function raises only while a workflow runs in the calling thread
(``guarding()``); otherwise it behaves as the original (an activity in a workflow module).
"""

from __future__ import annotations

import builtins
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


class _State(threading.local):
    depth = 0  # workflow code runs in this thread (``guarding``); a class default: no lookup miss


_state = _State()


class DeterminismError(RuntimeError):
    """Workflow code called something that differs on replay."""


@contextlib.contextmanager
def guarding():
    """Workflow code runs inside (in this thread)."""
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1


@contextlib.contextmanager
def unguarded():
    """Code that is not the workflow's runs inside, in a workflow's thread (a local child,
    D124): the guard is off for it, and back as it was after."""
    depth, _state.depth = _state.depth, 0
    try:
        yield
    finally:
        _state.depth = depth


def _check(name: str, instead: str) -> None:
    if _state.depth:
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


class _GuardedRandom(random.Random, metaclass=_RealTypeChecks):
    """``random.Random``: seeded, it is deterministic and allowed; without a seed it seeds
    itself from the operating system."""

    _real = random.Random

    def __init__(self, x=None):
        if x is None:
            _check("random.Random()", _RANDOM)
        super().__init__(x)


class _GuardedSystemRandom(random.SystemRandom, metaclass=_RealTypeChecks):
    _real = random.SystemRandom

    def __init__(self, x=None):
        _check("random.SystemRandom()", _RANDOM)
        super().__init__(x)


def _guard_clock_default(original, name: str, arguments: int):
    """``time.localtime()`` and the like read the clock only when not given a time (their
    ``arguments``-th positional argument)."""

    @functools.wraps(original)
    def guarded(*args, **kwargs):
        if len(args) < arguments:
            _check(name, "ctx.now()")
        return original(*args, **kwargs)

    return guarded


# time function -> its positional arguments up to the time it formats (with fewer: the clock)
_CLOCK_DEFAULTS = {"localtime": 1, "gmtime": 1, "ctime": 1, "asctime": 1, "strftime": 2}
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
            "normalvariate",
            "lognormvariate",
            "expovariate",
            "vonmisesvariate",
            "gammavariate",
            "betavariate",
            "paretovariate",
            "weibullvariate",
            "triangular",
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
    out: dict[int, object] = {
        id(_datetime.datetime): _GuardedDateTime,
        id(_datetime.date): _GuardedDate,
        id(random.Random): _GuardedRandom,
        id(random.SystemRandom): _GuardedSystemRandom,
    }
    for module, names in _GUARDED.items():
        for attribute, (name, instead) in names.items():
            original = getattr(module, attribute, None)
            if original is not None:
                out[id(original)] = _guard(original, name, instead)
    for attribute, arguments in _CLOCK_DEFAULTS.items():
        original = getattr(time, attribute)
        out[id(original)] = _guard_clock_default(original, f"time.{attribute}()", arguments)
    return out


def _proxies(replacements: dict[int, object]) -> dict[int, types.ModuleType]:
    """id(module) -> its stand-in, whose guarded attributes are ``replacements``'."""
    proxies = {}
    for module in (time, random, uuid, os, secrets, _datetime):
        overrides = {name: replacements[id(value)] for name, value in vars(module).items() if id(value) in replacements}
        proxies[id(module)] = _GuardedModule(module, overrides)
    return proxies


_REPLACEMENTS: dict[int, object] = {}  # id(original function, class or module) -> guarded one
_PROXIES: dict[int, types.ModuleType] = {}  # id(module) -> its stand-in
_WORKFLOW_MODULES: set[str] = set()  # names of the guarded modules: their imports are guarded too
_real_import = builtins.__import__


def guard_module(module: types.ModuleType) -> None:
    """Rebind ``module``'s names of non-deterministic functions and modules to guarded ones,
    and guard the imports its code executes while a workflow runs (idempotent)."""
    if not _REPLACEMENTS:
        callables = _guarded_callables()
        _PROXIES.update(_proxies(callables))
        _REPLACEMENTS.update({**callables, **_PROXIES})
    if builtins.__import__ is not _guarded_import:
        builtins.__import__ = _guarded_import
    _WORKFLOW_MODULES.add(module.__name__)
    namespace = vars(module)
    for name, value in list(namespace.items()):
        replacement = _REPLACEMENTS.get(id(value))
        if replacement is not None:
            namespace[name] = replacement


def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    """``builtins.__import__``, which every ``import`` statement calls: an import that a
    workflow module's code executes while a workflow runs in this thread gets the guarded
    stand-in of a guarded module (``import time``, ``from time import time`` and ``import
    datetime as d`` inside the workflow function); everything else, the real module. The
    common case costs one thread-local read."""
    module = _real_import(name, globals, locals, fromlist, level)
    if _state.depth and globals is not None and globals.get("__name__") in _WORKFLOW_MODULES:
        return _PROXIES.get(id(module), module)
    return module
