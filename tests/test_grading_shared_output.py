"""The original grading sees the benchmark's shared ``./output``: a check that names another task's file reads what
that task of the same evaluation produced (its final attempt), whatever order the two are graded in; task 140's
check is an existence test; the fixed grading reads each task's own files only.

Against a real Redis and an artifact store on disk; the checks that open files (82's image comparison, 140's
folder check of the fixed grading) run in real grading sandboxes of the sandbox image (marker ``docker``).
"""

import threading
from pathlib import Path
from typing import Any

import docker.client
import pytest
from redis import Redis

from grader import shared_output
from grader.jobs import RunnerFactory, grade_and_record, sandbox_runners
from services.lifecycle import TaskLifecycle
from services.pybench.suite import Suite, load_suite
from services.queues import GradeJob, SessionJob
from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE, GRADING_ROLE, ROLE_LABEL
from services.state import StateStore
from services.store import ArtifactStore
from services.trajectory import EndReason
from services.verdict import Verdict, VerdictStatus
from tests.factories import make_evaluation, make_trajectory
from tests.fixtures import sandbox_objects
from tests.servers import files_made_in_sandbox_image

PASSED, FAILED = VerdictStatus.PASSED, VerdictStatus.FAILED


@pytest.fixture(scope="module")
def suite(suite_path: Path) -> Suite:
    return load_suite(suite_path)


def start(redis: Redis, suite: Suite, evaluation_id: str, tasks: list[int]) -> None:
    """Create an evaluation of ``tasks`` (its model is never called here)."""
    TaskLifecycle(redis).create(make_evaluation(evaluation_id, tasks), suite)


def session(
    store: ArtifactStore,
    evaluation_id: str,
    index: int,
    files: dict[str, bytes],
    *,
    attempt: int = 1,
    end: EndReason = EndReason.NO_CODE,
) -> None:
    """Store a finished session of task ``index`` that saved ``files`` (names under ``./output``)."""
    store.put_trajectory(
        make_trajectory(
            evaluation_id,
            index,
            "Finished: saved",
            attempt=attempt,
            end_reason=end,
            error="the sandbox died" if end.infra else None,
        )
    )
    for name, data in files.items():
        store.put_output_file(evaluation_id, index, attempt, name, data)


def grade_task(
    redis: Redis,
    suite: Suite,
    store: ArtifactStore,
    evaluation_id: str,
    index: int,
    attempt: int = 1,
    runners: RunnerFactory | None = None,
) -> dict[str, Any]:
    job = GradeJob(evaluation_id=evaluation_id, task_index=index, attempt=attempt)
    return grade_and_record(job, redis=redis, suite=suite, store=store, run_files=runners)


def verdict_of(redis: Redis, evaluation_id: str, index: int) -> Verdict:
    (verdict,) = [v for v in StateStore(redis).verdicts(evaluation_id) if v.task_index == index]
    return verdict


def test_the_suite_links_68_to_67_and_82_to_81_only_when_both_are_in_the_evaluation(suite: Suite) -> None:
    links = shared_output.dependencies(suite, suite.tasks)
    assert links == {68: {"./output/67.png": 67}, 82: {"./output/81.png": 81}}
    assert shared_output.dependencies(suite, [68, 82, 83, 9, 52]) == {}  # own names (9_1, 52_neg, 83_1) lend nothing
    assert shared_output.involved(links, 67) and shared_output.involved(links, 82)
    assert not shared_output.involved(links, 83) and not shared_output.involved(links, 140)
    assert shared_output.borrowers_of(links, 81) == [82]


