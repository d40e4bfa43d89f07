"""Fixtures of the deployment tests: a fresh sample package on ``sys.path`` and its manifest."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deployments.sample import forget_package, new_package_name, write_manifest, write_package


@dataclass
class Sample:
    directory: Path
    package: str
    manifest: Path

    def ffqn(self, name: str) -> str:
        module = "workflows" if name == "welcome" else "activities"
        return f"py:{self.package}/{module}.{name}"


@pytest.fixture
def sample(tmp_path, monkeypatch):
    """A package ``t4app_<hex>`` (activities ``greet``, ``add``; workflow ``welcome``)
    importable from ``tmp_path/code``, and ``tmp_path/obelisk.toml`` naming it."""
    package = new_package_name()
    code = tmp_path / "code"
    write_package(code, package)
    monkeypatch.syspath_prepend(str(code))
    yield Sample(code, package, write_manifest(tmp_path, package))
    forget_package(package)
