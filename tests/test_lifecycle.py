"""The task lifecycle against a real Redis: each transition, the retry policy, and two causes only the user can
fix (a lost key, an endpoint that answers 404) ending after one attempt through the real executor and grader
jobs, the real replay model server and a real kernel gateway (the local backend)."""

import time
from pathlib import Path

import pytest
from redis import Redis

from replay.server import create_app
from services.evaluation import TaskState
from services.lifecycle import DEFAULT_RETRY_DELAY_S, MAX_ATTEMPTS, TaskLifecycle, session_retryable
from services.pybench.suite import Suite, load_suite
from services.queues import (
    GRADING_QUEUE,
    RETRIES_KEY,
    SESSIONS_QUEUE,
    SessionJob,
    release_due_sessions,
    session_alive,
)
from services.store import ArtifactStore
from services.trajectory import EndReason
from services.verdict import VerdictStatus
from tests.factories import make_evaluation, make_verdict
from tests.fixtures import queued_ids, run_and_grade, test_secrets
from tests.servers import serve

UNRECORDED_TASK = 98
"""A task whose query no recorded trajectory has: the replay model answers its requests with 404."""


@pytest.fixture()
def suite(suite_path: Path) -> Suite:
    return load_suite(suite_path)


def test_a_task_goes_from_queued_through_running_and_grading_to_done(redis_client: Redis, suite: Suite) -> None:
    lifecycle = TaskLifecycle(redis_client)
    evaluation = make_evaluation("life1", [7, 13], suite=suite)
    assert evaluation.unavailable_tasks == [13]
    lifecycle.create(evaluation, suite)
    state = lifecycle.state
    assert state.task_states("life1") == {7: TaskState.QUEUED, 13: TaskState.UNAVAILABLE}
    [unavailable] = state.verdicts("life1")
    assert unavailable.status is VerdictStatus.UNAVAILABLE and "./data/" in unavailable.reason

    assert lifecycle.queue_sessions(evaluation) == [7]
    assert queued_ids(redis_client, SESSIONS_QUEUE) == ["pbe-session-life1-7-a1"]
    job = SessionJob(evaluation_id="life1", task_index=7)
    assert lifecycle.start(job) and state.task_states("life1")[7] is TaskState.RUNNING
    lifecycle.finish_session(job)
    assert state.task_states("life1")[7] is TaskState.GRADING
    assert queued_ids(redis_client, GRADING_QUEUE) == ["pbe-grade-life1-7-a1"]
    assert not state.complete("life1")

    recorded = lifecycle.record_verdict(make_verdict("life1", 7, VerdictStatus.PASSED))
    assert recorded.complete and state.complete("life1")
    assert state.task_states("life1")[7] is TaskState.DONE


