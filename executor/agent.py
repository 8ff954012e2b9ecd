"""The agent loop: ask the model, run its code in the kernel, report the output, until it stops.

The loop ends on a reply without code (the agent's answer), at the turn limit, when the conversation
outgrows the model's context or the model replies with nothing (the model's limits, graded as they stand),
or when the model endpoint or the sandbox fails (an infrastructure error, recorded as such in the trajectory).
"""

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from executor.kernel import KernelClient
from executor.messages import interpreter_message, output_text
from executor.model import ModelClient
from services.errors import ModelContextLengthError, ModelEndpointError, SandboxError
from services.extraction import extract_code
from services.trajectory import MAX_IMAGES_PER_CELL, EndReason, Message, Turn

log = logging.getLogger(__name__)


@dataclass
class AgentRun:
    messages: list[Message]
    turns: list[Turn] = field(default_factory=list)
    end_reason: EndReason = EndReason.MAX_TURNS
    error: str | None = None


def run_agent(
    messages: list[Message],
    model: ModelClient,
    kernel: KernelClient,
    *,
    max_turns: int,
    cell_timeout_s: float,
    sampling: dict[str, Any],
) -> AgentRun:
    """Run the loop from the opening ``messages``; never raises for model or sandbox failures."""
    run = AgentRun(messages=list(messages))
    for index in range(1, max_turns + 1):
        try:
            completion = model.complete(run.messages, sampling)
        except ModelContextLengthError as exc:
            run.end_reason, run.error = EndReason.CONTEXT_LENGTH, str(exc)
            return run
        except ModelEndpointError as exc:
            run.end_reason, run.error = EndReason.MODEL_ERROR, str(exc)
            return run
        if not completion.text.strip():
            run.end_reason, run.error = (
                EndReason.EMPTY_REPLY,
                f"the model replied with nothing ({completion.finish_reason})",
            )
            return run
        run.messages.append(Message(role="assistant", content=completion.text))
        turn = Turn(
            index=index,
            reply=completion.text,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            model_latency_s=completion.latency_s,
        )
        run.turns.append(turn)
        code = extract_code(completion.text)
        if code is None:
            run.end_reason = EndReason.NO_CODE
            return run
        turn.code = code
        started = time.monotonic()
        try:
            execution, output = kernel.execute(code, cell_timeout_s)
        except SandboxError as exc:
            run.end_reason, run.error = EndReason.SANDBOX_ERROR, str(exc)
            return run
        execution.output = output_text(output)
        execution.images = output.images[:MAX_IMAGES_PER_CELL]
        execution.images_dropped = max(0, len(output.images) - MAX_IMAGES_PER_CELL) + output.dropped_images
        turn.execution = execution
        run.messages.append(interpreter_message(execution, output))
        log.debug("turn %d: cell ran in %.3f s", index, time.monotonic() - started)
    run.end_reason = EndReason.MAX_TURNS
    return run
