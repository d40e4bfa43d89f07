"""The packages' floors hold: every import of the production code points down or sideways.

The floors are the list in ``docs/architecture.md`` (between ``floors: begin`` and
``floors: end``), read here so the document and the code cannot drift apart. Each module is
placed by the longest listed prefix of its name; every ``import`` and ``from … import`` is
walked, including those inside functions, because a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("executions", "deployments", "workers", "obelisk_api", "obelisk_site")


def floors() -> list[tuple[str, list[str]]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("<!-- floors: begin -->")[1].split("<!-- floors: end -->")[0]
    listed = []
    for line in block.strip().splitlines():
        name = re.search(r"\*\*(.+?)\*\*", line).group(1)
        listed.append((name, re.findall(r"`([\w.]+)`", line)))
    return listed


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules that ``path`` imports (a name imported from a package counts as
    its submodule when there is one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in known}
    return found


def floor_of(module: str, listed: list[tuple[str, list[str]]]) -> int | None:
    best: tuple[int, int] | None = None  # (length of the prefix, floor)
    for number, (_, prefixes) in enumerate(listed):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), number)
    return None if best is None else best[1]


def test_every_production_module_has_a_floor():
    listed = floors()
    unplaced = [module for module in modules() if floor_of(module, listed) is None]
    assert not unplaced, f"modules on no floor of docs/architecture.md: {unplaced}"


def test_no_import_points_up_a_floor():
    listed, known = floors(), modules()
    upward = []
    for module, path in known.items():
        own = floor_of(module, listed)
        for target in imports_of(path, known):
            theirs = floor_of(target, listed)
            if own is not None and theirs is not None and theirs > own:
                upward.append(f"{module} ({listed[own][0]}) imports {target} ({listed[theirs][0]})")
    assert not upward, "imports up a floor:\n" + "\n".join(sorted(upward))


def test_the_packages_have_no_cycle():
    known = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in known.items():
        for target in imports_of(path, known):
            if target.split(".")[0] != module.split(".")[0]:
                edges[module.split(".")[0]].add(target.split(".")[0])
    for package in PACKAGES:
        seen, stack = set(), list(edges[package])
        while stack:
            current = stack.pop()
            assert current != package, f"a package cycle through {package}: {dict(edges)}"
            if current not in seen:
                seen.add(current)
                stack.extend(edges[current])


@pytest.mark.parametrize("floor_name", ["Pure core", "Authoring API"])
def test_the_lower_floors_import_no_django(floor_name):
    """The pure core imports no Django at all; the authoring API none at import time either,
    so a user's module of activities imports without settings."""
    listed, known = floors(), modules()
    number = next(i for i, (name, _) in enumerate(listed) if name == floor_name)
    offenders = []
    for module, path in known.items():
        if floor_of(module, listed) != number or module.count(".") == 0 or module.endswith((".apps", ".management")):
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:  # top-level imports only: run-time ones are the caller's choice
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{module}: {name}" for name in names if name.split(".")[0] == "django"]
    assert not offenders, offenders
