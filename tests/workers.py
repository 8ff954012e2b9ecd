"""The project's workers for tests that need a job of their own (a long sleep, a grading stand-in): the same
classes with a wider job allowlist, named as test doubles. Production workers run only ``PROJECT_JOBS``."""

from executor.worker import ExecutorWorker
from grader.worker import GraderWorker
from services.queues import PROJECT_JOBS, ProjectJob


class JobAllowingTestFunctions(ProjectJob):
    """``ProjectJob`` that also runs the tests' own job functions."""

    allowed = PROJECT_JOBS | {"time.sleep", "tests.test_observability.grade_for_test"}


class ExecutorWorkerForTests(ExecutorWorker):
    project_job_class = JobAllowingTestFunctions


class GraderWorkerForTests(GraderWorker):
    project_job_class = JobAllowingTestFunctions