def test_68_passes_the_original_grading_when_the_evaluations_67_produced_67_png(
    redis_client: Redis, suite: Suite, tmp_path: Path
) -> None:
    store = ArtifactStore(tmp_path)
    start(redis_client, suite, "share-yes", [67, 68])
    session(store, "share-yes", 67, {"67.png": b"\x89PNG 67"})
    session(store, "share-yes", 68, {"68.png": b"\x89PNG 68"})
    assert grade_task(redis_client, suite, store, "share-yes", 67)["status"] == "passed"
    assert grade_task(redis_client, suite, store, "share-yes", 68) == {"task": 68, "status": "passed"}
    verdict = verdict_of(redis_client, "share-yes", 68)
    assert verdict.status is PASSED and verdict.fixed is not None and verdict.fixed.status is PASSED
    assert "in the shared ./output: ./output/67.png of task 67, attempt 1" in verdict.checks[0].detail
    assert "shared" not in verdict.fixed.checks[0].detail


def test_68_fails_the_original_grading_when_the_evaluations_67_did_not_produce_it(
    redis_client: Redis, suite: Suite, tmp_path: Path
) -> None:
    store = ArtifactStore(tmp_path)
    start(redis_client, suite, "share-no", [67, 68])
    session(store, "share-no", 67, {"scatter.png": b"\x89PNG"})
    session(store, "share-no", 68, {"68.png": b"\x89PNG 68"})
    grade_task(redis_client, suite, store, "share-no", 67)
    grade_task(redis_client, suite, store, "share-no", 68)
    verdict = verdict_of(redis_client, "share-no", 68)
    assert verdict.status is FAILED and "./output/67.png" in verdict.reason
    assert verdict.fixed is not None and verdict.fixed.status is PASSED  # the fixed grading reads 68.png


def test_a_borrower_graded_before_its_lender_is_regraded_in_place_when_the_lender_finishes(
    redis_client: Redis, suite: Suite, tmp_path: Path
) -> None:
    store = ArtifactStore(tmp_path)
    start(redis_client, suite, "share-order", [67, 68])
    session(store, "share-order", 67, {"67.png": b"\x89PNG 67"})
    session(store, "share-order", 68, {"68.png": b"\x89PNG 68"})
    assert grade_task(redis_client, suite, store, "share-order", 68)["status"] == "failed"  # 67 is still running
    before = verdict_of(redis_client, "share-order", 68)
    assert grade_task(redis_client, suite, store, "share-order", 67) == {
        "task": 67,
        "status": "passed",
        "regraded": [68],
    }
    after = verdict_of(redis_client, "share-order", 68)
    assert after.status is PASSED and after.attempt == 1 and after.fixed == before.fixed
    assert len(StateStore(redis_client).verdicts("share-order")) == 2  # replaced, not added
    stored = list((tmp_path / "evaluations" / "share-order" / "tasks" / "68").glob("attempt-*/verdict.json"))
    assert len(stored) == 1 and '"status": "passed"' in stored[0].read_text()
    results = (tmp_path / "evaluations" / "share-order" / "results.json").read_text()
    assert '"complete": true' in results and '"passed": 2' in results  # written after the regrade
    # Grading the lender again (a duplicate job) changes nothing and adds nothing.
    assert "regraded" not in grade_task(redis_client, suite, store, "share-order", 67)
    assert len(StateStore(redis_client).verdicts("share-order")) == 2


