"""A trajectory as the task page shows it: the messages in order, each assistant reply with its turn (prose, the
code highlighted, and the cell's output, charts, telemetry and errors), pairing replies and turns the way the
notebook export does (``gateway.notebook``)."""

import re
from dataclasses import dataclass, field

from markupsafe import Markup

from gateway.dashboard.highlight import highlight_python
from gateway.notebook import split_reply
from services.pybench.rules import DATA_MESSAGE_PREFIX, interpreter_output, is_interpreter_message
from services.trajectory import Execution, Trajectory, Turn

_BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")


@dataclass
class Cell:
    """What one code cell did, as shown under its code."""

    output: str
    images: list[str]
    """``data:image/png;base64,...`` URLs of the charts it displayed (only well-formed base64 is kept)."""
    images_dropped: int = 0
    error: str | None = None
    """``Name: value`` of the exception it raised; a time-out or a lost kernel is said here too."""
    timed_out: bool = False
    kernel_restarted: bool = False
    truncated: bool = False
    duration_s: float | None = None
    cpu_s: float | None = None
    peak_memory_mb: float | None = None
    telemetry_scope: str | None = None


@dataclass
class Block:
    """One entry of the conversation: a message, or an assistant turn with its cell."""

    role: str
    """``system``, ``data``, ``query``, ``interpreter``, ``user``, ``tool`` or ``assistant``."""
    text: str
    turn: int | None = None
    code: Markup | None = None
    cell: Cell | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    replayed: bool = False
    """The reply came from the evaluation's reply cache: no model call was made for it in this attempt."""
    flags: list[str] = field(default_factory=list)


def _image_urls(images: list[str]) -> list[str]:
    urls = []
    for image in images:
        compact = "".join(image.split())
        if compact and _BASE64.match(compact):
            urls.append("data:image/png;base64," + compact)
    return urls


def _cell_of(execution: Execution) -> Cell:
    error = None
    if execution.error_name is not None:
        error = f"{execution.error_name}: {execution.error_value or ''}".rstrip(": ")
    elif execution.timed_out:
        error = "Time-out: the cell ran past its time limit and was stopped"
    elif execution.kernel_restarted:
        error = "Kernel died: the kernel was restarted during the cell; every variable is lost"
    return Cell(
        output=execution.output,
        images=_image_urls(execution.images),
        images_dropped=execution.images_dropped,
        error=error,
        timed_out=execution.timed_out,
        kernel_restarted=execution.kernel_restarted,
        truncated=execution.truncated,
        duration_s=execution.duration_s,
        cpu_s=execution.cpu_s,
        peak_memory_mb=execution.peak_memory_mb,
        telemetry_scope=execution.telemetry_scope,
    )


def _user_role(content: str, seen_query: bool) -> str:
    if content.startswith(DATA_MESSAGE_PREFIX):
        return "data"
    return "user" if seen_query or content.startswith("[INFO]") else "query"


def _assistant_block(content: str, number: int, turn: Turn | None, has_tool_calls: bool) -> Block:
    prose, code = split_reply(content)
    if has_tool_calls and turn is not None and turn.code is not None:
        code = turn.code
    block = Block(role="assistant", text=prose, turn=number)
    if code is not None:
        block.code = highlight_python(code)
    if turn is not None:
        block.prompt_tokens, block.completion_tokens = turn.prompt_tokens, turn.completion_tokens
        block.latency_s = turn.model_latency_s
        block.replayed = turn.replayed
        if code is not None and turn.execution is not None:
            block.cell = _cell_of(turn.execution)
    return block


def conversation(trajectory: Trajectory) -> list[Block]:
    """The blocks of a trajectory, in order. An interpreter message that answers a cell whose execution the turn
    recorded is shown once, as that cell's output; otherwise it becomes the cell's output text. Raises nothing."""
    blocks: list[Block] = []
    turns = list(trajectory.turns)
    messages = trajectory.messages
    replies, seen_query = 0, False
    skip: set[int] = set()
    for position, message in enumerate(messages):
        if position in skip:
            continue
        if message.role == "system":
            blocks.append(Block(role="system", text=message.content))
            continue
        if message.role in ("user", "tool"):
            if is_interpreter_message(message):
                blocks.append(Block(role="interpreter", text=interpreter_output(message.content)))
                continue
            role = message.role if message.role == "tool" else _user_role(message.content, seen_query)
            seen_query = seen_query or role == "query"
            blocks.append(Block(role=role, text=message.content))
            continue
        turn = turns[replies] if replies < len(turns) else None
        replies += 1
        block = _assistant_block(message.content, replies, turn, bool(message.tool_calls))
        following = messages[position + 1] if position + 1 < len(messages) else None
        if block.code is not None and following is not None and is_interpreter_message(following):
            skip.add(position + 1)
            if block.cell is None:
                block.cell = Cell(output=interpreter_output(following.content), images=[])
        blocks.append(block)
    return blocks
