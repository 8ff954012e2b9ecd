"""The kernel websocket's binary v1 frames: what the client encodes, the server's layout decodes, and back."""

import json

import pytest

from executor.wire import decode_v1, encode_v1


def _server_layout(channel: str, parts: list[bytes]) -> bytes:
    """A frame laid out as Jupyter Server's serialize_msg_to_ws_v1 documents it, written out independently."""
    offsets = [8 * (len(parts) + 3)]
    offsets.append(offsets[-1] + len(channel.encode()))
    for part in parts:
        offsets.append(offsets[-1] + len(part))
    return (
        len(offsets).to_bytes(8, "little")
        + b"".join(o.to_bytes(8, "little") for o in offsets)
        + channel.encode()
        + b"".join(parts)
    )


def test_a_frame_round_trips_and_matches_the_servers_layout() -> None:
    message = {
        "header": {"msg_id": "a1", "msg_type": "execute_request"},
        "parent_header": {},
        "metadata": {"k": "é"},
        "content": {"code": "print('ü')"},
        "channel": "shell",
    }
    frame = encode_v1(message)
    parts = [json.dumps(message[name]).encode() for name in ("header", "parent_header", "metadata", "content")]
    assert frame == _server_layout("shell", parts)
    decoded = decode_v1(frame)
    assert decoded["msg_type"] == "execute_request" and decoded["content"] == message["content"]
    assert decoded["channel"] == "shell" and decoded["metadata"] == {"k": "é"}


def test_binary_buffers_after_the_content_are_dropped() -> None:
    parts = [b'{"msg_type": "display_data"}', b"{}", b"{}", b'{"data": {}}', b"\x00\x01raw"]
    decoded = decode_v1(_server_layout("iopub", parts))
    assert decoded["msg_type"] == "display_data" and decoded["channel"] == "iopub"


@pytest.mark.parametrize("frame", [b"", b"\x01", (3).to_bytes(8, "little") + b"\x00" * 24, b"\xff" * 64])
def test_a_malformed_frame_is_a_value_error(frame: bytes) -> None:
    with pytest.raises(ValueError):
        decode_v1(frame)


def test_a_part_that_is_not_json_is_empty_and_the_message_stays_readable() -> None:
    """The kernel's session sends a content given as text as it is (the model's code can make it)."""
    parts = [b'{"msg_type": "display_data"}', b"{}", b"{}", b"content that is not an object"]
    decoded = decode_v1(_server_layout("iopub", parts))
    assert decoded["msg_type"] == "display_data" and decoded["content"] == {}
    nested = decode_v1(_server_layout("iopub", [b"[" * 100_000, b"{}", b"{}", b"{}"]))
    assert nested["msg_type"] == "" and nested["header"] == {}
