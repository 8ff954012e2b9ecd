"""Code extraction from a model reply, as PyBench does it.

The first ```` ```python ```` fenced block of the reply is the cell; in replies that use the served-model
prompt it sits between ``<|execute_start|>`` and ``<|execute_end|>``, and the markers are accepted with or
without a fence inside. A reply without code ends the session.
"""

import re
from dataclasses import dataclass

EXECUTE_START = "<|execute_start|>"
EXECUTE_END = "<|execute_end|>"

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)[ \t]*\r?\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_MARKED = re.compile(re.escape(EXECUTE_START) + r"(.*?)(?:" + re.escape(EXECUTE_END) + r"|\Z)", re.DOTALL)
_BARE_FENCE = re.compile(r"^\s*```[a-zA-Z0-9]*[ \t]*\r?\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclass(frozen=True)
class Cell:
    """The code of a reply's first cell and where its block (markers and fence included) sits in the reply."""

    code: str
    start: int
    end: int


def find_cell(reply: str) -> Cell | None:
    """Return the first cell of a reply, or None when the reply holds no code.

    Looks first between execute markers (a fence inside them is unwrapped), then for a python fence.
    Blank code counts as no code. Raises nothing.
    """
    marked = _MARKED.search(reply)
    if marked is not None:
        inner = marked.group(1)
        fenced = _FENCE.search(inner) or _BARE_FENCE.search(inner)
        code, span = (fenced.group(1) if fenced is not None else inner), marked.span()
    else:
        fenced = _FENCE.search(reply)
        if fenced is None:
            return None
        code, span = fenced.group(1), fenced.span()
    code = code.strip("\n")
    return Cell(code, *span) if code.strip() else None


def extract_code(reply: str) -> str | None:
    """Return the code of the first cell in a reply (``find_cell``), or None when the reply holds no code."""
    cell = find_cell(reply)
    return cell.code if cell is not None else None
