"""What one code cell produced, collected from the kernel's iopub messages in order."""

import re
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_OUTPUT_CHARS = 1_000_000
"""Text kept per cell; the rest of an output flood is dropped and counted, so a flood cannot exhaust memory."""

DEFAULT_MAX_IMAGE_CHARS = 4_000_000
"""Base64 image data kept per cell (a few charts); further images are dropped and counted."""

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """Remove terminal colour codes (tracebacks and some libraries print them)."""
    return _ANSI.sub("", text)


@dataclass
class OutputItem:
    kind: str
    """``stream``, ``result``, ``display`` or ``error``."""
    text: str = ""
    name: str = ""
    """The stream name (stdout, stderr) or the error name."""
    images: list[str] = field(default_factory=list)
    """Base64 PNG images of a display or result."""


@dataclass
class CellOutput:
    items: list[OutputItem] = field(default_factory=list)
    kept_chars: int = 0
    dropped_chars: int = 0
    max_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    image_chars: int = 0
    max_image_chars: int = DEFAULT_MAX_IMAGE_CHARS
    dropped_images: int = 0
    error: tuple[str, str] | None = None
    """The exception's name and message, when the cell raised."""

    def _keep(self, text: str) -> str:
        room = max(0, self.max_chars - self.kept_chars)
        if len(text) > room:
            self.dropped_chars += len(text) - room
            text = text[:room]
        self.kept_chars += len(text)
        return text

    def _fits(self, image: str) -> bool:
        """Whether an image fits in what is left of the budget (it is counted as kept or dropped)."""
        if len(image) > self.max_image_chars - self.image_chars:
            self.dropped_images += 1
            return False
        self.image_chars += len(image)
        return True

    def add(self, msg_type: str, content: dict[str, Any]) -> None:
        """Record one iopub message that belongs to the cell; other message types are ignored."""
        if msg_type == "stream":
            text = self._keep(str(content.get("text", "")))
            name = str(content.get("name", "stdout"))
            last = self.items[-1] if self.items else None
            if last is not None and last.kind == "stream" and last.name == name:
                last.text += text
            else:
                self.items.append(OutputItem("stream", text, name))
        elif msg_type in ("execute_result", "display_data"):
            data = content.get("data", {})
            png = data.get("image/png")
            images = [png] if isinstance(png, str) and self._fits(png) else []
            self.items.append(
                OutputItem(
                    "result" if msg_type == "execute_result" else "display",
                    self._keep(str(data.get("text/plain", ""))),
                    images=images,
                )
            )
        elif msg_type == "error":
            traceback = "\n".join(strip_ansi(line) for line in content.get("traceback", []))
            self.items.append(OutputItem("error", self._keep(traceback), str(content.get("ename", "Error"))))
            self.error = (str(content.get("ename", "Error")), strip_ansi(str(content.get("evalue", ""))))
        elif msg_type == "clear_output":
            self.items = [item for item in self.items if item.kind == "error"]

    @property
    def images(self) -> list[str]:
        return [image for item in self.items for image in item.images]
