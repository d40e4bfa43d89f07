"""Two checkouts on one PostgreSQL server leave each other alone (D106).

``scripts/test.sh`` used the fixed test database ``test_obelisk``, and ``bench/`` dropped and
recreated ``obelisk_bench`` and ``q2claim_baseline`` WITH (FORCE) on whatever server it was
given (leaving ``q2claim_baseline`` behind): a second checkout's run killed the first's. The
names now come from the checkout (and the process) or the environment, and a run drops only
what it created. Run as real processes, on the PostgreSQL server of the test run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg
import pytest
from django.db import connection

from tests.support.clusters import current_database_url
from tests.support.processes import REPO, clean_env

pytestmark = pytest.mark.slow


@pytest.fixture
def admin_url():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: database names on a shared server")
    url = current_database_url()
    return url[: url.rindex("/")] + "/postgres"


def databases(admin_url: str) -> set[str]:
    """The databases these tests' benchmarks make, or q2claim's (others come and go)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        names = {name for (name,) in conn.execute("SELECT datname FROM pg_database")}
    return {name for name in names if "obelisk_bench_probe" in name or "q2claim" in name}


def bench_python(code: str, admin_url: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a process of this checkout's benchmarks (``bench/``), on ``admin_url``'s server."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=clean_env(BENCH_DATABASE_URL=admin_url, PYTHONPATH=str(REPO), DJANGO_SECRET_KEY="k" * 50, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_test_script_names_its_test_database_after_the_checkout(admin_url):
    """``scripts/test.sh`` gives pytest-django ``test_obelisk_<checkout tag>`` (the tag of
    bench/run.py too), unless ``OBELISK_TEST_DATABASE_NAME`` says otherwise. (Collecting
    only: no database is made.)"""
    from bench.run import CHECKOUT_TAG

    argv = ["scripts/test.sh", "--collect-only", "-q", "tests/store/test_ids.py"]
    env = clean_env(OBELISK_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:1/postgres")
    derived = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert derived.returncode == 0, derived.stdout + derived.stderr
    assert f"test database test_obelisk_{CHECKOUT_TAG})" in derived.stdout, derived.stdout
    env["OBELISK_TEST_DATABASE_NAME"] = "test_obelisk_mine"
    chosen = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert "test database test_obelisk_mine)" in chosen.stdout, chosen.stdout


def test_a_benchmark_never_drops_a_database_it_did_not_create(admin_url):
    """A database of the name a benchmark is told to use exists already: the benchmark
    stops with a message, and the database and its rows are still there."""
    name = f"h7_not_the_benchmarks_{os.getpid()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    try:
        code = "from bench.support import own_database\nwith own_database('obelisk_bench_probe'): pass"
        result = bench_python(code, admin_url, OBELISK_BENCH_DATABASE_NAME=name)
        assert result.returncode != 0
        assert f"database {name} exists already" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        with psycopg.connect(admin_url, autocommit=True) as conn:
            assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_a_benchmark_database_is_named_after_the_checkout_and_process_and_dropped_at_the_end(admin_url):
    from bench.run import CHECKOUT_TAG

    before = databases(admin_url)
    code = (
        "import os\nfrom bench.support import own_database\n"
        "with own_database('obelisk_bench_probe') as url: print(url.rsplit('/', 1)[1], os.getpid())"
    )
    result = bench_python(code, admin_url)
    assert result.returncode == 0, result.stderr
    name, pid = result.stdout.split()
    assert name == f"obelisk_bench_probe_{CHECKOUT_TAG}_{pid}"
    assert databases(admin_url) == before  # created, then dropped; nothing else touched


def test_the_q2claim_baseline_runs_on_a_database_of_its_own_and_drops_it(admin_url):
    """The baseline is found next to the repository (``../shared/baselines/q2claim``), runs
    on ``<BENCH_DB>_q2claim``, and leaves the server's databases as they were (its run.sh
    left ``q2claim_baseline`` behind, after dropping any other run's WITH (FORCE))."""
    from bench.run import Q2CLAIM_DIR

    if not (Q2CLAIM_DIR / "bench.py").exists():
        pytest.skip(f"no q2claim baseline at {Q2CLAIM_DIR}")
    assert Q2CLAIM_DIR == REPO.parent / "shared" / "baselines" / "q2claim"
    before = databases(admin_url)
    code = (
        "import json, os, sys\nimport bench.run as r\n"
        "print(json.dumps(r.q2claim(os.environ['BENCH_DATABASE_URL'], 200, 10)))"
    )
    result = bench_python(code, admin_url)
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["A"]["jobs_s"] > 0 and figures["B"]["p50"] > 0
    assert databases(admin_url) == before
