"""DBOS's side of ``bench/workflows.py``'s one-step shape: a workflow with one no-op step,
``DBOS.start_workflow(wf).get_result()`` back to back, p50 and p99 (ms).

Our own script, not the baseline's: run with the DBOS baseline's virtualenv python
(``${DBOS_VENV:-${TMPDIR:-/tmp}/dbos-baseline-venv}/bin/python``, made by
``../shared/baselines/dbos/run.sh``), it imports nothing of this project. It creates a
database of its own name on the server it is given and drops it at the end, so that it
never touches another run's (why: D106)::

    python bench/dbos_one_step.py ADMIN_URL DATABASE_NAME [COUNT]

and prints one JSON line ``{"system": "dbos", "workload": "one_step", "n": …, "p50_ms": …,
"p99_ms": …}``. The time is the client's: from ``start_workflow`` to the result in hand,
the same span as the engine's ``client.submit`` → ``client.wait``.
"""

import json
import sys
import time
from urllib.parse import urlparse, urlunparse

import psycopg
from dbos import DBOS


def admin_connection(url: str) -> psycopg.Connection:
    parts = urlparse(url.replace("postgresql://", "postgres://", 1))
    return psycopg.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username or "postgres",
        password=parts.password,
        dbname="postgres",
        autocommit=True,
    )


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


@DBOS.step()
def noop_step() -> None:
    return None


@DBOS.workflow()
def one_step() -> None:
    noop_step()


def measure(count: int) -> list[float]:
    """``count`` submissions one after another, each waited for: ms each."""
    for _ in range(5):  # warm-up: connections, prepared statements, the executor's threads
        DBOS.start_workflow(one_step).get_result()
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        DBOS.start_workflow(one_step).get_result()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    admin_url, name = sys.argv[1], sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    with admin_connection(admin_url) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # fails if it exists: then it is not ours
    try:
        parts = urlparse(admin_url.replace("postgres://", "postgresql://", 1))
        url = urlunparse(parts._replace(path=f"/{name}"))
        DBOS(config={"name": "obelisk-bench-one-step", "system_database_url": url, "log_level": "WARNING"})
        DBOS.launch()
        try:
            samples = measure(count)
        finally:
            DBOS.destroy()
        record = {
            "system": "dbos",
            "workload": "one_step",
            "n": count,
            "p50_ms": round(percentile(samples, 0.5), 3),
            "p99_ms": round(percentile(samples, 0.99), 3),
        }
        print(json.dumps(record), flush=True)
    finally:
        with admin_connection(admin_url) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
