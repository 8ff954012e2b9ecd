"""Benchmark the dashboard's server time, in one run on this machine:

- an evaluation page of 143 tasks (every task of the suite graded, each with a stored trajectory), first view
  (trajectory summaries read from disk) and later views (summaries cached);
- a task page of 10 turns with 10 charts (a 120x80 PNG each), two produced files and the task's inputs.

The gateway app runs in this process against a real redis-server on loopback; each request goes through the whole
ASGI app (session lookup, access check, Redis reads, the store, Jinja2), and its time is the server's: there is no
network between. Targets: the evaluation page under 300 ms, the task page under 500 ms (median).

Prints a table, then one JSON line of figures (the last line).

Usage: python scripts/bench_dashboard.py [--requests 30] [--suite ../shared/pybench]
"""

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fastapi.testclient import TestClient  # noqa: E402
from redis import Redis  # noqa: E402

from gateway.app import create_app  # noqa: E402
from gateway.dashboard.summaries import CACHE  # noqa: E402
from services.store import ArtifactStore  # noqa: E402
from services.verdict import VerdictStatus  # noqa: E402
from tests import dashboard_data as data  # noqa: E402
from tests.fixtures import ADMIN_KEY, gateway_settings  # noqa: E402
from tests.servers import RedisServer  # noqa: E402

EVALUATION_TARGET_MS = 300.0
TASK_TARGET_MS = 500.0


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(client: TestClient, path: str, requests: int) -> list[float]:
    """Milliseconds of each of ``requests`` GETs of ``path``.

    Raises:
        RuntimeError: the page did not answer 200.
    """
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(path)
        samples.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"{path} answered {response.status_code}: {response.text[:300]}")
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--suite", type=Path, default=Path("../shared/pybench"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pbe-bench-dashboard-") as scratch:
        folder = Path(scratch)
        redis_server = RedisServer(folder, persistent=False)
        redis_server.start()
        try:
            return run(args, folder, redis_server.url)
        finally:
            redis_server.stop()


def run(args: argparse.Namespace, folder: Path, redis_url: str) -> int:
    redis = Redis.from_url(redis_url)
    store = ArtifactStore(folder / "artifacts")
    settings = gateway_settings(redis_url, args.suite.resolve(), folder / "artifacts", RATE_LIMIT_PER_MINUTE=100_000)
    with TestClient(create_app(settings), follow_redirects=False) as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        suite_tasks = [int(t["index"]) for t in client.get("/v1/suites/pybench/tasks").json()]
        full = data.submit(client, suite_tasks, "bench-model")
        runnable = [t for t in full["tasks"] if t not in full["unavailable_tasks"]]
        for index, task in enumerate(runnable):
            status = VerdictStatus.PASSED if index % 3 else VerdictStatus.FAILED
            data.finish(redis, store, full, task, status, turns=3, charts=1, judged=True)
        deep = data.submit(client, [44], "bench-deep")
        data.finish(redis, store, deep, 44, VerdictStatus.PASSED, turns=10, charts=10, judged=True)
        del client.headers["Authorization"]
        form = client.get("/dashboard/login").text
        found = re.search(r'name="csrf" value="([^"]+)"', form)
        login = {"key": ADMIN_KEY, "next": "/dashboard/runs", "csrf": found.group(1) if found else ""}
        if client.post("/dashboard/login", data=login).status_code != 303:
            raise RuntimeError("the dashboard refused the admin key's sign-in; is PBE_ADMIN_KEY the tests' key?")
        evaluation_path = f"/dashboard/evaluations/{full['id']}"
        task_path = f"/dashboard/evaluations/{deep['id']}/tasks/44"
        CACHE.__init__()  # type: ignore[misc]  # a first view reads every trajectory from disk
        first = timed(client, evaluation_path, 1)[0]
        evaluation = timed(client, evaluation_path, args.requests)
        task = timed(client, task_path, args.requests)
        page = client.get(task_path).text
        charts = len(re.findall(r'class="chart-output"', page))
        rows = len(re.findall(r"<tr>\s*<td><a href=\"/dashboard/evaluations/", client.get(evaluation_path).text))
    figures = {
        "evaluation_tasks": len(full["tasks"]),
        "evaluation_rows": rows,
        "evaluation_first_ms": round(first, 1),
        "evaluation_p50_ms": round(statistics.median(evaluation), 1),
        "evaluation_p95_ms": round(percentile(evaluation, 0.95), 1),
        "task_turns": 10,
        "task_charts": charts,
        "task_p50_ms": round(statistics.median(task), 1),
        "task_p95_ms": round(percentile(task, 0.95), 1),
        "requests": args.requests,
        "evaluation_target_met": statistics.median(evaluation) < EVALUATION_TARGET_MS,
        "task_target_met": statistics.median(task) < TASK_TARGET_MS,
    }
    print(f"{'page':<38} {'p50 ms':>8} {'p95 ms':>8} {'target':>8}")
    print(
        f"{'evaluation, ' + str(rows) + ' task rows':<38} {figures['evaluation_p50_ms']:>8} "
        f"{figures['evaluation_p95_ms']:>8} {'<300':>8}"
    )
    print(f"{'  first view (summaries from disk)':<38} {figures['evaluation_first_ms']:>8}")
    label = f"task, 10 turns, {charts} charts"
    print(f"{label:<38} {figures['task_p50_ms']:>8} {figures['task_p95_ms']:>8} {'<500':>8}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
