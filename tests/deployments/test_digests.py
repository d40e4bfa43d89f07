"""A component's digest depends on its kind and source files only: the same for two
checkouts in different directories, whatever ``.pyc`` files or mtimes lie beside them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from deployments.digests import component_digest, digest_of_files, source_files
from tests.deployments.sample import forget_package, new_package_name, write_package

ROOT = Path(__file__).resolve().parents[2]


def digest_in_subprocess(directory: Path, module: str, kind: str) -> str:
    code = (
        "import sys; from deployments.digests import component_digest;"
        f"import {module}; print(component_digest({module!r}, {kind!r}))"
    )
    env = {**os.environ, "PYTHONPATH": f"{directory}{os.pathsep}{ROOT}"}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=directory, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_digest_is_the_same_for_two_checkouts_in_different_directories(tmp_path):
    package = new_package_name()
    first = write_package(tmp_path / "a", package)
    second = write_package(tmp_path / "deeper" / "checkout-b", package)
    (second / "__pycache__").mkdir()
    (second / "__pycache__" / "activities.cpython-311.pyc").write_bytes(b"\x00junk")
    (second / "stale.pyc").write_bytes(b"junk")
    os.utime(second / "activities.py", (1, 1))
    for kind in ("activity", "workflow"):
        package_digest = digest_in_subprocess(first.parent, package, kind)
        assert package_digest == digest_in_subprocess(second.parent, package, kind)
        assert package_digest.startswith("sha256:") and len(package_digest) == 71
    module = f"{package}.activities"
    assert digest_in_subprocess(first.parent, module, "activity") == digest_in_subprocess(
        second.parent, module, "activity"
    )


def test_a_digest_changes_with_a_byte_a_file_or_the_kind(tmp_path):
    root = write_package(tmp_path, new_package_name())
    before = digest_of_files("activity", source_files(root))
    assert before != digest_of_files("workflow", source_files(root))
    (root / "activities.py").write_text((root / "activities.py").read_text() + "\n")
    changed = digest_of_files("activity", source_files(root))
    assert changed != before
    (root / "extra.py").write_text("")
    assert digest_of_files("activity", source_files(root)) != changed


def test_a_package_digest_covers_its_py_files_by_relative_path(tmp_path):
    root = write_package(tmp_path, new_package_name())
    (root / "sub").mkdir()
    (root / "sub" / "deep.py").write_text("X = 1\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.py").write_text("ignored")
    (root / "notes.txt").write_text("ignored")
    paths = [f.relative_path for f in source_files(root)]
    assert paths == ["__init__.py", "activities.py", "sub/deep.py", "workflows.py"]
    assert [f.relative_path for f in source_files(root / "activities.py")] == ["activities.py"]


def test_the_registry_names_components_by_these_digests(tmp_path, monkeypatch):
    package = new_package_name()
    write_package(tmp_path, package)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        __import__(f"{package}.workflows")
        from workers.registry import lookup

        greet = lookup(f"py:{package}/activities.greet")
        welcome = lookup(f"py:{package}/workflows.welcome")
        assert greet.component_id.component_digest == component_digest(f"{package}.activities", "activity")
        assert welcome.component_id.name == f"{package}.workflows:workflow"
        assert welcome.component_id.component_digest == component_digest(f"{package}.workflows", "workflow")
    finally:
        forget_package(package)
