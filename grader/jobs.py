"""The grader's RQ job: grade one finished session, record the verdict, and the results once all are in.

Workers run ``rq worker --serializer rq.serializers.JSONSerializer pbe-grading``; the executor enqueues
``grader.jobs.grade_session`` by name with a ``GradeJob`` payload.
"""

from typing import Any

from redis import Redis

from grader import session_files
from grader.check_sandbox import run_file_checks
from grader.grading import FileCheckRunner, grade
from grader.judge import judge_key_lost, judge_session
from grader.settings import GraderSettings
from services.lifecycle import TaskLifecycle, should_retry
from services.logs import log_context
from services.metrics import build_results
from services.netguard import EgressPolicy
from services.queues import GradeJob
from services.store import ArtifactStore
from services.suite import Suite, load_suite
from services.verdict import VerdictStatus


def sandbox_runner(
    job: GradeJob, suite: Suite, store: ArtifactStore, *, image: str, timeout_s: float
) -> FileCheckRunner:
    """The runner of ``job``'s file-opening checks: a fresh grading sandbox with the session's files.

    The files are read only when a check needs them.
    """

    def run(checks: list[dict[str, Any]]) -> list[Any]:
        output_dir = store.output_dir(job.evaluation_id, job.task_index, job.attempt)
        files = session_files.gather(output_dir, suite, checks)
        return run_file_checks(checks, files, image=image, timeout_s=timeout_s)

    return run


def grade_and_record(
    job: GradeJob,
    *,
    redis: Redis,
    suite: Suite,
    store: ArtifactStore,
    run_files: FileCheckRunner | None = None,
    judge_options: dict[str, float] | None = None,
    egress: EgressPolicy | None = None,
) -> dict[str, Any]:
    """Grade the session of ``job``; write the verdict to the store and Redis, and the results when complete.

    A session the environment broke in a way that may mend by itself is not recorded but run again as its
    next attempt (``services.lifecycle``'s retry policy); the last attempt's ``infra_error`` is recorded (and
    never counted as failed).
    ``run_files`` runs the checks that open produced files (see ``sandbox_runner``). When the evaluation has
    a judge, the session is judged too (``judge_options``: ``grader.judge.Judge``'s options, e.g. timeouts), its
    endpoint reached only where ``egress`` permits (no internal address when None).

    Raises:
        ArtifactNotFoundError: the session's trajectory is not in the store.
        TaskNotFoundError: the suite has no such task.
        EvaluationNotFoundError: Redis holds no such evaluation.
        SandboxStartError: a check needs the grading sandbox and the Docker engine or the image is missing
            (RQ records the job as failed; re-run it once ``make images`` has built the image).
    """
    lifecycle = TaskLifecycle(redis)
    state = lifecycle.state
    task = suite.task(job.task_index)
    trajectory = store.get_trajectory(job.evaluation_id, job.task_index, job.attempt)
    output_files = store.list_output_files(job.evaluation_id, job.task_index, job.attempt)
    verdict = grade(task, trajectory, output_files, run_files)
    if should_retry(verdict):
        store.put_verdict(verdict)  # every attempt's verdict is kept in the store; Redis holds the task's last
        recorded = lifecycle.record_verdict(verdict)
        return {"task": task.index, "status": verdict.status.value, "retried_as_attempt": recorded.retried_as}
    evaluation = state.get(job.evaluation_id)
    judge = evaluation.judge
    if judge is not None and verdict.status is not VerdictStatus.INFRA_ERROR:
        judge_key = state.judge_key(job.evaluation_id)
        if evaluation.has_judge_api_key and judge_key is None:
            verdict.judgment = judge_key_lost(judge, job.evaluation_id)
        else:
            verdict.judgment = judge_session(
                judge,
                judge_key,
                task,
                trajectory,
                suite.root,
                egress or EgressPolicy.parse(""),
                **(judge_options or {}),
            )
    store.put_verdict(verdict)
    if lifecycle.record_verdict(verdict).complete:
        store.put_results(
            build_results(job.evaluation_id, state.verdicts(job.evaluation_id), complete=True, prices=evaluation.prices)
        )
    return {"task": task.index, "status": verdict.status.value}


def grade_session(payload: dict[str, Any]) -> dict[str, Any]:
    """RQ entry point (``services.queues.GRADE_SESSION_JOB``): validate the payload and grade."""
    job = GradeJob.model_validate(payload)
    settings = GraderSettings()
    redis = settings.redis()
    try:
        suite = load_suite(settings.require_suite())
        store = ArtifactStore(settings.ARTIFACT_ROOT)
        runner = sandbox_runner(job, suite, store, image=settings.SANDBOX_IMAGE, timeout_s=settings.GRADING_TIMEOUT_S)
        egress = EgressPolicy.parse(settings.EGRESS_ALLOWLIST)
        with log_context(evaluation=job.evaluation_id, task=job.task_index, attempt=job.attempt):
            return grade_and_record(job, redis=redis, suite=suite, store=store, run_files=runner, egress=egress)
    finally:
        redis.close()
