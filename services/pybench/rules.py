"""PyBench's message conventions, defined once: the agent writes them, the replay model, the judge, the
notebook export and the scripts read them.

A PyBench conversation is a system prompt, a data message (``[INFO]The data is uploaded to ...``), the task's
query, then assistant replies each answered by a code interpreter message (a user message starting with
``INTERPRETER_PREFIX``). Every user message the harness writes starts with ``INFO_PREFIX``; the query is the
first user message that does not.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from services.trajectory import Message

INFO_PREFIX = "[INFO]"
"""User messages the harness writes (data locations, code output) start with this; the query does not."""

INTERPRETER_PREFIX = INFO_PREFIX + "This is a Code Interpreter Message:\n"
"""Every code-execution result goes back to the model as a user message starting with this, newline included.

Readers match it without its newline (``is_interpreter_message``, ``interpreter_output``), so a message whose
output follows the colon directly is still recognised."""

ERROR_PREAMBLE = "There are some errors in the code. All variables in this cell should be redefined. Please Debug:\n"
"""What PyBench says, after ``INTERPRETER_PREFIX``, before an error's name and message."""

DATA_MESSAGE_PREFIX = INFO_PREFIX + "The data is uploaded to "
"""The first user message: this, then the task's input paths joined by commas (nothing after it without inputs)."""

_INTERPRETER_MARK = INTERPRETER_PREFIX.removesuffix("\n")

PyBenchMessage = Mapping[str, Any] | Message
"""A chat message as a dict (a recorded line, a request body) or as a ``services.trajectory.Message``."""


def data_message_text(paths: Iterable[str]) -> str:
    """The data message's content: ``DATA_MESSAGE_PREFIX`` and the input paths joined by commas, as PyBench does."""
    return DATA_MESSAGE_PREFIX + ",".join(paths)


def _role_and_content(message: PyBenchMessage) -> tuple[object, object]:
    if isinstance(message, Message):
        return message.role, message.content
    return message.get("role"), message.get("content")


def task_query(messages: Iterable[PyBenchMessage]) -> str | None:
    """Return the task's query in a conversation: its first user message that is not an ``[INFO]`` one.

    The content is returned as written (PyBench's ``user`` field keeps trailing spaces); strip it before
    comparing queries. A message whose content is not a string (None in a request) is passed over.
    Returns None when the conversation has no query. Raises nothing.
    """
    for message in messages:
        role, content = _role_and_content(message)
        if role == "user" and isinstance(content, str) and not content.startswith(INFO_PREFIX):
            return content
    return None


def is_interpreter_message(message: PyBenchMessage) -> bool:
    """Whether a message is a code interpreter message: content starting with ``INTERPRETER_PREFIX`` (matched
    without its newline) in a user message, or in a ``tool`` message (tools mode answers a call with the same
    text). Raises nothing."""
    role, content = _role_and_content(message)
    return role in ("user", "tool") and isinstance(content, str) and content.startswith(_INTERPRETER_MARK)


def interpreter_output(content: str) -> str:
    """The cell output an interpreter message carries: its content without ``INTERPRETER_PREFIX`` (and without
    the prefix's newline when present). Content that is not an interpreter message is returned unchanged."""
    if not content.startswith(_INTERPRETER_MARK):
        return content
    return content.removeprefix(_INTERPRETER_MARK).removeprefix("\n")
