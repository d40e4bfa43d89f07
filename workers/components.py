"""The components a worker serves: the modules named in ``OBELISK['COMPONENT_MODULES']``.

Importing a module runs its decorators (``workers/activity.py``, ``workers/workflow.py``),
which fill the registry (``workers/registry.py``); this module is the runtime's side of
that: it reads the setting, imports each module, and turns a typo in the setting into an
error that names it. The authoring API itself reads no settings.
"""

from __future__ import annotations

import importlib

from executions import conf
from workers.registry import Function, RegistrationError, registered


def load_components(modules: list[str] | None = None) -> dict[str, Function]:
    """Import the component modules (``OBELISK['COMPONENT_MODULES']``) and return the registry."""
    if modules is None:
        modules = conf.get("COMPONENT_MODULES")
    for module in modules:
        if module and module.strip():
            _import_component(module.strip())
    return registered()


def _import_component(module: str) -> None:
    """Import one component module; one that does not exist is a ``RegistrationError`` that
    names it and the setting (a typo there is the usual cause), not a traceback. An import
    error *inside* an existing module is the module's own bug: its traceback is kept."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if not missing or not (module == missing or module.startswith(missing + ".")):
            raise
        raise RegistrationError(
            f"component module `{module}` does not exist (no module named `{missing}`): fix "
            "OBELISK_COMPONENT_MODULES (OBELISK['COMPONENT_MODULES']), a comma-separated list of "
            "modules importable from the project, such as `myapp.activities,myapp.workflows`"
        ) from None
