"""The agent loop: ask the model, run its code in the kernel, report the output, until it stops.

The loop ends on a reply without code (the agent's answer), at the turn limit, when the conversation
outgrows the model's context or the model replies with nothing (the model's limits, graded as they stand),
when the endpoint refuses the request (a 4xx: ``model_rejected``, the user's to fix, never retried), or when
the model endpoint or the sandbox fails (an infrastructure error, recorded as such in the trajectory).
"""

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from executor.kernel import KernelClient
from executor.messages import interpreter_message, output_text
from services.endpoint.client import ChatMessage, Completion
from services.errors import ModelContextLengthError, ModelEndpointError, ModelRequestRejectedError, SandboxError
from services.evaluation import Budgets
from services.pybench.extraction import extract_code
from services.trajectory import MAX_IMAGES_PER_CELL, EndReason, Message, Turn

log = logging.getLogger(__name__)


class ChatModel(Protocol):
    """What the loop asks for completions: an ``EndpointClient``, or a session's ``executor.calls.SessionModel``
    (its reply cache and spend)."""

    def complete(
        self,
        messages: Sequence[ChatMessage],
        sampling: Mapping[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Completion: ...


@dataclass
class AgentRun:
    messages: list[Message]
    turns: list[Turn] = field(default_factory=list)
    end_reason: EndReason = EndReason.MAX_TURNS
    error: str | None = None


EXECUTE_PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "execute_python",
        "description": "Run Python code in a Jupyter kernel whose working directory holds ./data (the inputs) and "
        "./output (where files must be saved). State persists between calls. Returns the cell's output.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code of one cell."}},
            "required": ["code"],
        },
    },
}
"""The one tool of the tool-calling mode."""


CALL_SHAPE = '{"type": "function", "function": {"name": "execute_python", "arguments": "{\\"code\\": \\"...\\"}"}}'
"""What a call must look like, quoted to a model whose call is not of that shape."""


def tool_code(call: dict[str, Any]) -> tuple[str | None, str]:
    """The code of an ``execute_python`` call, or None with the reason it cannot run. Any shape the model sends
    (a ``function`` that is not an object, arguments that are not text, JSON nested past the parser's depth) is a
    reason, never an exception."""
    function = call.get("function")
    if not isinstance(function, dict):
        return None, f"the call has no function object: send {CALL_SHAPE}"
    name = function.get("name")
    if name != "execute_python":
        return None, f"unknown tool {str(name)[:100]!r}: the only tool is execute_python"
    raw = function.get("arguments")
    if raw is not None and not isinstance(raw, str):
        return None, f"the arguments must be a JSON text: send {CALL_SHAPE}"
    try:
        arguments = json.loads(raw or "{}")
    except (ValueError, RecursionError):
        return None, 'the arguments are not JSON: send {"code": "..."}'
    code = arguments.get("code") if isinstance(arguments, dict) else None
    if not isinstance(code, str) or not code.strip():
        return None, "the arguments need a non-empty string 'code'"
    return code, ""


def call_id(call: dict[str, Any]) -> str | None:
    """The id a ``tool`` message answers ``call`` by: the call's own when it is text, else none."""
    value = call.get("id")
    return value[:200] if isinstance(value, str) else None


def _not_run(calls: list[dict[str, Any]]) -> list[Message]:
    """The answers to the calls of a reply after its first: each needs one, and only one cell runs per turn."""
    return [Message(role="tool", tool_call_id=call_id(call), content="not run: one call per turn") for call in calls]


def _over_budget(
    run: AgentRun, budgets: Budgets | None, elapsed_s: float, spent_usd: Callable[[], float | None] | None
) -> tuple[EndReason, str] | None:
    """The end reason and its words when ``run`` has used a budget (its turns' tokens, or ``elapsed_s``), or its
    evaluation has (``spent_usd``: what it spent over all its sessions)."""
    if budgets is None:
        return None
    if budgets.max_cost_usd is not None and spent_usd is not None:
        spent = spent_usd()
        if spent is not None and spent >= budgets.max_cost_usd:
            return EndReason.COST_BUDGET, (
                f"the evaluation spent ${spent:,.4f} on model calls, its budget of ${budgets.max_cost_usd:,.4f}"
            )
    tokens = sum((t.prompt_tokens or 0) + (t.completion_tokens or 0) for t in run.turns)
    if budgets.max_tokens_per_task is not None and tokens >= budgets.max_tokens_per_task:
        return EndReason.TOKEN_BUDGET, (
            f"the session used {tokens:,} tokens, its budget of {budgets.max_tokens_per_task:,} per task"
        )
    if budgets.max_seconds_per_task is not None and elapsed_s >= budgets.max_seconds_per_task:
        return EndReason.TIME_BUDGET, (
            f"the session ran {elapsed_s:.1f} s, its budget of {budgets.max_seconds_per_task:g} s per task"
        )
    return None


