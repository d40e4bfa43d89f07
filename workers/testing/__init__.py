"""The testing toolkit for users' workflows (README, "Testing your workflows").

- ``run_workflow(fn, *args, activities=…, now=…, replay_check=…)``: a workflow run to its
  end in the test's own process, on the real test database, on virtual time, with
  activities stubbed per function (``environment``, ``clock``, ``stubs``);
- ``replay(fn, history)``: an exported history (``GET /api/v1/executions/{id}/export``, the
  console's download, ``obelisk_status ID --export``) replayed against the current code,
  with the deployment dry run's replay (``replaying``);
- the pytest plugin (``plugin``): the fixtures ``obelisk_env`` and ``obelisk_worker``;
- ``submit`` and ``current_deployment_id``: submitting from a process that imports the
  code (``deployment``).

Names are imported on first use: pytest loads the plugin, and so this package, before
Django is set up. why: D120–D123
"""

from __future__ import annotations

import importlib

_NAMES = {
    "submit": "deployment",
    "current_deployment_id": "deployment",
    "_deployment_for": "deployment",
    "run_workflow": "environment",
    "WorkflowRun": "environment",
    "Stuck": "environment",
    "UnusedStubWarning": "environment",
    "sequence": "stubs",
    "timed_out": "stubs",
    "Call": "stubs",
    "StubError": "stubs",
    "UnusedStubs": "stubs",
    "replay": "replaying",
    "HistoryError": "replaying",
    "Nondeterministic": "replaying",
    "ReplayVerdict": "replaying",
    "VirtualClock": "clock",
}

__all__ = sorted(name for name in _NAMES if not name.startswith("_"))


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'workers.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"workers.testing.{module}"), name)
    globals()[name] = value
    return value
