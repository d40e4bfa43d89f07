"""How long a user's workflow test takes with the testing toolkit (issue 41's figures).

The workflow: five activities and a one-hour sleep (``tests.support.toolkit_components.
five_steps_and_an_hour``). Three ways, each a pytest test repeated, timed by pytest
(setup + call + teardown, so the fixture's database work counts):

- ``obelisk_env`` on SQLite and on PostgreSQL: in-process, the hour in virtual time;
- ``obelisk_worker`` on the same databases: a real cluster started and stopped around each
  test (a real cluster cannot skip time: the sleep is one second there).

    python bench/testing_toolkit.py [--repeat 30] [--worker-repeat 3]

with the test environment of ``scripts/test.sh`` (``OBELISK_TEST_DATABASE_URL`` …). Run by
pytest itself (below), this file is the tests it times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from xml.etree import ElementTree

import pytest

REPO = Path(__file__).resolve().parents[1]
REPEAT = int(os.environ.get("OBELISK_BENCH_REPEAT", "30"))
WORKER_REPEAT = int(os.environ.get("OBELISK_BENCH_WORKER_REPEAT", "3"))

if os.environ.get("OBELISK_BENCH_TESTS"):  # collected by the pytest run below (``-p workers.testing.plugin``)

    @pytest.mark.parametrize("round_", range(REPEAT))
    def test_in_process(obelisk_env, round_):
        from tests.support.toolkit_components import five_steps_and_an_hour

        run = obelisk_env.run(five_steps_and_an_hour, 1)
        assert run.value["n"] == 6 and run.elapsed.total_seconds() == 3600

    @pytest.mark.django_db(transaction=True)
    @pytest.mark.obelisk_worker(modules=["tests.support.toolkit_components"])
    @pytest.mark.parametrize("round_", range(WORKER_REPEAT))
    def test_on_worker(obelisk_worker, round_):
        from tests.support.toolkit_components import five_steps_and_an_hour

        retval = obelisk_worker.run(five_steps_and_an_hour, 1, 1.0, timeout=60)
        assert retval.value["n"] == 6


def measure(settings: str, repeat: int, worker_repeat: int) -> dict[str, list[float]]:
    """Milliseconds per test (setup + call + teardown), by kind, under ``settings``."""
    env = {
        **os.environ,
        "OBELISK_BENCH_TESTS": "1",
        "OBELISK_BENCH_REPEAT": str(repeat),
        "OBELISK_BENCH_WORKER_REPEAT": str(worker_repeat),
    }
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.xml"
        command = [
            sys.executable, "-m", "pytest", __file__, f"--ds={settings}", "-q",
            "-p", "no:cacheprovider", "-p", "workers.testing.plugin",
            "-o", "addopts=", "-o", "python_files=*.py", "-o", "junit_duration_report=total", f"--junitxml={report}",
        ]  # fmt: skip
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"{settings}: the timed tests failed:\n{result.stdout[-4000:]}{result.stderr[-2000:]}")
        cases = ElementTree.parse(report).getroot().iter("testcase")
        by_kind: dict[str, list[float]] = defaultdict(list)
        for case in cases:  # junit's time: setup + call + teardown, to the millisecond
            by_kind[case.get("name").partition("[")[0]].append(float(case.get("time")) * 1000)
    return by_kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=REPEAT)
    parser.add_argument("--worker-repeat", type=int, default=WORKER_REPEAT)
    args = parser.parse_args()
    print("five activities and a one-hour sleep, ms per test (setup + call + teardown)")
    print(f"{'database':<12}{'way':<34}{'tests':>6}{'median':>10}{'mean':>10}{'min':>10}")
    for label, settings in (("SQLite", "tests.settings_sqlite"), ("PostgreSQL", "tests.settings_postgres")):
        found = measure(settings, args.repeat, args.worker_repeat)
        for name, way in (
            ("test_in_process", "obelisk_env (virtual hour)"),
            ("test_on_worker", "obelisk_worker (1 s sleep)"),
        ):
            ms = found.get(name, [])
            if not ms:
                continue
            # The first test of a run pays the imports and the deployment's registration.
            steady = ms[1:] if len(ms) > 2 else ms
            print(
                f"{label:<12}{way:<34}{len(ms):>6}{statistics.median(steady):>10.1f}"
                f"{statistics.mean(steady):>10.1f}{min(ms):>10.1f}"
            )


if __name__ == "__main__":
    main()