def run_agent(
    messages: list[Message],
    model: ChatModel,
    kernel: KernelClient,
    *,
    max_turns: int,
    cell_timeout_s: float,
    sampling: dict[str, Any],
    tools: bool = False,
    cancelled: Callable[[], bool] | None = None,
    budgets: Budgets | None = None,
    spent_usd: Callable[[], float | None] | None = None,
) -> AgentRun:
    """Run the loop from the opening ``messages``; never raises for model or sandbox failures.

    ``budgets``: before each turn, a session that has used its tokens (prompt and completion, as the endpoint
    reported them) or its seconds (since the loop began) ends ``token_budget`` or ``time_budget``; once
    ``spent_usd()`` (the evaluation's spend) reaches ``max_cost_usd``, ``cost_budget``.

    A reply ``model`` replays from its cache (``Completion.replayed``) is marked on its turn; its cell runs as any.

    ``cancelled`` is asked before each turn: when it says so, the session ends ``cancelled`` (the turn in
    flight, a model call and its cell, always finishes).

    ``tools``: offer ``execute_python`` through the OpenAI tools API instead of reading code from the reply's
    text; the first call of a reply runs (further ones are answered as not run), and a reply without a call
    ends the session.

    Anything else that goes wrong in the loop (a bug the model's answers or its code's output run into) ends the
    session ``crashed`` with the error named, its turns so far kept: never an exception out of the session.
    """
    run = AgentRun(messages=list(messages))
    try:
        return _take_turns(
            run, model, kernel, max_turns, cell_timeout_s, sampling, tools, cancelled, budgets, spent_usd
        )
    except Exception as exc:  # the session's boundary: recorded as its end, never a crashed job
        log.exception("the agent loop crashed")
        run.end_reason = EndReason.CRASHED
        run.error = (
            f"the session crashed on an unexpected {type(exc).__name__}: {str(exc)[:300]}; this is the service's "
            "fault, not the model's: report it with this trajectory"
        )
        return run


def _take_turns(
    run: AgentRun,
    model: ChatModel,
    kernel: KernelClient,
    max_turns: int,
    cell_timeout_s: float,
    sampling: dict[str, Any],
    tools: bool,
    cancelled: Callable[[], bool] | None,
    budgets: Budgets | None,
    spent_usd: Callable[[], float | None] | None,
) -> AgentRun:
    """The turns of ``run_agent``, into ``run``."""
    started = time.monotonic()
    for index in range(1, max_turns + 1):
        if cancelled is not None and cancelled():
            run.end_reason, run.error = EndReason.CANCELLED, "the evaluation was cancelled"
            return run
        spent = _over_budget(run, budgets, time.monotonic() - started, spent_usd)
        if spent is not None:
            run.end_reason, run.error = spent
            return run
        try:
            completion = model.complete(run.messages, sampling, [EXECUTE_PYTHON_TOOL] if tools else None)
        except ModelContextLengthError as exc:
            run.end_reason, run.error = EndReason.CONTEXT_LENGTH, str(exc)
            return run
        except ModelRequestRejectedError as exc:
            run.end_reason, run.error = EndReason.MODEL_REJECTED, str(exc)
            return run
        except ModelEndpointError as exc:
            run.end_reason, run.error = EndReason.MODEL_ERROR, str(exc)
            return run
        if not completion.text.strip() and not (tools and completion.tool_calls):
            run.end_reason, run.error = (
                EndReason.EMPTY_REPLY,
                f"the model replied with nothing ({completion.finish_reason})",
            )
            return run
        calls = completion.tool_calls if tools else []
        run.messages.append(Message(role="assistant", content=completion.text, tool_calls=calls or None))
        turn = Turn(
            index=index,
            reply=completion.text,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            model_latency_s=completion.latency_s,
            replayed=completion.replayed,
        )
        run.turns.append(turn)
        if tools:
            if not calls:
                run.end_reason = EndReason.NO_CODE
                return run
            code, problem = tool_code(calls[0])
            if code is None:
                run.messages.append(Message(role="tool", tool_call_id=call_id(calls[0]), content=problem))
                run.messages.extend(_not_run(calls[1:]))
                continue
        else:
            code = extract_code(completion.text)
            if code is None:
                run.end_reason = EndReason.NO_CODE
                return run
        turn.code = code
        cell_started = time.monotonic()
        try:
            execution, output = kernel.execute(code, cell_timeout_s)
        except SandboxError as exc:
            run.end_reason, run.error = EndReason.SANDBOX_ERROR, str(exc)
            return run
        execution.output = output_text(output)
        execution.images = output.images[:MAX_IMAGES_PER_CELL]
        execution.images_dropped = max(0, len(output.images) - MAX_IMAGES_PER_CELL) + output.dropped_images
        turn.execution = execution
        reported = interpreter_message(execution, output)
        if tools:
            reported = Message(role="tool", tool_call_id=call_id(calls[0]), content=reported.content)
        run.messages.append(reported)
        run.messages.extend(_not_run(calls[1:]))
        log.debug("turn %d: cell ran in %.3f s", index, time.monotonic() - cell_started)
    run.end_reason = EndReason.MAX_TURNS
    return run