def test_only_the_lenders_final_attempt_lends_its_files(redis_client: Redis, suite: Suite, tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    start(redis_client, suite, "share-attempt", [67, 68])
    session(store, "share-attempt", 67, {"67.png": b"\x89PNG"}, end=EndReason.SANDBOX_ERROR)  # run again
    ended = SessionJob(evaluation_id="share-attempt", task_index=67)
    assert TaskLifecycle(redis_client).finish_session(ended, end_reason=EndReason.SANDBOX_ERROR) == 2
    session(store, "share-attempt", 68, {"68.png": b"\x89PNG 68"})
    grade_task(redis_client, suite, store, "share-attempt", 68)
    assert verdict_of(redis_client, "share-attempt", 68).status is FAILED  # attempt 1 is not final
    session(store, "share-attempt", 67, {}, attempt=2)  # the final attempt saved nothing
    assert "regraded" not in grade_task(redis_client, suite, store, "share-attempt", 67, attempt=2)
    assert verdict_of(redis_client, "share-attempt", 68).status is FAILED


def test_another_evaluations_67_lends_nothing(redis_client: Redis, suite: Suite, tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    start(redis_client, suite, "share-other", [67])
    session(store, "share-other", 67, {"67.png": b"\x89PNG 67"})
    grade_task(redis_client, suite, store, "share-other", 67)
    start(redis_client, suite, "share-alone", [68])
    session(store, "share-alone", 68, {"68.png": b"\x89PNG 68"})
    grade_task(redis_client, suite, store, "share-alone", 68)
    assert verdict_of(redis_client, "share-alone", 68).status is FAILED


def test_a_file_both_saved_is_the_later_writers_as_the_harness_runs_tasks_in_index_order(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    store.put_output_file("e", 9, 1, "9.png", b"nine")
    store.put_output_file("e", 3, 1, "3.png", b"three")
    later = shared_output.borrow(store, "e", 5, {"./output/9.png": 9}, ["./output/9.png"], {9: 1})
    assert later.files == {"./output/9.png": tmp_path / "evaluations/e/tasks/9/attempt-1/output/9.png"}
    assert later.lenders == {"./output/9.png": (9, 1)}
    assert shared_output.borrow(store, "e", 5, {"./output/3.png": 3}, ["./output/3.png"], {3: 1}).files == {}
    assert shared_output.borrow(store, "e", 5, {"./output/3.png": 3}, [], {}).files == {}  # 3 not finished


def test_lender_and_borrower_graded_at_the_same_time_always_end_with_the_borrower_passing(
    redis_client: Redis, suite: Suite, tmp_path: Path
) -> None:
    store = ArtifactStore(tmp_path)
    for round_ in range(8):
        evaluation_id = f"share-race-{round_}"
        start(redis_client, suite, evaluation_id, [67, 68])
        session(store, evaluation_id, 67, {"67.png": b"\x89PNG 67"})
        session(store, evaluation_id, 68, {"68.png": b"\x89PNG 68"})
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def grade_one(
            index: int,
            evaluation_id: str = evaluation_id,
            barrier: threading.Barrier = barrier,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                barrier.wait()
                grade_task(redis_client, suite, store, evaluation_id, index)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=grade_one, args=(index,)) for index in (68, 67)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not errors
        assert verdict_of(redis_client, evaluation_id, 68).status is PASSED, f"round {round_}"
        assert not redis_client.exists(f"pbe:grader:borrowing-lock:{evaluation_id}")


def test_140_passes_the_original_grading_with_a_plain_file(redis_client: Redis, suite: Suite, tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    start(redis_client, suite, "share-140", [140])
    session(store, "share-140", 140, {"140": b"print('snake')"})
    grade_task(redis_client, suite, store, "share-140", 140)
    verdict = verdict_of(redis_client, "share-140", 140)
    assert verdict.status is PASSED and verdict.checks[0].kind == "path_exists"
    assert "a file" in verdict.checks[0].detail
    assert verdict.fixed is not None and verdict.fixed.status is VerdictStatus.UNGRADABLE  # dir_exists: a sandbox


FLIPS = r"""
import base64, io, tarfile
from PIL import Image
out = {}
for index in (81, 82):
    picture = Image.open(f"/suite/data/{index}.jpeg").convert("RGB").transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    buffer = io.BytesIO(); picture.save(buffer, format="PNG"); out[f"{index}.png"] = buffer.getvalue()
archive = io.BytesIO()
with tarfile.open(fileobj=archive, mode="w") as tar:
    for name, data in out.items():
        info = tarfile.TarInfo(name); info.size = len(data); tar.addfile(info, io.BytesIO(data))
print(base64.b64encode(archive.getvalue()).decode())
"""
"""What a correct solution of tasks 81 and 82 saves: the input flipped upside down, as PNG."""


@pytest.fixture(scope="module")
def flips(suite_path: Path) -> dict[str, bytes]:
    return files_made_in_sandbox_image(docker.client.from_env(), DEFAULT_SANDBOX_IMAGE, FLIPS, suite=suite_path)


@pytest.mark.docker
def test_82_passes_the_original_grading_in_a_grading_sandbox_only_when_the_evaluations_81_produced_81_png(
    redis_client: Redis, suite: Suite, tmp_path: Path, flips: dict[str, bytes]
) -> None:
    store = ArtifactStore(tmp_path)
    runners = sandbox_runners(suite, store, image=DEFAULT_SANDBOX_IMAGE, timeout_s=120)
    left_before = sandbox_objects(**{ROLE_LABEL: GRADING_ROLE})
    start(redis_client, suite, "share-81", [81, 82])
    session(store, "share-81", 81, {"81.png": flips["81.png"]})
    session(store, "share-81", 82, {"82.png": flips["82.png"]})
    assert grade_task(redis_client, suite, store, "share-81", 82, runners=runners)["status"] == "failed"
    fixed_before = verdict_of(redis_client, "share-81", 82).fixed
    assert fixed_before is not None and fixed_before.status is PASSED  # 82.png against 82.jpeg
    lender = grade_task(redis_client, suite, store, "share-81", 81, runners=runners)
    assert lender == {"task": 81, "status": "passed", "regraded": [82]}
    verdict = verdict_of(redis_client, "share-81", 82)
    assert verdict.status is PASSED and verdict.checks[0].kind == "image_matches_input_after_inverse"
    assert verdict.fixed == fixed_before
    # 81 run again (POST .../retry) and its new final attempt saves nothing: 82's original grading fails again.
    assert TaskLifecycle(redis_client).retry("share-81", 81) == 2
    session(store, "share-81", 81, {}, attempt=2)
    lender = grade_task(redis_client, suite, store, "share-81", 81, attempt=2, runners=runners)
    assert lender == {"task": 81, "status": "failed", "regraded": [82]}
    verdict = verdict_of(redis_client, "share-81", 82)
    assert verdict.status is FAILED and "81.png" in verdict.reason and verdict.fixed == fixed_before

    start(redis_client, suite, "share-no-81", [81, 82])
    session(store, "share-no-81", 81, {"flipped.png": flips["81.png"]})  # saved under another name
    session(store, "share-no-81", 82, {"82.png": flips["82.png"]})
    grade_task(redis_client, suite, store, "share-no-81", 81, runners=runners)
    grade_task(redis_client, suite, store, "share-no-81", 82, runners=runners)
    verdict = verdict_of(redis_client, "share-no-81", 82)
    assert verdict.status is FAILED and verdict.fixed is not None and verdict.fixed.status is PASSED
    assert sandbox_objects(**{ROLE_LABEL: GRADING_ROLE}) == left_before


@pytest.mark.docker
def test_140_plain_file_passes_the_original_grading_and_fails_the_fixed_one_in_a_grading_sandbox(
    redis_client: Redis, suite: Suite, tmp_path: Path
) -> None:
    store = ArtifactStore(tmp_path)
    runners = sandbox_runners(suite, store, image=DEFAULT_SANDBOX_IMAGE, timeout_s=120)
    start(redis_client, suite, "share-140-file", [140])
    session(store, "share-140-file", 140, {"140": b"print('snake')"})
    grade_task(redis_client, suite, store, "share-140-file", 140, runners=runners)
    plain = verdict_of(redis_client, "share-140-file", 140)
    assert plain.status is PASSED and plain.fixed is not None and plain.fixed.status is FAILED
    start(redis_client, suite, "share-140-dir", [140])
    session(store, "share-140-dir", 140, {"140/snake.py": b"print('snake')"})
    grade_task(redis_client, suite, store, "share-140-dir", 140, runners=runners)
    folder = verdict_of(redis_client, "share-140-dir", 140)
    assert folder.status is PASSED and folder.fixed is not None and folder.fixed.status is PASSED
    start(redis_client, suite, "share-140-none", [140])
    session(store, "share-140-none", 140, {"1400.txt": b"x"})
    grade_task(redis_client, suite, store, "share-140-none", 140, runners=runners)
    assert verdict_of(redis_client, "share-140-none", 140).status is FAILED