def test_only_a_retryable_infra_end_runs_again_after_its_delay_without_a_grading_and_the_attempts_are_bounded(
    redis_client: Redis, suite: Suite
) -> None:
    lifecycle = TaskLifecycle(redis_client)
    lifecycle.create(make_evaluation("life2", [7, 16], suite=suite), suite)
    lifecycle.queue_sessions(lifecycle.state.get("life2"))
    for attempt in range(1, MAX_ATTEMPTS):
        job = SessionJob(evaluation_id="life2", task_index=7, attempt=attempt)
        assert lifecycle.start(job) and session_retryable(EndReason.SANDBOX_ERROR, attempt)
        before = time.time()
        assert lifecycle.finish_session(job, end_reason=EndReason.SANDBOX_ERROR) == attempt + 1
        assert lifecycle.state.task_states("life2")[7] is TaskState.QUEUED
        assert lifecycle.state.task_attempt("life2", 7) == attempt + 1
        assert lifecycle.window.is_admitted("life2", 7), "a retry keeps its place in the window"
        # Not graded, not queued yet: scheduled after the retry delay, holding no executor slot meanwhile.
        assert queued_ids(redis_client, GRADING_QUEUE) == []
        following = SessionJob(evaluation_id="life2", task_index=7, attempt=attempt + 1)
        assert f"pbe-session-life2-7-a{attempt + 1}" not in queued_ids(redis_client, SESSIONS_QUEUE)
        due = redis_client.zscore(RETRIES_KEY, following.model_dump_json())
        assert due is not None and before + DEFAULT_RETRY_DELAY_S * 2 ** (attempt - 1) * 0.5 <= due
        assert session_alive(redis_client, following), "the reconciler must not take it for lost"
        assert release_due_sessions(redis_client, due - 0.01) == []
        assert release_due_sessions(redis_client, due) == [following]
        assert release_due_sessions(redis_client, due) == [], "released once"
        assert f"pbe-session-life2-7-a{attempt + 1}" in queued_ids(redis_client, SESSIONS_QUEUE)
    last = SessionJob(evaluation_id="life2", task_index=7, attempt=MAX_ATTEMPTS)
    assert lifecycle.start(last) and not session_retryable(EndReason.SANDBOX_ERROR, MAX_ATTEMPTS)
    assert lifecycle.finish_session(last, end_reason=EndReason.SANDBOX_ERROR) is None
    assert lifecycle.state.task_states("life2")[7] is TaskState.GRADING

    users_to_fix = SessionJob(evaluation_id="life2", task_index=16)
    assert lifecycle.start(users_to_fix)
    assert lifecycle.finish_session(users_to_fix, end_reason=EndReason.MODEL_REJECTED) is None
    assert lifecycle.state.task_states("life2")[16] is TaskState.GRADING
    assert redis_client.zcard(RETRIES_KEY) == 0


def test_a_retry_waiting_out_its_delay_is_dropped_when_its_evaluation_is_cancelled(
    redis_client: Redis, suite: Suite
) -> None:
    lifecycle = TaskLifecycle(redis_client)
    lifecycle.create(make_evaluation("life5", [7], suite=suite), suite)
    lifecycle.queue_sessions(lifecycle.state.get("life5"))
    job = SessionJob(evaluation_id="life5", task_index=7)
    assert lifecycle.start(job) and lifecycle.finish_session(job, end_reason=EndReason.MODEL_ERROR) == 2
    assert redis_client.zcard(RETRIES_KEY) == 1
    assert lifecycle.cancel("life5") == [7]
    assert redis_client.zcard(RETRIES_KEY) == 0 and lifecycle.state.complete("life5")


def test_the_grading_of_a_superseded_attempt_changes_nothing(redis_client: Redis, suite: Suite) -> None:
    lifecycle = TaskLifecycle(redis_client)
    lifecycle.create(make_evaluation("life3", [7], suite=suite), suite)
    assert lifecycle.retry("life3", 7) == 2
    stale = make_verdict("life3", 7, VerdictStatus.FAILED, attempt=1)
    assert not lifecycle.record_verdict(stale).complete
    assert lifecycle.state.verdicts("life3") == [] and lifecycle.state.task_states("life3")[7] is TaskState.QUEUED
    lifecycle.record_verdict(make_verdict("life3", 7, VerdictStatus.PASSED, attempt=2))
    assert [v.attempt for v in lifecycle.state.verdicts("life3")] == [2]


def test_cancelling_takes_queued_tasks_off_the_queue_and_a_cancelled_session_does_not_start(
    redis_client: Redis, suite: Suite
) -> None:
    lifecycle = TaskLifecycle(redis_client)
    evaluation = make_evaluation("life4", [7, 16], suite=suite)
    lifecycle.create(evaluation, suite)
    lifecycle.queue_sessions(evaluation)
    lifecycle.start(SessionJob(evaluation_id="life4", task_index=16))
    assert lifecycle.cancel("life4") == [7]
    assert "pbe-session-life4-7-a1" not in queued_ids(redis_client, SESSIONS_QUEUE)
    assert not lifecycle.start(SessionJob(evaluation_id="life4", task_index=7))
    lifecycle.finish_session(SessionJob(evaluation_id="life4", task_index=16), cancelled=True)
    assert lifecycle.state.task_states("life4") == {7: TaskState.CANCELLED, 16: TaskState.CANCELLED}
    assert lifecycle.state.complete("life4") and queued_ids(redis_client, GRADING_QUEUE) == []


