"""Component digests: the SHA-256 of a component's kind and source files (issue 38 part 1).

A component is a Python module (one ``.py`` file) or a package (a directory), of one kind:
``activity`` or ``workflow`` (a module with both has two components). Its digest is the
SHA-256 of a canonical encoding: a version tag, the kind, then every ``*.py`` file sorted by
its posix path relative to the package directory (a plain module: its file name), each as
path, length and bytes. ``__pycache__`` and ``.pyc`` files, mtimes and the checkout's path
play no part, so the digest is the same on every machine and Python version.
Pure: hashlib, pathlib and importlib only, no Django (``workers.registry`` imports it).
why: D6, D110.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

ENCODING_TAG = b"obelisk-component-v1\0"
SKIPPED_DIRECTORIES = {"__pycache__"}


@dataclass(frozen=True)
class SourceFile:
    """One source file of a component: its path relative to the component's directory
    (``activities.py``, ``billing/charge.py``) and where it is on this machine."""

    relative_path: str
    location: Path

    def read(self) -> bytes:
        return self.location.read_bytes()


def source_files(origin: Path) -> list[SourceFile]:
    """The component's files, sorted by relative path. ``origin`` is a module's file, or a
    package's ``__init__.py`` or directory (then every ``*.py`` under it, recursively)."""
    origin = Path(origin)
    if origin.is_file() and origin.name != "__init__.py":
        return [SourceFile(origin.name, origin)]
    root = origin.parent if origin.is_file() else origin
    found = [
        SourceFile(path.relative_to(root).as_posix(), path)
        for path in root.rglob("*.py")
        if path.is_file() and not SKIPPED_DIRECTORIES.intersection(path.relative_to(root).parts)
    ]
    return sorted(found, key=lambda source: source.relative_path)


def digest_of_files(kind: str, files: list[SourceFile]) -> str:
    """``sha256:<hex>`` of the kind and the files, each as path, length and bytes."""
    sha = hashlib.sha256(ENCODING_TAG + kind.encode() + b"\0")
    for source in sorted(files, key=lambda f: f.relative_path):
        content = source.read()
        sha.update(source.relative_path.encode() + b"\0" + str(len(content)).encode() + b"\0")
        sha.update(content)
    return "sha256:" + sha.hexdigest()


def origin_of_module(module: str) -> Path:
    """Where the module's component lives: its file, or its package's directory. An
    imported module is looked up in ``sys.modules``; another is found without importing."""
    loaded = sys.modules.get(module)
    if loaded is not None and getattr(loaded, "__file__", None):
        path = Path(loaded.__file__)
        return path.parent if getattr(loaded, "__path__", None) is not None else path
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.has_location:
        raise ModuleNotFoundError(f"no module named `{module}`", name=module)
    path = Path(spec.origin)
    return path.parent if spec.submodule_search_locations is not None else path


def component_digest(module: str, kind: str) -> str:
    """The digest of ``module``'s component of ``kind`` (the module's file, or its whole
    package when ``module`` is a package)."""
    return digest_of_files(kind, source_files(origin_of_module(module)))


def import_root(module: str) -> Path:
    """The ``sys.path`` directory ``module`` is imported from (``demo.activities`` in
    ``/srv/app/demo/activities.py`` → ``/srv/app``): stored paths are relative to it."""
    root = origin_of_module(module)
    for _ in range(module.count(".") + 1):
        root = root.parent
    return root
