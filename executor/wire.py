"""The kernel websocket's wire formats: Jupyter Server's binary ``v1.kernel.websocket.jupyter.org`` protocol,
and the legacy JSON text frames as a fallback.

With ``v1`` the server forwards the kernel's ZMQ frames as they are (no deserializing, re-signing checks or
JSON re-encoding on its side), which saves about a millisecond per cell. A frame is: the number of offsets
(uint64, little-endian), the offsets, then the channel name, header, parent header, metadata, content and
any binary buffers, each part ending where the next offset starts.
"""

import json
from typing import Any

V1_SUBPROTOCOL = "v1.kernel.websocket.jupyter.org"

_PARTS = ("header", "parent_header", "metadata", "content")


def encode_v1(message: dict[str, Any]) -> bytes:
    """Encode a message dict (``header``, ``parent_header``, ``metadata``, ``content``, ``channel``) as a frame."""
    parts = [json.dumps(message[name]).encode() for name in _PARTS]
    channel = str(message.get("channel", "shell")).encode()
    offsets = [8 * (1 + 1 + len(parts) + 1)]
    offsets.append(offsets[-1] + len(channel))
    for part in parts:
        offsets.append(offsets[-1] + len(part))
    head = len(offsets).to_bytes(8, "little") + b"".join(offset.to_bytes(8, "little") for offset in offsets)
    return head + channel + b"".join(parts)


def decode_v1(frame: bytes) -> dict[str, Any]:
    """Decode a frame into a message dict with ``msg_type`` and ``channel`` set; binary buffers are dropped.

    Raises:
        ValueError: the frame is not a v1 message (too short, offsets out of order).
    """
    if len(frame) < 8:
        raise ValueError("a v1 frame is at least 8 bytes")
    count = int.from_bytes(frame[:8], "little")
    if count < 2 + len(_PARTS) or 8 * (count + 1) > len(frame):
        raise ValueError(f"a v1 frame with {count} offsets cannot hold a message")
    offsets = [int.from_bytes(frame[8 * (i + 1) : 8 * (i + 2)], "little") for i in range(count)]
    if offsets != sorted(offsets) or offsets[-1] > len(frame):
        raise ValueError("a v1 frame's offsets are out of order")
    message: dict[str, Any] = {"channel": frame[offsets[0] : offsets[1]].decode(errors="replace")}
    for index, name in enumerate(_PARTS, start=1):
        message[name] = _part(frame[offsets[index] : offsets[index + 1]])
    header = message["header"]
    message["msg_type"] = header.get("msg_type", "") if isinstance(header, dict) else ""
    return message


def _part(data: bytes) -> Any:
    """One JSON part of a frame; a part that is not JSON is empty (the kernel's session sends a content given as
    text as it is, and the model's code can make it do so): the message stays readable, its content dropped."""
    try:
        return json.loads(data or b"{}")
    except (ValueError, RecursionError):
        return {}
