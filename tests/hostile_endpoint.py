"""A misbehaving OpenAI-compatible endpoint for the abuse suite (``tests/test_abuse.py``), standard library only,
so it runs in the application image on the stack's model network (``python3 hostile_endpoint.py --port 8000``).

The ``model`` of a request picks the misbehaviour:

    huge        a 200 whose body runs on for 256 MiB
    drip        a 200 whose body comes a byte a second, for ever
    nested      valid JSON nested 100,000 deep
    badtool     a tool call whose ``function`` is text, then a tool call whose arguments nest deep, then an answer
    code        a conversation whose cells are hostile code (``HOSTILE_CELLS``, one per turn), then an answer
    badjudge    a judge's answer of 4 MiB of unclosed ``<think>`` blocks and no verdict

``GET /v1/models`` lists them all. Nothing here connects anywhere; it only answers.
"""

import argparse
import contextlib
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODELS = ("huge", "drip", "nested", "badtool", "code", "badjudge")

HOSTILE_CELLS = {
    "flood": (
        "import os, sys\n"
        "print(('x' * 1023 + '\\n') * 40_000)  # 40 MiB through the kernel's output\n"
        "try:\n"
        "    fd = os.open('/proc/1/fd/1', os.O_WRONLY)  # the container's own stdout: its engine log\n"
        "    for _ in range(1_600):\n"
        "        os.write(fd, b'y' * 65_536)\n"
        "except OSError as exc:\n"
        "    print('container stdout:', exc)\n"
    ),
    "files": (
        "import os\n"
        "os.makedirs('output/many', exist_ok=True)\n"
        "with open('output/sparse.bin', 'wb') as f:\n"
        "    f.truncate(100 * 2**30)  # 100 GiB of nothing\n"
        "for i in range(3_000):\n"
        "    with open(f'output/many/{i}.txt', 'w') as f:\n"
        "        f.write('x')\n"
        "print('wrote the files')\n"
    ),
    "sockets": (
        "import socket, struct\n"
        "peers = set()\n"
        "for line in open('/proc/net/route').read().splitlines()[1:]:\n"
        "    fields = line.split()\n"
        "    for value in (fields[1], fields[2]):\n"
        "        address = socket.inet_ntoa(struct.pack('<I', int(value, 16)))\n"
        "        if address != '0.0.0.0':\n"
        "            peers.add(address)\n"
        "for peer in sorted(peers):\n"
        "    for port in (9100, 6379, 8000, 8080, 22, 2375):\n"
        "        try:\n"
        "            socket.create_connection((peer, port), timeout=2).close()\n"
        "            print('PROBE', peer, port, 'connected')\n"
        "        except OSError as exc:\n"
        "            print('PROBE', peer, port, 'refused', type(exc).__name__)\n"
    ),
    "messages": (
        "kernel = get_ipython().kernel\n"
        "parent = kernel.get_parent()\n"
        "for msg_type, content in [\n"
        "    ('display_data', {'data': 'text, not an object'}),\n"
        "    ('execute_result', {'data': {'text/plain': 7, 'image/png': ['x']}}),\n"
        "    ('stream', {'name': ['stdout'], 'text': {'not': 'text'}}),\n"
        "    ('error', {'ename': None, 'traceback': 'not a list'}),\n"
        "    ('display_data', 'content that is not an object'),\n"
        "]:\n"
        "    kernel.session.send(kernel.iopub_socket, msg_type, content, parent=parent)\n"
        "print('sent the odd messages')\n"
    ),
}


def _completion(message: dict[str, Any], finish_reason: str = "stop") -> bytes:
    body = {
        "id": "hostile",
        "object": "chat.completion",
        "model": "hostile",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }
    return json.dumps(body).encode()


def _answer(text: str) -> bytes:
    return _completion({"role": "assistant", "content": text})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _send(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        if self.path.rstrip("/").endswith("/models"):
            self._send(json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in MODELS]}).encode())
        elif self.path == "/health":
            self._send(b'{"status": "ok"}')
        else:
            self._send(b'{"error": "not found"}', 404)

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        model = request.get("model", "")
        turns = sum(1 for m in request.get("messages", []) if m.get("role") in ("assistant",))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up, as it should
            getattr(self, f"_{model}", self._unknown)(turns)

    def _unknown(self, turns: int) -> None:
        self._send(b'{"error": {"message": "unknown model"}}', 404)

    def _huge(self, turns: int) -> None:
        total = 256 * 2**20
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(total))
        self.end_headers()
        head = b'{"choices": [{"message": {"role": "assistant", "content": "'
        self.wfile.write(head)
        chunk = b"a" * 2**20
        for _ in range(total // len(chunk)):
            self.wfile.write(chunk)

    def _drip(self, turns: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for _ in range(3600):
            self.wfile.write(b"1\r\n \r\n")
            self.wfile.flush()
            time.sleep(1)

    def _nested(self, turns: int) -> None:
        self._send(b"[" * 100_000 + b"]" * 100_000)

    def _badtool(self, turns: int) -> None:
        if turns == 0:
            call = {"id": "t1", "type": "function", "function": "print(1)"}
        elif turns == 1:
            deep = "[" * 50_000 + "]" * 50_000
            call = {"id": "t2", "type": "function", "function": {"name": "execute_python", "arguments": deep}}
        else:
            self._send(_answer("Finished: nothing to do"))
            return
        self._send(_completion({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"))

    def _code(self, turns: int) -> None:
        cells = list(HOSTILE_CELLS.values())
        if turns < len(cells):
            self._send(_answer(f"Running a cell.\n```python\n{cells[turns]}```"))
        else:
            self._send(_answer("Finished: done"))

    def _badjudge(self, turns: int) -> None:
        self._send(_answer("<think>" * (4 * 2**20 // 7)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
