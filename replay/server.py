"""The replay model: an OpenAI-compatible chat-completions server that answers with recorded trajectories.

Given a PyBench ``trajectory.jsonl``, it finds the task of each request by its query (the first user message
that is not an ``[INFO]`` message) and answers with the recorded assistant message whose position is the
number of assistant messages already in the request. Past the recording's end it answers with a reply
without code, so an agent loop stops. It is stateless: any number of sessions may run at once.

Use: re-execute a published trajectory file through the real sandboxes (the code is run again; only the
model's words are replayed), and a model that answers at once for the demo and the tests::

    python -m replay.server --trajectories ../shared/pybench/trajectory.jsonl --port 8000

``--latency S`` (or ``PBE_REPLAY_LATENCY_S``) makes every answer take S seconds, like a served model under load,
without holding a thread. ``GET /stats`` says how many requests it answered and the most it had in flight at once
(``POST /stats/reset`` starts counting again), so a test or benchmark sees the load the endpoint got.

``--seed-split`` (or ``PBE_REPLAY_SEED_SPLIT=1``) makes the answers depend on the request's ``seed``, as a sampled
model's do: with an odd seed the first answer gives up without code (``SEED_GIVES_UP``), so the task fails; an even
seed, or none, replays the recording. Epochs of a run, each with its own seed, then differ as the tests expect.
"""

import argparse
import asyncio
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from replay.recordings import Recordings, load_recordings
from services.pybench.rules import task_query

DEFAULT_MODEL_NAME = "pybench-replay"
"""The model name the server lists and answers as."""

END_OF_RECORDING = "Finished: the recorded trajectory ends here."
"""The reply past the last recorded assistant message: it holds no code, so the session ends."""


class ChatMessage(BaseModel):
    role: str
    content: str | None = None


class ChatRequest(BaseModel):
    model: str = DEFAULT_MODEL_NAME
    messages: list[ChatMessage] = Field(min_length=1)
    seed: int | None = None


SEED_GIVES_UP = "Finished: I cannot do this one (this seed's answer)."
"""The answer to an odd seed under ``--seed-split``: no code, a wrong final answer."""


def estimate_tokens(text: str) -> int:
    """A token count estimate, one token per four characters (the replay has no tokenizer)."""
    return math.ceil(len(text) / 4)


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "code": code}}, status_code=status
    )


class _Load:
    """Requests answered, and in flight now and at most (one event loop: no lock needed)."""

    def __init__(self) -> None:
        self.requests = 0
        self.in_flight = 0
        self.peak_in_flight = 0

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "in_flight": self.in_flight, "peak_in_flight": self.peak_in_flight}


def create_app(
    recordings_path: Path, model_name: str = DEFAULT_MODEL_NAME, *, latency_s: float = 0.0, seed_split: bool = False
) -> FastAPI:
    """Make the replay server; every answer takes ``latency_s`` seconds; ``seed_split``: an odd ``seed`` gives up
    (``SEED_GIVES_UP``).

    Raises:
        ConfigurationError: the recordings cannot be read.
    """
    recordings: Recordings = load_recordings(recordings_path)
    app = FastAPI(title="pybench-eval replay model", version="0.1.0")
    load = _Load()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, f"not a chat completion request: {exc.errors()[:3]}", "invalid_request")

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "recordings": len(recordings)}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "pybench-eval"}]}

    @app.get("/stats")
    def stats() -> dict[str, int]:
        return load.as_dict()

    @app.post("/stats/reset")
    def reset_stats() -> dict[str, int]:
        load.requests, load.peak_in_flight = 0, load.in_flight
        return load.as_dict()

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatRequest) -> dict[str, Any] | JSONResponse:
        load.requests += 1
        load.in_flight += 1
        load.peak_in_flight = max(load.peak_in_flight, load.in_flight)
        try:
            if latency_s > 0:
                await asyncio.sleep(latency_s)
            return answer(body)
        finally:
            load.in_flight -= 1

    def answer(body: ChatRequest) -> dict[str, Any] | JSONResponse:
        messages = [m.model_dump() for m in body.messages]
        query = task_query(messages)
        if query is None or query not in recordings:
            return _error(
                404,
                "no recorded trajectory has this task's query; replay only the tasks of the trajectory file",
                "task_not_recorded",
            )
        turn = sum(1 for m in body.messages if m.role == "assistant")
        if seed_split and body.seed is not None and body.seed % 2 == 1:
            content = SEED_GIVES_UP
        else:
            content = recordings.reply(query, turn) or END_OF_RECORDING
        prompt_tokens = sum(estimate_tokens(m.content or "") for m in body.messages)
        completion_tokens = estimate_tokens(content)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    return app


def default_trajectories() -> Path:
    """``PBE_REPLAY_TRAJECTORIES``, else the suite's ``trajectory.jsonl`` (``PBE_SUITE_PATH``)."""
    if "PBE_REPLAY_TRAJECTORIES" in os.environ:
        return Path(os.environ["PBE_REPLAY_TRAJECTORIES"])
    return Path(os.environ.get("PBE_SUITE_PATH", "../shared/pybench")) / "trajectory.jsonl"


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Serve recorded PyBench trajectories as an OpenAI-compatible model.")
    parser.add_argument("--trajectories", type=Path, default=default_trajectories())
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model-name", default=DEFAULT_MODEL_NAME)
    parser.add_argument(
        "--latency",
        type=float,
        default=float(os.environ.get("PBE_REPLAY_LATENCY_S", "0")),
        help="seconds every answer takes (default: PBE_REPLAY_LATENCY_S, else 0)",
    )
    parser.add_argument(
        "--seed-split",
        action="store_true",
        default=os.environ.get("PBE_REPLAY_SEED_SPLIT", "0") == "1",
        help="odd seeds give up without code (default: PBE_REPLAY_SEED_SPLIT=1)",
    )
    args = parser.parse_args()
    app = create_app(args.trajectories, args.model_name, latency_s=max(0.0, args.latency), seed_split=args.seed_split)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
