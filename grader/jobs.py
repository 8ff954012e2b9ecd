"""The grader's RQ job: grade one finished session, record the verdict, and the results once all are in.

Workers run ``rq worker --serializer rq.serializers.JSONSerializer pbe-grading``; the executor enqueues
``grader.jobs.grade_session`` by name with a ``GradeJob`` payload.

Tasks whose original checks name another task's file (``grader.shared_output``: 68 reads 67's ``67.png``, 82
reads 81's ``81.png``) are graded as each session ends, like every task, so a borrower may be graded before the
task it borrows from has finished. The rule that keeps its verdict right whatever the order: the gradings of
the tasks that borrow or lend within an evaluation take one Redis lock per evaluation around "read the lenders'
final attempts, grade, record"; a borrower's grading sees the lenders that already have a final verdict, and a
lender's final verdict, before it is recorded, regrades the original grading of its borrowers already graded
(their fixed grading and judgment are kept) and records the change in place: the same task and attempt, so one
verdict per task and attempt, replaced, never added. The evaluation is complete only once the last of them is
recorded, so its results see every borrower graded over its lenders' final files.
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from redis import Redis

from grader import file_checks, session_files, shared_output
from grader.grading import CHECKS_VERSION, FileCheckRunner, OriginalView, checks_hash, grade, regrade_original
from grader.judge import judge_key_lost, judge_session
from grader.settings import GraderSettings
from services.endpoint.netguard import EgressPolicy
from services.errors import ArtifactExpiredError
from services.evaluation import Evaluation
from services.lifecycle import TaskLifecycle
from services.live.secretbox import SecretBox
from services.observability.logs import log_context
from services.pybench.suite import Suite, load_suite
from services.queues import GradeJob
from services.results.manifest import service_version
from services.results.scores import build_results
from services.sandbox.grading_backends import file_check_backend
from services.state import StateStore
from services.store import ArtifactStore
from services.task import Task
from services.trajectory import Trajectory
from services.verdict import Judgment, Verdict, VerdictStatus

RunnerFactory = Callable[[GradeJob, shared_output.Borrowed], FileCheckRunner]
"""Makes the runner of one session's file-opening checks over its own files and the borrowed ones."""

DEFAULT_BORROWING_LOCK_TIMEOUT_S = 600.0
"""The longest an evaluation's borrowing lock is held (a grader killed holding it frees it then), and the longest a
grading waits for it (then it fails, and the reconciler queues it again)."""


def borrowing_lock_key(evaluation_id: str) -> str:
    """The Redis key of the lock the gradings of an evaluation's borrowing and lending tasks take."""
    return f"pbe:grader:borrowing-lock:{evaluation_id}"


def sandbox_runner(
    job: GradeJob,
    suite: Suite,
    store: ArtifactStore,
    *,
    image: str,
    timeout_s: float,
    borrowed: shared_output.Borrowed | None = None,
) -> FileCheckRunner:
    """The runner of ``job``'s file-opening checks: a fresh grading sandbox with the session's files (and the
    ``borrowed`` files of other tasks, for the original grading).

    The files are read only when a check needs them.
    """

    def run(checks: list[dict[str, Any]]) -> list[Any]:
        output_dir = store.output_dir(job.evaluation_id, job.task_index, job.attempt)
        files = session_files.gather(output_dir, suite, checks, borrowed.files if borrowed else None)
        runner = file_check_backend(GraderSettings(), file_checks.checker_sources())
        return runner(checks, files, image=image, timeout_s=timeout_s)

    return run


def sandbox_runners(suite: Suite, store: ArtifactStore, *, image: str, timeout_s: float) -> RunnerFactory:
    """The ``RunnerFactory`` of grading sandboxes (``sandbox_runner`` for any session of the store)."""

    def runner(job: GradeJob, borrowed: shared_output.Borrowed) -> FileCheckRunner:
        return sandbox_runner(job, suite, store, image=image, timeout_s=timeout_s, borrowed=borrowed)

    return runner


