"""A killed executor worker is seen dead within seconds (issue: its task stayed ``running`` for an hour): a real
``rq worker`` process of ``ExecutorWorker`` (and of ``GraderWorker``) on a real Redis, killed with SIGKILL in the
middle of a job."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from redis import Redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from services.live.liveness import DEFAULT_HEARTBEAT_TTL_S
from services.queues import job_alive

QUEUE = "pbe-liveness-test"


@pytest.mark.slow
@pytest.mark.parametrize("worker_class", ["tests.workers.ExecutorWorkerForTests", "tests.workers.GraderWorkerForTests"])
def test_a_worker_killed_mid_job_is_dead_to_the_reconciler_within_its_heartbeat_ttl(
    redis_url: str, redis_client: Redis, worker_class: str
) -> None:
    job = Queue(QUEUE, connection=redis_client, serializer=JSONSerializer).enqueue_call(
        "time.sleep", args=(600,), job_id="pbe-liveness-job", timeout=3600
    )
    env = {**os.environ, "PBE_REDIS_URL": redis_url, "PBE_WARM_POOL": "false"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "rq.cli", "worker", "--url", redis_url, "--worker-class", worker_class,
         "--serializer", "rq.serializers.JSONSerializer", QUEUE],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the grader's job runs in a child: the test ends both
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while Job.fetch(job.id, connection=redis_client, serializer=JSONSerializer).get_status() != JobStatus.STARTED:
            assert time.monotonic() < deadline and worker.poll() is None, "the worker never started the job"
            time.sleep(0.2)
        time.sleep(2 * 5.0)  # a few heartbeats while the job runs: the key stays short-lived, the job alive
        assert job_alive(redis_client, job.id)
        name = Job.fetch(job.id, connection=redis_client, serializer=JSONSerializer).worker_name
        assert 0 < redis_client.ttl(f"rq:worker:{name}") <= DEFAULT_HEARTBEAT_TTL_S
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        killed = time.monotonic()
        while job_alive(redis_client, job.id):
            assert time.monotonic() - killed < DEFAULT_HEARTBEAT_TTL_S + 5, "the dead worker still looks alive"
            time.sleep(0.5)
        assert time.monotonic() - killed <= DEFAULT_HEARTBEAT_TTL_S + 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)


@pytest.mark.slow
def test_a_worker_that_cannot_reach_the_docker_engine_takes_no_session_and_says_why(
    redis_url: str, redis_client: Redis, tmp_path: Path
) -> None:
    job = Queue(QUEUE, connection=redis_client, serializer=JSONSerializer).enqueue_call(
        "time.sleep", args=(1,), job_id="pbe-no-engine-job", timeout=60
    )
    env = {
        **os.environ,
        "PBE_REDIS_URL": redis_url,
        "PBE_WARM_POOL": "false",
        "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock",  # as with the socket's group wrong: refused at once
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "rq.cli", "worker", "--url", redis_url, "--worker-class",
             "executor.worker.ExecutorWorker", "--serializer", "rq.serializers.JSONSerializer", QUEUE],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while b"not taking sessions" not in log.read_bytes():
            assert time.monotonic() < deadline and worker.poll() is None, log.read_text()[-2000:]
            time.sleep(0.5)
        time.sleep(3)  # a few of its checks later: still alive, still not taking the job, backing off
        assert worker.poll() is None
        assert Job.fetch(job.id, connection=redis_client, serializer=JSONSerializer).get_status() == JobStatus.QUEUED
        text = log.read_text()
        assert "cannot reach the Docker engine" in text and "DOCKER_GID" in text
        assert text.count("not taking sessions") <= 4, "no backoff between its checks"
    finally:
        worker.terminate()
        worker.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("worker_class", ["executor.worker.ExecutorWorker", "grader.worker.GraderWorker"])
def test_a_worker_refuses_a_job_that_is_not_the_projects_before_importing_it(
    redis_url: str, redis_client: Redis, worker_class: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    job = Queue(QUEUE, connection=redis_client, serializer=JSONSerializer).enqueue_call(
        "os.system", args=(f"touch {marker}",), job_id="pbe-foreign-job", timeout=60
    )
    env = {**os.environ, "PBE_REDIS_URL": redis_url, "PBE_WARM_POOL": "false", "PBE_METRICS_PORT": "0"}
    finished = subprocess.run(
        [sys.executable, "-m", "rq.cli", "worker", "--burst", "--url", redis_url, "--worker-class", worker_class,
         "--serializer", "rq.serializers.JSONSerializer", QUEUE],
        env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr.decode()[-2000:]
    refused = Job.fetch(job.id, connection=redis_client, serializer=JSONSerializer)
    assert refused.get_status() == JobStatus.FAILED
    result = refused.latest_result()
    assert result is not None and "ForeignJobError" in (result.exc_string or "")
    assert "not a pybench-eval job function" in (result.exc_string or "")
    assert not marker.exists(), "the worker ran a function the service never enqueues"
