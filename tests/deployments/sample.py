"""A small package of components written to a temporary directory, and its manifest.

Each test gets a package of its own name (``t4app_<hex>``), so its functions' names never
meet another test's in the process-wide registry; ``write_package`` puts it on a fresh
directory that the test adds to ``sys.path`` (or a subprocess's ``PYTHONPATH``).
"""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path

ACTIVITIES = """\
from datetime import timedelta

from workers.activity import activity


@activity(timeout=timedelta(seconds=60))
def greet(name: str) -> str:
    return f"hello {name}"


@activity
def add(a: int, b: int = 1) -> int:
    return a + b
"""

WORKFLOWS = """\
from workers.workflow import workflow

from {package}.activities import greet


@workflow
def welcome(ctx, name: str) -> str:
    return ctx.call(greet, name)
"""

MANIFEST = """\
description = "sample"

[[component]]
module = "{package}"
max_retries = 3
timeout = "30s"

[component.functions."py:{package}/activities.greet"]
timeout = "5s"
backoff = "250ms"
"""


def new_package_name() -> str:
    return f"t4app_{uuid.uuid4().hex[:10]}"


def write_package(directory: Path, package: str, *, activities: str = ACTIVITIES, workflows: str = WORKFLOWS) -> Path:
    """``<directory>/<package>/`` with ``__init__.py``, ``activities.py``, ``workflows.py``."""
    root = Path(directory) / package
    root.mkdir(parents=True, exist_ok=True)
    (root / "__init__.py").write_text("")
    (root / "activities.py").write_text(activities)
    (root / "workflows.py").write_text(textwrap.dedent(workflows).format(package=package))
    return root


def write_manifest(directory: Path, package: str, text: str = MANIFEST) -> Path:
    path = Path(directory) / "obelisk.toml"
    path.write_text(text.format(package=package))
    return path


def forget_modules(package: str) -> None:
    """Drop the package's modules from ``sys.modules`` (the registry keeps its functions)."""
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        del sys.modules[name]


def forget_package(package: str) -> None:
    """Drop the package's modules and its functions from the registry, so later tests that
    serve every registered function (the zero-configuration path) do not meet code that is
    gone (as ``tests/workflows/test_whole_workflows.py`` does)."""
    from workers import registry

    forget_modules(package)
    for spec in list(registry.registered().values()):
        if spec.module == package or spec.module.startswith(package + "."):
            del registry._FUNCTIONS[spec.ffqn]