def grade_and_record(
    job: GradeJob,
    *,
    redis: Redis,
    suite: Suite,
    store: ArtifactStore,
    run_files: RunnerFactory | None = None,
    judge_options: dict[str, float] | None = None,
    egress: EgressPolicy | None = None,
    secrets: SecretBox | None = None,
) -> dict[str, Any]:
    """Grade the session of ``job``; write the verdict to the store and Redis, and the results when complete.
    ``secrets`` opens the judge's API key (none given: a keyed judge's key counts as lost).

    A session that ended on an infrastructure reason is recorded ``infra_error`` (never counted as failed); one
    that may mend by itself reaches the grader only once its attempts are spent (the executor that ran it ran it
    again: ``services.lifecycle.TaskLifecycle.finish_session``).
    ``run_files`` makes the runners of the checks that open produced files (see ``sandbox_runners``; None: such
    checks are undecided). When the evaluation has a judge, the session is judged too (``judge_options``:
    ``grader.judge.Judge``'s options, e.g. timeouts), its endpoint reached only where ``egress`` permits (no
    internal address when None). A task that borrows or lends files (see the module's docstring) is graded under
    the evaluation's borrowing lock, and a lender's final verdict regrades its borrowers already graded; the
    answer then lists them under ``regraded``.

    Raises:
        ArtifactNotFoundError: the session's trajectory is not in the store.
        TaskNotFoundError: the suite has no such task.
        EvaluationNotFoundError: Redis holds no such evaluation.
        SandboxStartError: a check needs the grading sandbox and the Docker engine or the image is missing
            (RQ records the job as failed; re-run it once ``make images`` has built the image).
        redis.exceptions.LockError: the borrowing lock was not free within ``DEFAULT_BORROWING_LOCK_TIMEOUT_S``
            (RQ records the job as failed; the reconciler queues the grading again).
    """
    lifecycle = TaskLifecycle(redis, secrets)
    state = lifecycle.state
    task = suite.task(job.task_index)
    trajectory = store.get_trajectory(job.evaluation_id, job.task_index, job.attempt)
    output_files = store.list_output_files(job.evaluation_id, job.task_index, job.attempt)
    evaluation = state.get(job.evaluation_id)
    judgment = None
    if not trajectory.end_reason.infra:  # the judge reads the trajectory only: it runs outside the lock
        judgment = _judgment(evaluation, task, trajectory, state, suite, judge_options, egress)
    links = shared_output.dependencies(suite, evaluation.tasks)
    regraded: list[int] = []
    with _borrowing_lock(redis, job.evaluation_id, held=shared_output.involved(links, task.index)):
        attempts = shared_output.final_attempts(state, job.evaluation_id)
        borrowed = shared_output.borrow(
            store, job.evaluation_id, task.index, links.get(task.index, {}), output_files, attempts
        )
        own = run_files(job, shared_output.Borrowed()) if run_files else None
        verdict = _graded_with(grade(task, trajectory, output_files, own, _view(run_files, job, borrowed)), suite)
        verdict.grading = job.grading
        verdict.judgment = judgment
        if job.attempt >= state.task_attempt(job.evaluation_id, task.index):  # not a stale duplicate's grading
            regraded = _regrade_borrowers(
                job, links, lifecycle=lifecycle, suite=suite, store=store, run_files=run_files
            )
        store.put_verdict(verdict)
        complete = lifecycle.record_verdict(verdict).complete
    if complete:
        store.put_results(
            build_results(job.evaluation_id, state.verdicts(job.evaluation_id), complete=True, prices=evaluation.prices)
        )
        store.put_evaluation(state.get(job.evaluation_id))  # its manifest's gradings, filled in at completion
    return {"task": task.index, "status": verdict.status.value, **({"regraded": regraded} if regraded else {})}


def _graded_with(verdict: Verdict, suite: Suite) -> Verdict:
    """``verdict`` with what graded it: this grader's build and the checks hash of ``suite`` under its check code."""
    verdict.grader_version = service_version()
    verdict.checks_hash = checks_hash(suite)
    verdict.checks_version = CHECKS_VERSION
    return verdict


