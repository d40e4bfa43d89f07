"""Reading a stored deployment: its functions with their effective settings, and a diff.

A function's effective settings are its decorator's (recorded in its component's
``exports_json``) overridden by the deployment's manifest, per component then per function.
``diff_lines`` compares two deployments: components added, removed or whose digest changed;
functions added or removed; settings that changed. Used by ``obelisk_deploy show`` and
``diff``; pure over ``store.DeploymentRecord``. why: D110.
"""

from __future__ import annotations

from datetime import timedelta

from deployments.manifest import DURATION_KEYS, format_duration, is_manifest_text, parse_manifest


def effective_functions(record) -> dict[str, dict]:
    """Function name → ``{"component", "kind", "settings"}`` for a stored deployment."""
    manifest = parse_manifest(record.toml, record.deployment_id) if is_manifest_text(record.toml) else None
    functions = {}
    for component in record.components:
        module = component["name"].partition(":")[0]
        for export in component["exports"]:
            settings = dict(export.get("settings") or {})
            if manifest is not None:
                settings.update(_readable(manifest.settings_of(module, export["ffqn"])))
            functions[export["ffqn"]] = {
                "component": component["name"],
                "kind": component["type"],
                "settings": settings,
            }
    return dict(sorted(functions.items()))


def _readable(settings: dict) -> dict:
    """Normalised manifest settings (durations in milliseconds) as the manifest writes them."""
    shown = {}
    for key, value in settings.items():
        if key in DURATION_KEYS:
            value = format_duration(timedelta(milliseconds=value))
        elif key == "max_retries" and value is None:
            value = "forever"
        shown[key] = value
    return shown


def describe_lines(record) -> list[str]:
    """``obelisk_deploy show``: the deployment, its components, functions and files."""
    lines = [
        f"deployment {record.deployment_id} ({record.status})",
        f"digest: {record.digest}",
        f"created: {record.created_at:%Y-%m-%d %H:%M:%S} UTC"
        + (f" by {record.created_by}" if record.created_by else ""),
    ]
    if record.description:
        lines.append(f"description: {record.description}")
    lines.append("components:")
    lines += [f"  {c['name']} ({c['type']}) {c['digest']}" for c in record.components]
    lines.append("functions:")
    for ffqn, function in effective_functions(record).items():
        lines.append(f"  {ffqn} [{function['component']}] {_settings_text(function['settings'])}")
    lines.append("files:")
    lines += [f"  {path} {digest}" for path, digest in record.files]
    return lines


def _settings_text(settings: dict) -> str:
    return " ".join(f"{key}={value}" for key, value in sorted(settings.items()))


def diff_lines(a, b) -> list[str]:
    """What changed from deployment ``a`` to ``b``: ``+`` added, ``-`` removed, ``~`` changed."""
    lines = []
    components_a = {c["name"]: c["digest"] for c in a.components}
    components_b = {c["name"]: c["digest"] for c in b.components}
    for name in sorted(set(components_a) | set(components_b)):
        before, after = components_a.get(name), components_b.get(name)
        if before is None:
            lines.append(f"+ component {name} {after}")
        elif after is None:
            lines.append(f"- component {name} {before}")
        elif before != after:
            lines.append(f"~ component {name} {before} -> {after}")
    functions_a, functions_b = effective_functions(a), effective_functions(b)
    for ffqn in sorted(set(functions_a) | set(functions_b)):
        if ffqn not in functions_a:
            lines.append(f"+ function {ffqn} [{functions_b[ffqn]['component']}]")
        elif ffqn not in functions_b:
            lines.append(f"- function {ffqn} [{functions_a[ffqn]['component']}]")
        else:
            lines += _settings_diff(ffqn, functions_a[ffqn]["settings"], functions_b[ffqn]["settings"])
    return lines


def _settings_diff(ffqn: str, before: dict, after: dict) -> list[str]:
    return [
        f"~ function {ffqn} {key}: {before.get(key, '-')} -> {after.get(key, '-')}"
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    ]
