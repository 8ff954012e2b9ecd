"""Rendering a trajectory compactly for a judge prompt: no system prompt, no repeated query, each message and
the whole bounded (the middle is cut; the opening and the final answer are kept)."""

from collections.abc import Mapping, Sequence
from typing import Any

from services.pybench.rules import interpreter_output, is_interpreter_message

DEFAULT_MAX_TRAJECTORY_CHARS = 16_000
"""The rendered size of one trajectory in a prompt; the middle is cut, the opening and the final answer kept."""

DEFAULT_MAX_MESSAGE_CHARS = 3_000
"""The rendered size of one message (an assistant reply or a code-interpreter output) in a prompt."""


def shorten(text: str, limit: int, head_share: float = 0.5) -> str:
    """Return ``text`` cut to at most ``limit`` characters (for ``limit`` >= 40): its head and tail, with a mark.

    ``head_share`` is the part of the room given to the head; the tail gets the rest.
    """
    if len(text) <= limit:
        return text
    mark = "\n[... {} characters cut ...]\n"
    room = max(limit - len(mark.format(len(text))), 0)
    head = int(room * head_share)
    tail = room - head
    return text[:head] + mark.format(len(text) - head - tail) + (text[len(text) - tail :] if tail else "")


def _message_parts(message: Any) -> tuple[str, str]:
    """Return ``(role, content)`` of a ``{"role", "content"}`` mapping or an object with those attributes.

    Raises:
        TypeError: neither, or a role or content of the wrong type.
    """
    if isinstance(message, Mapping):
        role, content = message.get("role"), message.get("content")
    elif hasattr(message, "role") and hasattr(message, "content"):
        role, content = message.role, message.content
    else:
        raise TypeError(f"a message is a mapping with 'role' and 'content', not {type(message).__name__}")
    if not isinstance(role, str):
        raise TypeError(f"a message's role is a string, not {type(role).__name__}")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise TypeError(f"a message's content is a string or None, not {type(content).__name__}")
    return role, content


def render_trajectory(
    messages: Sequence[Any],
    *,
    query: str | None = None,
    max_chars: int = DEFAULT_MAX_TRAJECTORY_CHARS,
    max_message_chars: int = DEFAULT_MAX_MESSAGE_CHARS,
) -> str:
    """Render a trajectory's messages compactly for a judge prompt, in at most ``max_chars`` characters.

    System messages are left out, and so is the user message that equals ``query`` (the prompt shows it).
    Each assistant message and code-interpreter output is cut to ``max_message_chars``; when the whole is
    still too long its middle is cut, keeping a third of the room for the opening and the rest for the end,
    where the final answer is.

    Raises:
        TypeError: a message is not a ``{"role", "content"}`` mapping (or an object with those attributes).
        ValueError: a limit below 200 characters.
    """
    if max_chars < 200 or max_message_chars < 200:
        raise ValueError("max_chars and max_message_chars must be at least 200")
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise TypeError(f"messages is a sequence of messages, not {type(messages).__name__}")
    wanted_query = query.strip() if query is not None else None
    blocks: list[str] = []
    turn = 0
    for message in messages:
        role, content = _message_parts(message)
        if role == "system":
            continue
        if role == "assistant":
            turn += 1
            title = f"### Assistant (turn {turn})"
        elif role == "user" and is_interpreter_message({"role": role, "content": content}):
            title = "### Code interpreter output"
            content = interpreter_output(content)
        elif role == "user":
            if wanted_query is not None and content.strip() == wanted_query:
                continue
            title = "### User"
        else:
            title = f"### {role.capitalize()}"
        blocks.append(f"{title}\n{shorten(content.strip(), max_message_chars)}")
    if not blocks:
        return "(no messages: the agent produced no trajectory)"
    return shorten("\n\n".join(blocks), max_chars, head_share=1 / 3)