@pytest.mark.slow
def test_an_endpoint_that_answers_404_ends_the_task_after_one_attempt_with_what_to_fix(
    redis_url: str, redis_client: Redis, suite: Suite, tmp_path: Path
) -> None:
    with serve(create_app(suite.root / "trajectory.jsonl")) as url:
        evaluation = make_evaluation(
            "life404", [UNRECORDED_TASK], suite=suite, base_url=url + "/v1", model="pybench-replay"
        )
        verdict = run_and_grade(evaluation, suite, redis_url, redis_client, tmp_path)
    trajectory = ArtifactStore(tmp_path).get_trajectory("life404", UNRECORDED_TASK, 1)
    assert trajectory.end_reason is EndReason.MODEL_REJECTED and trajectory.assistant_turns == 0
    assert verdict.status is VerdictStatus.INFRA_ERROR and verdict.attempt == 1 and not verdict.retryable
    assert verdict.reason.startswith("model_rejected:") and "404" in verdict.reason
    assert "task_not_recorded" in verdict.reason or "no recorded trajectory" in verdict.reason


def test_a_lost_model_key_ends_the_task_after_one_attempt_saying_how_to_send_it(
    redis_url: str, redis_client: Redis, suite: Suite, tmp_path: Path
) -> None:
    evaluation = make_evaluation("lifekey", [7], suite=suite, has_api_key=True)
    verdict = run_and_grade(evaluation, suite, redis_url, redis_client, tmp_path, api_key=None)
    assert verdict.status is VerdictStatus.INFRA_ERROR and verdict.attempt == 1 and not verdict.retryable
    assert verdict.reason.startswith("key_lost:")
    assert "PUT /v1/evaluations/lifekey/keys" in verdict.reason and "/retry" in verdict.reason


def test_the_api_keys_are_dropped_once_every_task_is_finished(redis_client: Redis, suite: Suite) -> None:
    lifecycle = TaskLifecycle(redis_client, test_secrets())
    evaluation = make_evaluation("lifekeys", [7, 16], suite=suite, has_api_key=True, has_judge_api_key=True)
    lifecycle.create(evaluation, suite, api_key="sk-model-canary", judge_api_key="sk-judge-canary")
    lifecycle.record_verdict(make_verdict("lifekeys", 7, VerdictStatus.PASSED))
    assert lifecycle.state.model_key("lifekeys") == "sk-model-canary"  # task 16 still needs it
    lifecycle.record_verdict(make_verdict("lifekeys", 16, VerdictStatus.FAILED))
    assert lifecycle.state.model_key("lifekeys") is None and lifecycle.state.judge_key("lifekeys") is None
    assert not redis_client.keys("pbe:secret:*lifekeys*")


def test_a_keys_sessions_in_flight_count_every_unfinished_evaluation_however_many_newer_ones_it_has(
    redis_client: Redis, suite: Suite
) -> None:
    from gateway.limits import MAX_EVALUATIONS_SCANNED, sessions_in_flight

    lifecycle = TaskLifecycle(redis_client)
    old = make_evaluation("inflight-old", [7, 16], suite=suite, owner="walker")
    lifecycle.create(old, suite)
    for n in range(MAX_EVALUATIONS_SCANNED + 5):  # newer ones, finished at once (task 13's inputs are missing)
        lifecycle.create(make_evaluation(f"inflight-new-{n}", [13], suite=suite, owner="walker"), suite)
    assert sessions_in_flight(lifecycle.state, "walker") == 2  # the old one's two queued sessions still count
    assert lifecycle.state.open_evaluations("walker") == ["inflight-old"]
    for index in (7, 16):
        lifecycle.record_verdict(make_verdict("inflight-old", index, VerdictStatus.FAILED))
    assert sessions_in_flight(lifecycle.state, "walker") == 0 and lifecycle.state.open_evaluations("walker") == []
    lifecycle.retry("inflight-old", 7)  # open again until its retried task finishes
    assert sessions_in_flight(lifecycle.state, "walker") == 1
    assert lifecycle.state.open_evaluations("walker") == ["inflight-old"]
