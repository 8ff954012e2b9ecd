"""Trajectory schemas: the messages of one task session and what happened at each turn.

``messages`` has exactly the shapes of PyBench's ``trajectory.jsonl`` (system, two opening user messages,
then assistant / user "[INFO]This is a Code Interpreter Message:..." pairs); ``turns`` adds what the
benchmark does not record (code, execution details, tokens, latency).
"""

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

MAX_IMAGES_PER_CELL = 8
"""Images kept per cell in the trajectory (charts a cell displayed); the rest are counted in ``images_dropped``."""


class Message(BaseModel):
    """A chat message. In PyBench mode only ``role`` and ``content`` (as the recordings); in tools mode an
    assistant message may carry ``tool_calls`` and a ``tool`` message answers one by ``tool_call_id``. Fields
    that are None are left out when dumped, so PyBench-mode messages dump exactly as recorded."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @model_serializer(mode="wrap")
    def _without_nones(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        return {key: value for key, value in dumped.items() if value is not None or key == "content"}


class Execution(BaseModel):
    """The result of running one code cell."""

    output: str = ""
    error_name: str | None = None
    error_value: str | None = None
    timed_out: bool = False
    """The cell ran past its time limit."""
    interrupted: bool = False
    """The cell was stopped by an interrupt (after its time limit); the kernel kept its state."""
    kernel_restarted: bool = False
    """The kernel was restarted during the cell (it died, or would not stop after an interrupt): state is lost."""
    truncated: bool = False
    """The cell printed more than is kept; the rest was dropped."""
    duration_s: float = 0.0
    """Wall time from sending the cell to the kernel going idle."""
    cpu_s: float | None = None
    """CPU seconds the sandbox spent during the cell (``telemetry_scope`` says whose); None if not measured."""
    peak_memory_mb: float | None = None
    """Peak memory of the sandbox during the cell, in MiB; None if not measured."""
    telemetry_scope: str | None = None
    """``cgroup`` (the whole sandbox) or ``process`` (the kernel process); None when no telemetry was read."""
    images: list[str] = Field(default_factory=list)
    """The cell's images (base64 PNG), at most ``MAX_IMAGES_PER_CELL``; more are dropped and counted."""
    images_dropped: int = 0

    @property
    def ok(self) -> bool:
        return self.error_name is None and not self.timed_out and not self.kernel_restarted


class Turn(BaseModel):
    """One assistant turn: the model's reply and, when it held code, the code's execution."""

    index: int
    reply: str
    code: str | None = None
    execution: Execution | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    model_latency_s: float = 0.0
    replayed: bool = False
    """The reply came from the evaluation's reply cache (a retried session replaying what an earlier attempt
    paid for): no model call was made; its cell ran again in this session's sandbox."""


class EndReason(StrEnum):
    """Why a session stopped."""

    NO_CODE = "no_code"
    MAX_TURNS = "max_turns"
    MODEL_ERROR = "model_error"
    SANDBOX_ERROR = "sandbox_error"
    CONTEXT_LENGTH = "context_length"
    """The conversation outgrew the model's context window: the model's limit, graded as it stands."""
    EMPTY_REPLY = "empty_reply"
    """The model replied with nothing: graded as it stands."""
    CANCELLED = "cancelled"
    """The evaluation was cancelled while the session ran: it stopped before its next turn and is not graded."""
    MODEL_REJECTED = "model_rejected"
    """The endpoint refused the request (a 4xx other than 408/429: unknown model, wrong key, a task it cannot
    serve): graded ``infra_error``, not retried, the user's to fix."""
    KEY_LOST = "key_lost"
    """The evaluation's model key is no longer held, so the endpoint was not called: graded ``infra_error``, not
    retried until the key is sent again."""
    TOKEN_BUDGET = "token_budget"
    """The session used the evaluation's tokens per task (``budgets.max_tokens_per_task``): graded as it stands."""
    TIME_BUDGET = "time_budget"
    """The session ran for the evaluation's seconds per task (``budgets.max_seconds_per_task``): graded as it
    stands."""
    COST_BUDGET = "cost_budget"
    """The evaluation spent its ``budgets.max_cost_usd`` at its prices (over all its sessions): graded as it
    stands."""
    CRASHED = "crashed"
    """The session's own code raised an unexpected error (a bug something in the model's answers or its code's
    output ran into): graded ``infra_error``, not retried (it would crash again), its error kept."""

    @property
    def infra(self) -> bool:
        """Whether the session did not get to test the agent (graded ``infra_error``, never ``failed``)."""
        return self in (
            EndReason.MODEL_ERROR,
            EndReason.SANDBOX_ERROR,
            EndReason.MODEL_REJECTED,
            EndReason.KEY_LOST,
            EndReason.CRASHED,
        )

    @property
    def retryable(self) -> bool:
        """Whether running the session again may go better by itself (a dead sandbox, an endpoint that timed out
        or answered 5xx); the other infra reasons are the user's to fix and are never retried automatically."""
        return self in (EndReason.MODEL_ERROR, EndReason.SANDBOX_ERROR)


