"""The grading job against a real Redis and an artifact store on disk."""

from pathlib import Path

from redis import Redis

from grader.jobs import grade_and_record
from services.evaluation import Evaluation, ModelEndpoint, Sampling, TaskState
from services.queues import GradeJob
from services.state import StateStore
from services.store import ArtifactStore
from services.suite import load_suite
from services.trajectory import EndReason, Message, Trajectory
from services.verdict import VerdictStatus


def test_verdicts_are_recorded_and_results_written_once_every_task_is_graded(
    redis_client: Redis, suite_path: Path, tmp_path: Path
) -> None:
    suite = load_suite(suite_path)
    store = ArtifactStore(tmp_path)
    state = StateStore(redis_client)
    evaluation = Evaluation(
        id="gradejob",
        model=ModelEndpoint(base_url="http://127.0.0.1:9/v1", model="m"),
        suite="pybench",
        tasks=[44, 134],
        max_turns=10,
        cell_timeout_s=60,
        prompt="gpt",
        sampling=Sampling(),
    )
    state.create(evaluation, None)
    for index, answer in ((44, "Finished: saved"), (134, "Finished: no idea")):
        store.put_trajectory(
            Trajectory(
                evaluation_id=evaluation.id,
                task_index=index,
                attempt=1,
                end_reason=EndReason.NO_CODE,
                messages=[Message(role="user", content="q"), Message(role="assistant", content=answer)],
            )
        )
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
