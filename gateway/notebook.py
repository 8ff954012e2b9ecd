"""A task's trajectory as a Jupyter notebook: the conversation as markdown, the code the assistant ran as code
cells, and what the interpreter answered as their outputs (text, errors, images).

Each assistant message is paired with its turn (the i-th assistant message is the i-th turn). The code of a
reply is its first cell as the agent loop reads it (``services.pybench.extraction``); in tools mode, where the code
came in an ``execute_python`` call, it is the turn's code. The output is the turn's execution when the
trajectory has it, else the code interpreter message that follows (``services.pybench.rules``).

The CLI's ``export`` writes these from an archive it downloaded; the dashboard offers one per task.
"""

import importlib
from typing import Any

from services.pybench.extraction import find_cell
from services.pybench.rules import interpreter_output, is_interpreter_message
from services.trajectory import Execution, Message, Trajectory, Turn


def split_reply(reply: str) -> tuple[str, str | None]:
    """The reply's prose (without its first cell's block) and the code of that cell (``extract_code``'s), or
    None without code."""
    cell = find_cell(reply)
    if cell is None:
        return reply.strip(), None
    return (reply[: cell.start] + reply[cell.end :]).strip(), cell.code


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
    if message is None or not is_interpreter_message(message):
        return []
    text = interpreter_output(message.content).lstrip("\n")
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
        if message.role in ("user", "tool"):  # a tool message not shown as a cell's output: a call not run
            label = "Interpreter" if is_interpreter_message(message) else message.role.capitalize()
            cells.append(new_markdown(f"**{label}:**\n\n{message.content}"))
            continue
        turn = turns[assistant_turns] if assistant_turns < len(turns) else None
        assistant_turns += 1
        prose, code = split_reply(message.content)
        if message.tool_calls and turn is not None and turn.code is not None:  # tools mode: the call's code
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
        if following is not None and is_interpreter_message(following):
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
