"""A task's trajectory as a Jupyter notebook: the conversation as markdown, the code the assistant ran as code
cells, and what the interpreter answered as their outputs (text, errors, images).

Each assistant message is paired with its turn (the i-th assistant message is the i-th turn): the turn's
code and execution are used when the trajectory has them; otherwise the code is the reply's first
```` ```python ```` fence and its output is the interpreter message that follows.
"""

import importlib
import re
from typing import Any

from services.trajectory import Execution, Message, Trajectory, Turn

INTERPRETER_PREFIX = "[INFO]This is a Code Interpreter Message:"
"""How PyBench's code interpreter messages (the results of a cell, sent as user messages) begin."""

_PYTHON_FENCE = re.compile(
    r"(?:<\|execute_start\|>\s*)?```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)(?:```|\Z)(?:\s*<\|execute_end\|>)?",
    re.DOTALL | re.IGNORECASE,
)
_MARKED = re.compile(r"<\|execute_start\|>(.*?)(?:<\|execute_end\|>|\Z)", re.DOTALL)


def split_reply(reply: str) -> tuple[str, str | None]:
    """The reply's prose (without its code block) and the code of its first cell, or None without code."""
    found = _PYTHON_FENCE.search(reply) or _MARKED.search(reply)
    if found is None:
        return reply.strip(), None
    code = found.group(1).strip("\n")
    if code.lstrip().startswith("```"):  # a bare fence inside execute markers
        code = code.lstrip().split("\n", 1)[-1].rsplit("```", 1)[0].strip("\n")
    prose = (reply[: found.start()] + reply[found.end() :]).strip()
    return prose, code if code.strip() else None


def _execution_outputs(nbformat: Any, execution: Execution) -> list[Any]:
    outputs = []
    text = execution.output + ("\n[output truncated]\n" if execution.truncated else "")
    if text:
        outputs.append(nbformat.v4.new_output("stream", name="stdout", text=text))
    for image in execution.images:
        outputs.append(nbformat.v4.new_output("display_data", data={"image/png": image}))
    if execution.images_dropped:
        dropped = f"[{execution.images_dropped} more images not kept]\n"
        outputs.append(nbformat.v4.new_output("stream", name="stderr", text=dropped))
    if execution.error_name is not None:
        error = (execution.error_name, execution.error_value or "")
    elif execution.timed_out:
        error = ("TimeoutError", "the cell ran past its time limit and was stopped")
    elif execution.kernel_restarted:
        error = ("KernelDiedError", "the kernel died during the cell and was restarted; every variable is lost")
    else:
        return outputs
    outputs.append(
        nbformat.v4.new_output("error", ename=error[0], evalue=error[1], traceback=[f"{error[0]}: {error[1]}"])
    )
    return outputs


def _message_outputs(nbformat: Any, message: Message | None) -> list[Any]:
    if message is None or not message.content.startswith(INTERPRETER_PREFIX):
        return []
    text = message.content.removeprefix(INTERPRETER_PREFIX).lstrip("\n")
    return [nbformat.v4.new_output("stream", name="stdout", text=text)] if text else []


def build_notebook(trajectory: Trajectory, category: str | None = None) -> Any:
    """The trajectory as an nbformat v4 notebook (``nbformat.NotebookNode``); ``nbformat.validate`` accepts it.

    Raises:
        ImportError: nbformat is not installed.
    """
    nbformat: Any = importlib.import_module("nbformat")  # untyped: used as Any
    new_markdown, new_code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    where = f" ({category})" if category else ""
    head = (
        f"# Task {trajectory.task_index}{where}\n\nEvaluation `{trajectory.evaluation_id}`, attempt "
        f"{trajectory.attempt}; the session ended: `{trajectory.end_reason.value}`"
    )
    if trajectory.error:
        head += f" ({trajectory.error})"
    cells = [new_markdown(head)]
    turns: list[Turn] = list(trajectory.turns)
    messages = trajectory.messages
    system = ""
    assistant_turns, count = 0, 0
    skip: set[int] = set()  # interpreter messages shown as a code cell's outputs
    for position, message in enumerate(messages):
        if position in skip:
            continue
        if message.role == "system":
            system = message.content
            continue
        if message.role == "user":
            label = "Interpreter" if message.content.startswith(INTERPRETER_PREFIX) else "User"
            cells.append(new_markdown(f"**{label}:**\n\n{message.content}"))
            continue
        turn = turns[assistant_turns] if assistant_turns < len(turns) else None
        assistant_turns += 1
        prose, code = split_reply(message.content)
        if turn is not None and turn.code is not None:
            code = turn.code
        title = f"**Assistant** (turn {assistant_turns})"
        cells.append(new_markdown(f"{title}:\n\n{prose}" if prose else title))
        if code is None:
            continue
        following = messages[position + 1] if position + 1 < len(messages) else None
        if turn is not None and turn.execution is not None:
            outputs = _execution_outputs(nbformat, turn.execution)
        else:
            outputs = _message_outputs(nbformat, following)
        if following is not None and following.content.startswith(INTERPRETER_PREFIX):
            skip.add(position + 1)
        count += 1
        cells.append(new_code(code, execution_count=count, outputs=outputs))
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata.update(
        {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
            "pybench_eval": {
                "evaluation_id": trajectory.evaluation_id,
                "task_index": trajectory.task_index,
                "attempt": trajectory.attempt,
                "end_reason": trajectory.end_reason.value,
                "system_prompt": system,
            },
        }
    )
    return notebook
