"""Deployments through the faces: one made from a manifest's text, and an upgrade's dry run
against the code this process imports. The REST API (``routes/deployments.py``) and the
console's report page (``obelisk_site/upgrade_report.py``) share them, so both answer the
same questions in the same order: ids well-formed, both deployments known, a component
shared, then this process's code checked to be TO's, then the replay (``workers.upgrade``).

A manifest names modules this process imports; one of Python's standard library is refused
before any import (it exports no function, and importing some has side effects), so a
request cannot make the server import ``antigravity``. Each error is a store error with a
stable code: ``invalid_manifest`` (400), ``deployment_mismatch`` (409).
why: D110, D111.
"""

from __future__ import annotations

import sys

from deployments.manifest import ManifestError, parse_manifest
from executions import catalog, errors, store
from executions.ids import parse_deployment_id

MANIFEST_NAME = "obelisk.toml"  # how the request's manifest is named in its errors


class InvalidManifest(errors.ValidationFailed):
    """The manifest cannot be deployed: the message names the file, the line and the key."""

    code = "invalid_manifest"


class CodeMismatch(errors.Conflict):
    """The code this process imports is not the target deployment's."""

    code = "deployment_mismatch"


def new_from_manifest(text: str, *, created_by: str | None) -> store.NewDeployment:
    """The deployment of the manifest ``text`` and the code this process imports, ready for
    ``store.create_deployment``; ``InvalidManifest`` for any mistake in it."""
    from workers.components import new_deployment  # imports the manifest's components

    try:
        manifest = parse_manifest(text, MANIFEST_NAME)
        for entry in manifest.components:
            if entry.module.split(".")[0] in sys.stdlib_module_names:
                raise manifest.error(
                    f"`{entry.module}` is a module of Python's standard library, not a component",
                    component=entry,
                    key="module",
                )
        return new_deployment(manifest, created_by=created_by)
    except ManifestError as error:
        raise InvalidManifest(str(error)) from None


def dry_run(from_id: str, to_id: str):
    """The dry run of moving FROM's in-flight executions to TO's code (a ``workers.upgrade.Report``):
    ``InvalidId``, ``UnknownDeployment``, ``no_shared_component``, then ``CodeMismatch``
    when this process does not import TO's code. Writes nothing."""
    from workers import upgrade
    from workers.components import load_deployment
    from workers.registry import RegistrationError

    for deployment_id in (from_id, to_id):
        parse_deployment_id(deployment_id)
        catalog.get_deployment(deployment_id)
    upgrade.replaced_components(from_id, to_id)
    try:
        functions = load_deployment(to_id)
    except RegistrationError as error:
        raise CodeMismatch(f"this server cannot replay against {to_id}: {error}") from None
    return upgrade.dry_run(from_id, to_id, functions)
