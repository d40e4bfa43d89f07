"""A manifest is read strictly: every mistake is one error naming the file, line and key,
and what it means (not how it is laid out) decides the deployment's digest."""

from __future__ import annotations

import pytest

from deployments.manifest import ManifestError, deployment_digest, duration_millis, parse_manifest

GOOD = """\
# billing
description = "v2"

[[component]]
module = "billing.activities"
max_retries = 3
timeout = "30s"

[component.functions."py:billing/activities.charge"]
timeout = "5s"
lock_duration = "1m"

[[component]]
module = "billing.workflows"
blocking = "interrupt"
max_retries = "forever"
"""


def error_of(text: str) -> str:
    with pytest.raises(ManifestError) as raised:
        parse_manifest(text, "deploy/obelisk.toml")
    return str(raised.value)


def test_settings_are_read_per_component_and_per_function():
    manifest = parse_manifest(GOOD)
    assert manifest.description == "v2"
    assert manifest.settings_of("billing.activities", "py:billing/activities.charge") == {
        "lock_duration": 60_000,
        "max_retries": 3,
        "timeout": 5_000,
    }
    assert manifest.settings_of("billing.activities", "py:billing/activities.refund") == {
        "max_retries": 3,
        "timeout": 30_000,
    }
    assert manifest.settings_of("billing.workflows", "x") == {"blocking": "interrupt", "max_retries": None}


def test_durations_are_strings_with_a_unit():
    assert [duration_millis(v) for v in ("250ms", "30s", "5m", "1h", "1.5s")] == [250, 30_000, 300_000, 3_600_000, 1500]
    assert [duration_millis(v) for v in (30, "30", "30 sec", "")] == [None, None, None, None]


def test_the_same_meaning_gives_the_same_digest_whatever_the_layout():
    reordered = """\
description = "v2"

[[component]]
module = "billing.workflows"
max_retries = "forever"
blocking = "interrupt"   # a comment

[[component]]
module = "billing.activities"
timeout = "30000ms"
max_retries = 3
functions = { "py:billing/activities.charge" = { lock_duration = "60s", timeout = "5s" } }
"""
    digests = {"billing.activities": "sha256:" + "1" * 64, "billing.workflows:workflow": "sha256:" + "2" * 64}
    same = deployment_digest(parse_manifest(GOOD), digests)
    assert deployment_digest(parse_manifest(reordered), digests) == same
    assert deployment_digest(parse_manifest(GOOD.replace('"5s"', '"6s"')), digests) != same
    changed_code = {**digests, "billing.activities": "sha256:" + "3" * 64}
    assert deployment_digest(parse_manifest(GOOD), changed_code) != same


def test_invalid_toml_names_the_file_and_line():
    message = error_of('[[component]]\nmodule = "a"\ntimeout = "5s\n')
    assert message.startswith("deploy/obelisk.toml:3: invalid TOML")


@pytest.mark.parametrize(
    ("replace", "by", "expected"),
    [
        (
            'timeout = "30s"',
            "timeout = 30",
            'deploy/obelisk.toml:7: component[0].timeout: must be a duration such as "250ms"',
        ),
        ('timeout = "30s"', 'timeout = "0s"', "deploy/obelisk.toml:7: component[0].timeout: must be a duration"),
        (
            "max_retries = 3",
            "max_retries = -1",
            'deploy/obelisk.toml:6: component[0].max_retries: must be a whole number >= 0 or "forever"',
        ),
        (
            "max_retries = 3",
            "max_retries = true",
            "deploy/obelisk.toml:6: component[0].max_retries: must be a whole number",
        ),
        (
            'blocking = "interrupt"',
            'blocking = "wait"',
            'deploy/obelisk.toml:15: component[1].blocking: must be "await" or "interrupt"',
        ),
        (
            'lock_duration = "1m"',
            'lock_time = "1m"',
            'deploy/obelisk.toml:11: component[0].functions."py:billing/activities.charge".lock_time: unknown setting',
        ),
        ("max_retries = 3", "retries = 3", "deploy/obelisk.toml:6: component[0].retries: unknown key"),
        (
            'module = "billing.workflows"',
            'module = "billing workflows"',
            "deploy/obelisk.toml:14: component[1].module: must be a module or package name",
        ),
        (
            'module = "billing.workflows"',
            'module = "billing.activities"',
            "deploy/obelisk.toml:14: component[1].module: duplicate: `billing.activities`",
        ),
        ('description = "v2"', "descripton = 2", "deploy/obelisk.toml:2: descripton: unknown key"),
        ('description = "v2"', "description = 2", "deploy/obelisk.toml:2: description: must be a string"),
    ],
)
def test_each_bad_setting_names_the_file_line_and_key(replace, by, expected):
    assert replace in GOOD
    assert error_of(GOOD.replace(replace, by)).startswith(expected)


def test_a_package_and_its_module_both_listed_are_a_duplicate():
    text = '[[component]]\nmodule = "billing"\n\n[[component]]\nmodule = "billing.activities"\n'
    assert error_of(text).startswith("deploy/obelisk.toml:5: component[1].module: duplicate")


def test_a_manifest_without_components_is_refused():
    assert "add a [[component]] table" in error_of('description = "nothing"\n')
