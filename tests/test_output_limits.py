"""A session that leaves more in ``./output`` than is collected: the first entries by name are stored and graded,
the trajectory says what was dropped, and the verdict is the agent's (never ``infra_error``). Local backend,
real Redis, a scripted model server on loopback."""

from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from redis import Redis

from services.pybench.suite import Suite, load_suite
from services.sandbox.base import DEFAULT_MAX_TREE_FILES
from services.store import ArtifactStore
from services.trajectory import EndReason
from services.verdict import VerdictStatus
from tests.factories import make_evaluation
from tests.fixtures import run_and_grade
from tests.servers import serve

MANY_FILES = 10_000
WRITE_MANY = (
    "import os\nos.makedirs('./output', exist_ok=True)\n"
    f"for i in range({MANY_FILES}):\n"
    "    open(f'./output/{i:05d}.txt', 'w').write('x' * 4000)\n"
    "print(len(os.listdir('./output')))"
)


@pytest.fixture()
def suite(suite_path: Path) -> Suite:
    return load_suite(suite_path)


def scripted_model() -> FastAPI:
    """A model that writes ``MANY_FILES`` files of 4,000 bytes in its first turn and stops in its second."""
    app = FastAPI()
    replies = [f"Action:\n```python\n{WRITE_MANY}\n```", "Finished: the files are written."]

    @app.post("/v1/chat/completions")
    async def complete() -> JSONResponse:
        reply = replies.pop(0) if len(replies) > 1 else replies[0]
        return JSONResponse(
            {
                "choices": [{"message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5},
            }
        )

    return app


def test_a_session_that_writes_ten_thousand_files_is_capped_noted_and_graded(
    redis_url: str, redis_client: Redis, suite: Suite, tmp_path: Path
) -> None:
    with serve(scripted_model()) as url:
        evaluation = make_evaluation("capped", [7], suite=suite, base_url=url + "/v1", model="scripted")
        verdict = run_and_grade(evaluation, suite, redis_url, redis_client, tmp_path)
    store = ArtifactStore(tmp_path)
    trajectory = store.get_trajectory("capped", 7, 1)
    assert trajectory.end_reason is EndReason.NO_CODE
    assert trajectory.messages[-2].content.endswith(f"{MANY_FILES}\n")
    stored = store.list_output_files("capped", 7, 1)
    assert len(stored) == DEFAULT_MAX_TREE_FILES and stored == trajectory.output_files
    assert stored[0] == "./output/00000.txt" and stored[-1] == f"./output/{DEFAULT_MAX_TREE_FILES - 1:05d}.txt"
    note = trajectory.output_truncated
    assert note is not None
    assert f"{MANY_FILES:,} entries" in note and f"from ./output/{DEFAULT_MAX_TREE_FILES:05d}.txt on" in note
    assert f"{MANY_FILES - DEFAULT_MAX_TREE_FILES:,} were dropped" in note
    stored_bytes = sum(p.stat().st_size for p in store.output_dir("capped", 7, 1).rglob("*") if p.is_file())
    assert stored_bytes == DEFAULT_MAX_TREE_FILES * 4000
    assert verdict.status is not VerdictStatus.INFRA_ERROR, verdict.reason
    assert verdict.status in (VerdictStatus.PASSED, VerdictStatus.FAILED)
