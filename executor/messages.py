"""PyBench's message shapes: the opening messages of a session and the code interpreter's replies, written with
the conventions of ``services.pybench.rules``."""

from executor.output import CellOutput
from services.pybench.rules import ERROR_PREAMBLE, data_message_text
from services.pybench.rules import INTERPRETER_PREFIX as INTERPRETER_PREFIX  # re-exported: callers import it from here
from services.task import Task
from services.trajectory import Execution, Message


def data_message(task: Task) -> Message:
    """The first user message: where the task's files are, joined by commas as PyBench does."""
    return Message(role="user", content=data_message_text(i.path for i in task.inputs))


def opening_messages(system_prompt: str, task: Task) -> list[Message]:
    """The system prompt, the data message and the query.

    PyBench sends the data message even when a task has no input file (``[INFO]The data is uploaded to ``
    with nothing after it); the recorded trajectories show it, so it is kept.
    """
    return [Message(role="system", content=system_prompt), data_message(task), Message(role="user", content=task.query)]


def output_text(output: CellOutput) -> str:
    """The cell's text as the model sees it: streams and results in order, one after another.

    A displayed image (``plt.show()`` under the inline backend) adds no text: the recorded trajectories ran
    matplotlib without a display, where ``plt.show()`` shows nothing; its ``text/plain`` would be a repr such as
    ``<Figure size 640x480 with 1 Axes>``. A result keeps its text, image or not (``<PIL.Image ...>``, as
    recorded).
    """
    parts = [
        item.text
        for item in output.items
        if item.kind in ("stream", "result", "display") and item.text and not (item.kind == "display" and item.images)
    ]
    text = "".join(part if part.endswith("\n") else part + "\n" for part in parts[:-1])
    text += parts[-1] if parts else ""
    if output.dropped_chars:
        text += f"\n[output truncated: {output.dropped_chars} more characters]"
    return text


def interpreter_message(execution: Execution, output: CellOutput) -> Message:
    """The user message that reports a cell's execution back to the model."""
    if execution.timed_out:
        how = "the kernel was restarted and every variable is lost" if execution.kernel_restarted else "interrupted"
        reason = f"The cell ran longer than its time limit and was stopped ({how})"
        body = ERROR_PREAMBLE + f"Error: TimeoutError\n{reason}\n"
    elif execution.kernel_restarted:
        reason = "The kernel died while running the cell (out of memory, or killed) and was restarted"
        body = ERROR_PREAMBLE + f"Error: KernelDiedError\n{reason}; every variable is lost\n"
    elif execution.error_name is not None:
        body = ERROR_PREAMBLE + f"Error: {execution.error_name}\n{execution.error_value or ''}\n"
    else:
        body = output_text(output)
    return Message(role="user", content=INTERPRETER_PREFIX + body)