def _judgment(
    evaluation: Evaluation,
    task: Task,
    trajectory: Trajectory,
    state: StateStore,
    suite: Suite,
    judge_options: dict[str, float] | None,
    egress: EgressPolicy | None,
) -> Judgment | None:
    """The LLM judge's judgment of the session, when the evaluation has a judge (None otherwise)."""
    judge = evaluation.judge
    if judge is None:
        return None
    judge_key = state.judge_key(evaluation.id)
    if evaluation.has_judge_api_key and judge_key is None:
        return judge_key_lost(judge, evaluation.id)
    return judge_session(
        judge, judge_key, task, trajectory, suite.root, egress or EgressPolicy.parse(""), **(judge_options or {})
    )


@contextlib.contextmanager
def _borrowing_lock(redis: Redis, evaluation_id: str, *, held: bool) -> Iterator[None]:
    """The evaluation's borrowing lock when ``held`` (a task that borrows or lends files), else nothing."""
    if not held:
        yield
        return
    timeout = DEFAULT_BORROWING_LOCK_TIMEOUT_S
    with redis.lock(borrowing_lock_key(evaluation_id), timeout=timeout, blocking_timeout=timeout):
        yield


def _view(run_files: RunnerFactory | None, job: GradeJob, borrowed: shared_output.Borrowed) -> OriginalView:
    """What the original grading of ``job``'s session sees: its files and ``borrowed`` (perhaps none)."""
    sources = {name: f"task {task}, attempt {attempt}" for name, (task, attempt) in borrowed.lenders.items()}
    return OriginalView(borrowed=sources, run_file_checks=run_files(job, borrowed) if run_files else None)


def _regrade_borrowers(
    lender: GradeJob,
    links: dict[int, dict[str, int]],
    *,
    lifecycle: TaskLifecycle,
    suite: Suite,
    store: ArtifactStore,
    run_files: RunnerFactory | None,
) -> list[int]:
    """Grade again the original grading of the tasks that borrow from ``lender`` (whose attempt is now final) and
    have a verdict already; record those that change, in place. Returns the tasks whose verdict changed."""
    evaluation_id = lender.evaluation_id
    attempts = shared_output.final_attempts(lifecycle.state, evaluation_id) | {lender.task_index: lender.attempt}
    verdicts = {verdict.task_index: verdict for verdict in lifecycle.state.verdicts(evaluation_id)}
    changed: list[int] = []
    for index in shared_output.borrowers_of(links, lender.task_index):
        verdict = verdicts.get(index)
        if verdict is None or verdict.status in (VerdictStatus.UNAVAILABLE, VerdictStatus.INFRA_ERROR):
            continue  # not graded yet (its grading will see the lender's files), or nothing to regrade
        job = GradeJob(evaluation_id=evaluation_id, task_index=index, attempt=verdict.attempt)
        try:
            store.check_kept(evaluation_id, [(index, verdict.attempt)])
        except ArtifactExpiredError:
            continue  # retention removed what it was graded from: its verdict stays as it was
        files = store.list_output_files(evaluation_id, index, verdict.attempt)
        borrowed = shared_output.borrow(store, evaluation_id, index, links[index], files, attempts)
        trajectory = store.get_trajectory(evaluation_id, index, verdict.attempt)
        again = regrade_original(verdict, suite.task(index), trajectory, files, _view(run_files, job, borrowed))
        again = _graded_with(again.model_copy(), suite)
        if (again.status, again.checks, again.reason) != (verdict.status, verdict.checks, verdict.reason):
            store.put_verdict(again)
            lifecycle.record_verdict(again)
            changed.append(index)
    return changed


def grade_session(payload: dict[str, Any]) -> dict[str, Any]:
    """RQ entry point (``services.queues.GRADE_SESSION_JOB``): validate the payload and grade."""
    job = GradeJob.model_validate(payload)
    settings = GraderSettings()
    redis = settings.redis()
    try:
        suite = load_suite(settings.require_suite())
        store = ArtifactStore(settings.ARTIFACT_ROOT)
        runner = sandbox_runners(suite, store, image=settings.SANDBOX_IMAGE, timeout_s=settings.GRADING_TIMEOUT_S)
        egress = EgressPolicy.parse(settings.EGRESS_ALLOWLIST)
        with log_context(evaluation=job.evaluation_id, task=job.task_index, attempt=job.attempt):
            return grade_and_record(
                job, redis=redis, suite=suite, store=store, run_files=runner, egress=egress,
                secrets=settings.secret_box(),
            )  # fmt: skip
    finally:
        redis.close()
