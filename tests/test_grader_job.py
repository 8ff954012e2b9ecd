"""The grading job against a real Redis and an artifact store on disk."""

import json
from pathlib import Path

from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from grader.jobs import grade_and_record
from services.endpoint.netguard import EgressPolicy
from services.evaluation import JudgeConfig, ModelEndpoint, TaskState
from services.lifecycle import MAX_ATTEMPTS, TaskLifecycle
from services.pybench.suite import load_suite
from services.queues import GRADING_QUEUE, GradeJob, SessionJob
from services.state import StateStore
from services.store import ArtifactStore
from services.trajectory import EndReason
from services.verdict import VerdictStatus
from tests.factories import make_evaluation, make_trajectory
from tests.fixtures import test_secrets
from tests.judge_server import JudgeServer, Step
from tests.servers import serve


def test_verdicts_are_recorded_and_results_written_once_every_task_is_graded(
    redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    suite = load_suite(suite_path)
    store = ArtifactStore(tmp_path)
    state = StateStore(redis_client)
    evaluation = make_evaluation("gradejob", [44, 134])
    TaskLifecycle(redis_client).create(evaluation, suite)
    for index, answer in ((44, "Finished: saved"), (134, "Finished: no idea")):
        store.put_trajectory(make_trajectory(evaluation.id, index, answer))
    store.put_output_file(evaluation.id, 44, 1, "44.png", b"\x89PNG")

    first = grade_and_record(
        GradeJob(evaluation_id=evaluation.id, task_index=44), redis=redis_client, suite=suite, store=store
    )
    assert first == {"task": 44, "status": "passed"}
    assert state.task_states(evaluation.id)[44] is TaskState.DONE
    assert not (tmp_path / "evaluations" / evaluation.id / "results.json").exists()

    second = grade_and_record(
        GradeJob(evaluation_id=evaluation.id, task_index=134), redis=redis_client, suite=suite, store=store
    )
    assert second["status"] == "failed"
    assert [v.status for v in state.verdicts(evaluation.id)] == [VerdictStatus.PASSED, VerdictStatus.FAILED]
    results = (tmp_path / "evaluations" / evaluation.id / "results.json").read_text()
    assert '"complete": true' in results and '"passed": 1' in results
    assert (tmp_path / "evaluations" / evaluation.id / "tasks/44/attempt-1/verdict.json").is_file()

    # Grading the same session again replaces its verdict rather than adding one.
    grade_and_record(
        GradeJob(evaluation_id=evaluation.id, task_index=134), redis=redis_client, suite=suite, store=store
    )
    assert len(state.verdicts(evaluation.id)) == 2


LOOPBACK = EgressPolicy.parse("127.0.0.1")


def test_an_evaluation_with_a_judge_gets_each_session_judged_with_the_key_from_the_secret_store(
    redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    suite = load_suite(suite_path)
    store = ArtifactStore(tmp_path)
    state = StateStore(redis_client, test_secrets())
    server = JudgeServer()
    canary = "sk-judge-canary-5b1e"
    with serve(server.app) as url:
        evaluation = make_evaluation(
            "judged",
            [134, 44],
            judge=JudgeConfig(endpoint=ModelEndpoint(base_url=url + "/v1", model="judge-model")),
            has_judge_api_key=True,
        )
        TaskLifecycle(redis_client, test_secrets()).create(evaluation, load_suite(suite_path), judge_api_key=canary)
        for index, answer in ((134, "Finished: no idea"), (44, "Finished: saved")):
            store.put_trajectory(make_trajectory(evaluation.id, index, answer))
        store.put_output_file(evaluation.id, 44, 1, "44.png", b"\x89PNG")
        # The judge passes task 134 (the tests fail it) and answers out of schema for task 44.
        server.script(Step(content=json.dumps({"reason": "looks right", "passed": True})), Step(content="I think so"))
        options = {"retries": 0, "backoff_s": 0.001}
        for index in (134, 44):
            job = GradeJob(evaluation_id=evaluation.id, task_index=index)
            grade_and_record(
                job,
                redis=redis_client,
                suite=suite,
                store=store,
                judge_options=options,
                egress=LOOPBACK,
                secrets=test_secrets(),
            )
    assert [r.headers.get("authorization") for r in server.requests] == [f"Bearer {canary}"] * 2
    verdicts = {v.task_index: v for v in state.verdicts(evaluation.id)}
    judged, unparseable = verdicts[134].judgment, verdicts[44].judgment
    assert judged is not None and judged.status == "passed" and judged.judge_model == "judge-model"
    assert len(judged.prompt_hash) == 64
    assert unparseable is not None and unparseable.status == "unparseable"
    results = (tmp_path / "evaluations" / evaluation.id / "results.json").read_text()
    assert canary not in results
    metrics = json.loads(results)["metrics"]
    assert metrics["llm"]["judged"] == 2 and metrics["llm"]["passed"] == 1 and metrics["llm"]["unparseable"] == 1
    assert metrics["llm"]["pass_rate"] == 0.5  # the unparseable judgment stays in the denominator
    # Task 134 (tests fail, judge passes) and task 44 (tests pass, judge could not say) disagree.
    assert metrics["llm"]["agreement"]["all"]["disagreeing"] == [44, 134]
    assert state.judge_key(evaluation.id) is None  # every task finished: the key is not kept at rest
    # Without the operator's allowlist, the loopback judge is refused before any connection: an error outcome.
    state.set_keys(evaluation.id, None, canary)  # as PUT .../keys does before a retry
    before = len(server.requests)
    grade_and_record(
        GradeJob(evaluation_id=evaluation.id, task_index=134),
        redis=redis_client,
        suite=suite,
        store=store,
        secrets=test_secrets(),
    )
    refused = {v.task_index: v for v in state.verdicts(evaluation.id)}[134].judgment
    assert refused is not None and refused.status == "error" and "refused" in refused.reason
    assert len(server.requests) == before


def test_a_session_the_environment_broke_is_run_again_by_its_executor_and_only_its_last_attempt_is_graded(
    redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    """The executor decides the retry where the session ends (``finish_session``); the grader sees only the last
    attempt, and grades it ``infra_error`` (never failed)."""
    suite = load_suite(suite_path)
    store = ArtifactStore(tmp_path)
    state = StateStore(redis_client)
    lifecycle = TaskLifecycle(redis_client)
    evaluation = make_evaluation("retried", [44])
    lifecycle.create(evaluation, suite)
    grading = Queue(GRADING_QUEUE, connection=redis_client, serializer=JSONSerializer)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        store.put_trajectory(
            make_trajectory(
                evaluation.id, 44, None, attempt=attempt, end_reason=EndReason.SANDBOX_ERROR, error="the kernel died"
            )
        )
        job = SessionJob(evaluation_id=evaluation.id, task_index=44, attempt=attempt)
        assert lifecycle.start(job)
        retried_as = lifecycle.finish_session(job, end_reason=EndReason.SANDBOX_ERROR)
        if attempt < MAX_ATTEMPTS:
            assert retried_as == attempt + 1 and grading.job_ids == [], "not graded: run again"
            assert state.task_states(evaluation.id)[44] is TaskState.QUEUED and not state.verdicts(evaluation.id)
    assert retried_as is None and len(grading.job_ids) == 1
    outcome = grade_and_record(
        GradeJob(evaluation_id=evaluation.id, task_index=44, attempt=MAX_ATTEMPTS),
        redis=redis_client,
        suite=suite,
        store=store,
    )
    assert outcome["status"] == "infra_error"
    [verdict] = state.verdicts(evaluation.id)
    assert verdict.status is VerdictStatus.INFRA_ERROR and verdict.attempt == MAX_ATTEMPTS and verdict.retryable
    assert state.task_states(evaluation.id)[44] is TaskState.DONE
    results = json.loads((tmp_path / "evaluations" / evaluation.id / "results.json").read_text())
    assert results["metrics"]["by_status"]["infra_error"] == 1 and results["metrics"]["by_status"]["failed"] == 0


def test_a_judge_whose_key_is_gone_is_not_called_and_the_judgment_says_how_to_send_it(
    redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    server = JudgeServer()
    store, state = ArtifactStore(tmp_path), StateStore(redis_client)
    with serve(server.app) as url:
        evaluation = make_evaluation(
            "judgekeylost",
            [134],
            judge=JudgeConfig(endpoint=ModelEndpoint(base_url=url + "/v1", model="judge-model")),
            has_judge_api_key=True,
        )
        # as restored from the store: the key was in Redis only
        TaskLifecycle(redis_client).create(evaluation, load_suite(suite_path))
        store.put_trajectory(make_trajectory(evaluation.id, 134, "Finished: 2"))
        job = GradeJob(evaluation_id=evaluation.id, task_index=134)
        grade_and_record(job, redis=redis_client, suite=load_suite(suite_path), store=store, egress=LOOPBACK)
    (verdict,) = state.verdicts(evaluation.id)
    assert verdict.judgment is not None and verdict.judgment.status == "error"
    assert f"PUT /v1/evaluations/{evaluation.id}/keys" in verdict.judgment.reason
    assert server.requests == [], "the judge was called without its key"
