"""The deployment manifest, ``obelisk.toml``: which components a deployment runs, and how.

Read with the standard library's ``tomllib``. It names components (a module or a package)
and, per component or per function, the settings that override the decorators' defaults:
``max_retries`` (a whole number, or ``"forever"``), ``backoff``, ``timeout``,
``lock_duration`` (durations as strings with a unit: ``"250ms"``, ``"30s"``, ``"5m"``,
``"1h"``) and ``blocking`` (``"await"`` or ``"interrupt"``, workflows only). Every mistake
is one ``ManifestError`` naming the file, the line and the key. The deployment digest is
the SHA-256 of the normalised manifest (canonical JSON) and its components' digests.
Pure: no Django. why: D110.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

DURATION_KEYS = ("backoff", "timeout", "lock_duration")
SETTING_KEYS = ("max_retries", *DURATION_KEYS, "blocking")
BLOCKING_STRATEGIES = ("await", "interrupt")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class ManifestError(Exception):
    """A manifest that cannot be deployed: ``<file>:<line>: <key>: <what is wrong>``."""

    def __init__(self, path: str, line: int | None, key: str, problem: str):
        self.path, self.line, self.key, self.problem = path, line, key, problem
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")


@dataclass(frozen=True)
class ComponentEntry:
    """One ``[[component]]``: its module or package, its settings and its functions'."""

    index: int
    module: str
    settings: dict
    functions: dict[str, dict] = field(default_factory=dict)

    def normalised(self) -> dict:
        return {"module": self.module, "settings": self.settings, "functions": self.functions}


@dataclass(frozen=True)
class Manifest:
    path: str
    text: str
    description: str | None
    components: tuple[ComponentEntry, ...]

    def normalised(self) -> dict:
        """What the manifest means, independent of its layout, order and comments."""
        entries = sorted((c.normalised() for c in self.components), key=lambda c: c["module"])
        return {"description": self.description, "components": entries}

    def settings_of(self, module: str, ffqn: str) -> dict:
        """The settings of one function: its component's, overridden by its own."""
        entry = next(c for c in self.components if c.module == module)
        return {**entry.settings, **entry.functions.get(ffqn, {})}

    def error(self, problem: str, *, component: ComponentEntry | None = None, function=None, key="") -> ManifestError:
        """A ``ManifestError`` at the line of ``key`` (in that component or function)."""
        line = line_of(self.text, component.index if component else None, function, key)
        return ManifestError(self.path, line, key_path(component, function, key), problem)


def key_path(component: ComponentEntry | None, function: str | None, key: str) -> str:
    parts = [f"component[{component.index}]"] if component is not None else []
    if function is not None:
        parts.append(f'functions."{function}"')
    if key:
        parts.append(key)
    return ".".join(parts)


