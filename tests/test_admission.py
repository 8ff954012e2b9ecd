"""The admission window against a real Redis: an evaluation never has more than ``max_concurrency`` sessions
queued or running, each session that ends admits the next, two evaluations take turns on the shared queue, a
cancellation empties the line, a retry goes first, and the reconciler leaves held tasks alone."""

import threading
from pathlib import Path

import pytest
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from gateway.reconcile import reconcile
from services.evaluation import TaskState
from services.lifecycle import TaskLifecycle
from services.live.admission import AdmissionWindow
from services.pybench.suite import Suite, load_suite
from services.queues import RETRIES_KEY, SESSIONS_QUEUE, GradeJob, SessionJob, enqueue_grading
from services.store import ArtifactStore
from services.trajectory import EndReason
from tests.factories import make_evaluation
from tests.fixtures import queued_ids

RUNNABLE = [2, 3, 5, 7, 14, 16, 30, 44, 46, 50]
"""Ten tasks of the suite whose inputs are all in this copy."""


@pytest.fixture()
def suite(suite_path: Path) -> Suite:
    return load_suite(suite_path)


def take(redis: Redis) -> SessionJob:
    """What an executor does first: take the job at the head of the shared queue."""
    queue = Queue(SESSIONS_QUEUE, connection=redis, serializer=JSONSerializer)
    job = queue.dequeue_any([queue], None, connection=redis, serializer=JSONSerializer)
    assert job is not None, "the queue is empty"
    return SessionJob.model_validate(job[0].args[0])


def test_at_most_max_concurrency_sessions_are_out_and_each_end_admits_the_next(
    redis_client: Redis, suite: Suite
) -> None:
    assert all(suite.task(i).available for i in RUNNABLE)
    lifecycle = TaskLifecycle(redis_client)
    evaluation = make_evaluation("adm1", RUNNABLE, suite=suite, max_concurrency=3)
    lifecycle.create(evaluation, suite)
    assert lifecycle.queue_sessions(evaluation) == sorted(RUNNABLE)
    assert queued_ids(redis_client, SESSIONS_QUEUE) == [f"pbe-session-adm1-{i}-a1" for i in sorted(RUNNABLE)[:3]]
    assert lifecycle.window.held("adm1") == sorted(RUNNABLE)[3:]
    # every task still reads "queued": held or admitted is the window's business
    assert set(lifecycle.state.task_states("adm1").values()) == {TaskState.QUEUED}

    started: list[int] = []
    while len(started) < len(RUNNABLE):
        job = take(redis_client)
        assert lifecycle.start(job)
        started.append(job.task_index)
        states = lifecycle.state.task_states("adm1")
        out = sum(1 for s in states.values() if s is TaskState.RUNNING) + len(queued_ids(redis_client, SESSIONS_QUEUE))
        assert out <= 3 and lifecycle.window.in_flight("adm1") <= 3
        lifecycle.finish_session(job)
    assert started == sorted(RUNNABLE)  # first held, first admitted
    assert lifecycle.window.in_flight("adm1") == 0 and lifecycle.window.held("adm1") == []


def test_two_evaluations_take_turns_on_the_shared_queue(redis_client: Redis, suite: Suite) -> None:
    lifecycle = TaskLifecycle(redis_client)
    first = make_evaluation("early", RUNNABLE, suite=suite, max_concurrency=2)
    second = make_evaluation("late", RUNNABLE, suite=suite, max_concurrency=2)
    for evaluation in (first, second):  # the second is submitted after the whole of the first
        lifecycle.create(evaluation, suite)
        lifecycle.queue_sessions(evaluation)
    served: list[str] = []
    for _ in range(8):  # one executor slot: take the head, run it, finish it
        job = take(redis_client)
        assert lifecycle.start(job)
        served.append(job.evaluation_id)
        lifecycle.finish_session(job)
    # FIFO alone would serve "early" ten times first; the window interleaves them
    assert served[:4] == ["early", "early", "late", "late"]
    assert served.count("late") == 4 and served.count("early") == 4


def test_concurrent_admissions_never_pass_the_limit(redis_client: Redis) -> None:
    window = AdmissionWindow(redis_client)
    window.hold("race", list(range(200)))
    admitted: list[int] = []
    lock = threading.Lock()

    def admit() -> None:
        mine = AdmissionWindow(Redis(connection_pool=redis_client.connection_pool)).admit("race", 7)
        with lock:
            admitted.extend(mine)

    threads = [threading.Thread(target=admit) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(admitted) == list(range(7)) and window.in_flight("race") == 7
    window.leave("race", [0, 1])
    assert window.admit("race", 7) == [7, 8]


def test_cancel_empties_the_line_and_drops_a_retry_that_kept_its_place(redis_client: Redis, suite: Suite) -> None:
    lifecycle = TaskLifecycle(redis_client)
    evaluation = make_evaluation("adm2", RUNNABLE[:5], suite=suite, max_concurrency=1)
    lifecycle.create(evaluation, suite)
    lifecycle.queue_sessions(evaluation)
    job = take(redis_client)
    assert lifecycle.start(job)
    lifecycle.finish_session(job)  # admits the second task
    second = take(redis_client)
    assert lifecycle.start(second)
    # The second session's sandbox died: it keeps its place (the window stays full, the three never run wait)
    # while its retry waits out its delay outside the queue.
    assert lifecycle.finish_session(second, end_reason=EndReason.SANDBOX_ERROR) == 2
    assert lifecycle.window.is_admitted("adm2", second.task_index) and lifecycle.window.in_flight("adm2") == 1
    assert len(lifecycle.window.held("adm2")) == 3 and queued_ids(redis_client, SESSIONS_QUEUE) == []

    cancelled = lifecycle.cancel("adm2")
    assert sorted(cancelled) == sorted(RUNNABLE[2:5] + [second.task_index])
    assert redis_client.zcard(RETRIES_KEY) == 0, "the waiting retry is dropped"
    assert lifecycle.window.held("adm2") == [] and lifecycle.window.in_flight("adm2") == 0
    assert queued_ids(redis_client, SESSIONS_QUEUE) == []
    assert lifecycle.admit("adm2") == []  # nothing is admitted once cancelled


def test_the_reconciler_leaves_held_tasks_waiting_and_fills_the_window(
    redis_client: Redis, suite: Suite, tmp_path: Path
) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    lifecycle = TaskLifecycle(redis_client)
    evaluation = make_evaluation("adm3", RUNNABLE[:6], suite=suite, max_concurrency=2)
    store.put_evaluation(evaluation)
    lifecycle.create(evaluation, suite)
    lifecycle.queue_sessions(evaluation)
    report = reconcile(redis_client, store, suite)
    assert report.sessions == [] and report.admitted == []  # two queued jobs alive, four held by design
    assert len(queued_ids(redis_client, SESSIONS_QUEUE)) == 2

    # a crash between a session's end and the next admission: the window has room and nobody admitted
    job = take(redis_client)
    lifecycle.start(job)
    redis_client.hset("pbe:evaluation:adm3:tasks", str(job.task_index), TaskState.GRADING.value)
    lifecycle.window.leave("adm3", [job.task_index])
    enqueue_grading(redis_client, GradeJob(evaluation_id="adm3", task_index=job.task_index))
    report = reconcile(redis_client, store, suite)
    assert report.sessions == [] and report.admitted == [("adm3", sorted(RUNNABLE[:6])[2])]
    assert lifecycle.window.in_flight("adm3") == 2