class SessionInfo(BaseModel):
    """Where and when a session ran."""

    sandbox_backend: str
    sandbox_id: str
    sandbox_name: str
    image: str
    started_at: datetime
    ended_at: datetime | None = None
    ready_s: float = 0.0
    """Seconds from the session's start until its sandbox's kernel answered (near zero when warm)."""
    warm: bool = False
    """The sandbox came from the executor's warm pool (started ahead, common libraries imported)."""


class Trajectory(BaseModel):
    evaluation_id: str
    task_index: int
    attempt: int
    messages: list[Message]
    turns: list[Turn] = Field(default_factory=list)
    end_reason: EndReason
    error: str | None = None
    session: SessionInfo | None = None
    wall_s: float = 0.0
    output_files: list[str] = Field(default_factory=list)
    """What was collected from ``./output`` (``./output/...``; an empty folder ends with ``/``), stored and graded:
    all of it, unless ``output_truncated`` says otherwise."""
    output_truncated: str | None = None
    """Set when ``./output`` held more than a session may leave (``services.sandbox.base.DEFAULT_MAX_TREE_FILES``
    entries, ``DEFAULT_MAX_TREE_BYTES`` bytes): how much it held, what was kept (the first entries by name,
    listed in ``output_files``) and from which name on the rest was dropped. None: nothing was dropped (and in
    trajectories recorded before the caps)."""

    @property
    def prompt_tokens(self) -> int | None:
        """Prompt tokens over every turn, as the endpoint reported them; None when it reported none."""
        counts = [t.prompt_tokens for t in self.turns if t.prompt_tokens is not None]
        return sum(counts) if counts else None

    @property
    def completion_tokens(self) -> int | None:
        """Completion tokens over every turn, as the endpoint reported them; None when it reported none."""
        counts = [t.completion_tokens for t in self.turns if t.completion_tokens is not None]
        return sum(counts) if counts else None

    @property
    def replayed_turns(self) -> int:
        """Turns whose reply came from the reply cache: model calls this session did not pay for again."""
        return sum(1 for t in self.turns if t.replayed)

    @property
    def replayed_tokens(self) -> int:
        """Prompt and completion tokens of the replayed turns (as the endpoint reported them when they were paid)."""
        return sum((t.prompt_tokens or 0) + (t.completion_tokens or 0) for t in self.turns if t.replayed)

    @property
    def assistant_turns(self) -> int:
        return sum(1 for message in self.messages if message.role == "assistant")

    @property
    def last_message(self) -> str:
        """The content of the last message, whatever its role: what PyBench's tests read as the answer."""
        return self.messages[-1].content if self.messages else ""

    def pybench_record(self, task_fields: dict[str, Any]) -> dict[str, Any]:
        """Return one line of a PyBench-compatible ``trajectory.jsonl``: the messages plus the task's fields."""
        return {"messages": [m.model_dump() for m in self.messages], **task_fields}