def read_manifest(path: str | Path) -> Manifest:
    """Parse the manifest file at ``path``; a missing file is a ``ManifestError`` too."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ManifestError(str(path), None, "", f"cannot read the manifest: {error}") from None
    return parse_manifest(text, str(path))


def parse_manifest(text: str, path: str = "obelisk.toml") -> Manifest:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        line = getattr(error, "lineno", None) or _line_in_message(str(error))
        raise ManifestError(path, line, "", f"invalid TOML: {error}") from None
    shell = Manifest(path, text, None, ())
    unknown = sorted(set(data) - {"description", "component"})
    if unknown:
        raise shell.error('unknown key: a manifest has "description" and [[component]] tables', key=unknown[0])
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        raise shell.error("must be a string", key="description")
    raw_components = data.get("component")
    if not isinstance(raw_components, list) or not raw_components:
        raise shell.error("a manifest lists its components: add a [[component]] table with module = ...")
    components = tuple(_component(shell, index, raw) for index, raw in enumerate(raw_components))
    _check_overlaps(shell, components)
    return Manifest(path, text, description, components)


def _component(shell: Manifest, index: int, raw: dict) -> ComponentEntry:
    place = ComponentEntry(index, "", {})
    module = raw.get("module")
    if not isinstance(module, str) or not _MODULE.fullmatch(module):
        raise shell.error('must be a module or package name such as "myapp.activities"', component=place, key="module")
    for key in sorted(set(raw) - {"module", "functions", *SETTING_KEYS}):
        raise shell.error(f"unknown key; known: module, functions, {', '.join(SETTING_KEYS)}", component=place, key=key)
    settings = _settings(shell, place, None, {k: v for k, v in raw.items() if k in SETTING_KEYS})
    functions_raw = raw.get("functions", {})
    if not isinstance(functions_raw, dict):
        raise shell.error('must be tables: [component.functions."<function name>"]', component=place, key="functions")
    functions = {}
    for ffqn, function_raw in sorted(functions_raw.items()):
        if not isinstance(function_raw, dict):
            raise shell.error("must be a table of settings", component=place, function=ffqn)
        for key in sorted(set(function_raw) - set(SETTING_KEYS)):
            raise shell.error(
                f"unknown setting; known: {', '.join(SETTING_KEYS)}", component=place, function=ffqn, key=key
            )
        functions[ffqn] = _settings(shell, place, ffqn, function_raw)
    return ComponentEntry(index, module, settings, functions)


def _settings(shell: Manifest, place: ComponentEntry, function: str | None, raw: dict) -> dict:
    """Each setting checked and normalised (durations in milliseconds)."""
    settings = {}
    for key, value in raw.items():
        where = {"component": place, "function": function, "key": key}
        if key == "max_retries":
            if value != "forever" and (type(value) is not int or value < 0):
                raise shell.error(f'must be a whole number >= 0 or "forever", not {value!r}', **where)
            settings[key] = None if value == "forever" else value
        elif key == "blocking":
            if value not in BLOCKING_STRATEGIES:
                raise shell.error(f'must be "await" or "interrupt", not {value!r}', **where)
            settings[key] = value
        else:
            millis = duration_millis(value)
            if millis is None or (key != "backoff" and millis <= 0):
                raise shell.error(f'must be a duration such as "250ms", "30s", "5m" or "1h", not {value!r}', **where)
            settings[key] = millis
    return dict(sorted(settings.items()))


def _check_overlaps(shell: Manifest, components: tuple[ComponentEntry, ...]) -> None:
    """A module listed twice, or inside a package also listed, would export its functions
    twice: refused."""
    for entry in components:
        for earlier in components[: entry.index]:
            if (
                entry.module == earlier.module
                or entry.module.startswith(earlier.module + ".")
                or (earlier.module.startswith(entry.module + "."))
            ):
                raise shell.error(
                    f"duplicate: `{entry.module}` overlaps component[{earlier.index}] `{earlier.module}`",
                    component=entry,
                    key="module",
                )


def duration_millis(value) -> int | None:
    """``"250ms"`` → 250, ``"30s"`` → 30000; anything else (a bare number too) → None."""
    if not isinstance(value, str):
        return None
    match = _DURATION.fullmatch(value.strip())
    if match is None:
        return None
    return round(float(match.group(1)) * _UNIT_MS[match.group(2)])


def format_duration(duration: timedelta) -> str:
    """A timedelta as the manifest writes it: the largest unit that is exact."""
    millis = round(duration.total_seconds() * 1000)
    for unit in ("h", "m", "s"):
        if millis and millis % _UNIT_MS[unit] == 0:
            return f"{millis // _UNIT_MS[unit]}{unit}"
    return f"{millis}ms"


def deployment_digest(manifest: Manifest, component_digests: dict[str, str]) -> str:
    """SHA-256 of the normalised manifest and its components' digests (by name)."""
    document = {"manifest": manifest.normalised(), "components": dict(sorted(component_digests.items()))}
    encoded = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return "sha256:" + hashlib.sha256(encoded).hexdigest()


def is_manifest_text(text: str) -> bool:
    """A deployment made from a manifest (its components name a ``module``), not one a
    worker registered from its imported modules (``deployments.registration``)."""
    try:
        components = tomllib.loads(text).get("component")
    except tomllib.TOMLDecodeError:
        return False
    return isinstance(components, list) and bool(components) and all("module" in c for c in components)


def line_of(text: str, component: int | None, function: str | None, key: str) -> int | None:
    """The line of ``key`` in the manifest: in the n-th ``[[component]]``, in its function
    table when ``function`` is given; else the table's header line."""
    lines = text.splitlines()
    headers = [i for i, line in enumerate(lines) if re.match(r"\s*\[\[\s*component\s*\]\]", line)]
    start, end = 0, headers[0] if headers else len(lines)
    if component is not None and component < len(headers):
        start = headers[component]
        end = headers[component + 1] if component + 1 < len(headers) else len(lines)
    if function is not None:
        table = next((i for i in range(start, end) if lines[i].lstrip().startswith("[") and function in lines[i]), None)
        if table is not None:
            start = table
            end = next((i for i in range(table + 1, end) if lines[i].lstrip().startswith("[")), end)
    if key:
        pattern = re.compile(rf'\s*"?{re.escape(key)}"?\s*=')
        found = next((i for i in range(start, end) if pattern.match(lines[i])), None)
        if found is not None:
            return found + 1
    return start + 1 if lines else None


def _line_in_message(message: str) -> int | None:
    match = re.search(r"line (\d+)", message)
    return int(match.group(1)) if match else None
