"""The executor's worker keeps RQ's own work loop and rides out Redis being away.

RQ's ``Worker.work`` ends the worker on any exception from one of its steps (the suspension check, maintenance,
the dequeue, the heartbeat). ``ExecutorWorker`` overrides those hooks so that they wait for Redis instead: the
steps are called here with Redis gone (a real redis-server, stopped), and a whole ``rq worker`` process is taken
through an outage longer than its connection's own retries, a session running throughout.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry
from rq import Queue
from rq.exceptions import StopRequested
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from rq.suspension import resume, suspend

from services.settings import redis_retry_window_s
from tests.servers import RedisServer
from tests.workers import ExecutorWorkerForTests

QUEUE = "pbe-redis-outage-test"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    folder = tmp_path / "redis"
    folder.mkdir()
    server = RedisServer(folder)  # persistent: what was written before the outage is there after it
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_steps_of_rqs_loop_wait_for_redis_instead_of_ending_the_worker(server: RedisServer) -> None:
    connection = Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))  # each command fails at once
    queue = Queue(QUEUE, connection=connection, serializer=JSONSerializer)
    worker = ExecutorWorkerForTests([queue], connection=connection, serializer=JSONSerializer)
    server.stop()
    with pytest.raises(RedisConnectionError):
        connection.ping()  # Redis is gone: RQ's own steps would raise this and end the loop

    worker.heartbeat()
    worker.run_maintenance_tasks()
    back = threading.Timer(2.0, server.start)  # the suspension check waits for Redis, then checks
    back.start()
    started = time.monotonic()
    try:
        worker.check_for_suspension(False)
    finally:
        back.join()
    assert 1.9 <= time.monotonic() - started < 10

    worker._stop_requested = True  # as after SIGTERM: the dequeue ends RQ's loop the way RQ expects
    with pytest.raises(StopRequested):
        worker.dequeue_job_and_maintain_ttl(None)


@pytest.mark.slow
def test_a_worker_rides_out_an_outage_longer_than_its_retries_and_its_session_goes_on(
    server: RedisServer, tmp_path: Path
) -> None:
    """A session runs through the outage; the loop meets it in RQ's suspension check (``rq suspend``, deterministic:
    a suspended worker waits there, asking Redis every second), where RQ alone would end the worker."""
    redis = Redis.from_url(server.url)
    queue = Queue(QUEUE, connection=redis, serializer=JSONSerializer)
    outage = redis_retry_window_s() + 15  # every Redis call of the worker gives up at least once
    session = queue.enqueue_call("time.sleep", args=(outage + 20,), job_id="pbe-outage-session", timeout=3600)
    env = {**os.environ, "PBE_REDIS_URL": server.url, "PBE_WARM_POOL": "false"}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "rq.cli", "worker", "--url", server.url, "--worker-class",
             "tests.workers.ExecutorWorkerForTests", "--serializer", "rq.serializers.JSONSerializer", QUEUE],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for_status(redis, session.id, JobStatus.STARTED, 30, worker)
        suspend(redis)
        short = queue.enqueue_call("time.sleep", args=(0.1,), job_id="pbe-before-outage", timeout=60)
        wait_for_status(redis, short.id, JobStatus.FINISHED, 30, worker)  # the next turn of the loop: suspended
        time.sleep(2)
        server.stop()
        time.sleep(outage)
        assert worker.poll() is None, f"the worker ended while Redis was away:\n{tail(log)}"
        server.start()
        redis = Redis.from_url(server.url)
        wait_for_status(redis, session.id, JobStatus.FINISHED, 60, worker)
        resume(redis)
        after = Queue(QUEUE, connection=redis, serializer=JSONSerializer).enqueue_call(
            "time.sleep", args=(0.1,), job_id="pbe-after-outage", timeout=60
        )
        wait_for_status(redis, after.id, JobStatus.FINISHED, 60, worker)
        assert "Redis is away" in log.read_text(errors="replace"), f"the worker never met the outage:\n{tail(log)}"
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, tail(log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            worker.kill()
        worker.wait(timeout=10)


def wait_for_status(redis: Redis, job_id: str, status: JobStatus, timeout_s: float, worker: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while Job.fetch(job_id, connection=redis, serializer=JSONSerializer).get_status() != status:
        assert worker.poll() is None, (
            f"the worker ended (exit status {worker.returncode}) before job {job_id} was {status}"
        )
        assert time.monotonic() < deadline, f"job {job_id} not {status} within {timeout_s:.0f} s"
        time.sleep(0.2)


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]
