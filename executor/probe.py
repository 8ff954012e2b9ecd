"""Per-cell telemetry measured inside the sandbox: CPU seconds and peak memory while a cell ran.

The executor installs a small probe in the kernel when it starts (``setup_code``): a module ``_pbe_probe`` in
``sys.modules`` with a sampler thread that reads the sandbox's memory every few milliseconds. After each cell
the executor sends a silent request whose ``user_expressions`` call ``snapshot()``: cumulative CPU seconds,
and the peak memory since the previous snapshot (then the peak starts over).

Two scopes, chosen by the backend:

- ``cgroup``: the whole sandbox (its container's cgroup, v1 or v2): every process the cell started counts.
  The kernel's cgroup high-water mark (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``) catches spikes
  shorter than the sampling period whenever it rose during the cell.
- ``process``: the kernel process and its waited-for children (``getrusage``, ``/proc/self/statm``), for a
  backend with no cgroup of its own (``local``).

The probe's figures are informational: code in the kernel can tamper with them, never with the sandbox's limits.
"""

import ast
import json
from dataclasses import dataclass
from typing import Any

PROBE_MODULE = "_pbe_probe"
"""Name of the probe's module in the kernel's ``sys.modules``."""

SAMPLE_PERIOD_S = 0.02
"""How often the sampler thread reads the sandbox's memory."""

_PROBE_SOURCE = r"""
import json, os, resource, sys, threading, types

_FDS = {}

def _read_int(path):
    # Files stay open and are re-read with pread: a snapshot then costs a few system calls, not open/close.
    try:
        fd = _FDS.get(path)
        if fd is None:
            fd = _FDS[path] = os.open(path, os.O_RDONLY)
        text = os.pread(fd, 64, 0).split()
        return int(text[0]) if text and text[0].isdigit() else None
    except OSError:
        return None

def _cpu_cgroup():
    usage = _read_int("/sys/fs/cgroup/cpuacct/cpuacct.usage") or _read_int("/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage")
    if usage is not None:
        return usage / 1e9
    try:
        with open("/sys/fs/cgroup/cpu.stat") as handle:
            for line in handle:
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
    except OSError:
        pass
    return None

def _cpu_process():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

def _mem_cgroup():
    value = _read_int("/sys/fs/cgroup/memory/memory.usage_in_bytes")
    return value if value is not None else _read_int("/sys/fs/cgroup/memory.current")

def _high_water_cgroup():
    value = _read_int("/sys/fs/cgroup/memory/memory.max_usage_in_bytes")
    return value if value is not None else _read_int("/sys/fs/cgroup/memory.peak")

_PAGE = os.sysconf("SC_PAGE_SIZE")

def _mem_process():
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None

class _Probe:
    def __init__(self, scope, period):
        cgroup = scope == "cgroup" and _mem_cgroup() is not None and _cpu_cgroup() is not None
        self.scope = "cgroup" if cgroup else "process"
        self._cpu = _cpu_cgroup if cgroup else _cpu_process
        self._mem = _mem_cgroup if cgroup else _mem_process
        self._high_water = _high_water_cgroup if cgroup else (lambda: None)
        self._period = period
        self._lock = threading.Lock()
        self._peak = self._mem() or 0
        self._last_high_water = self._high_water()
        thread = threading.Thread(target=self._sample, name="pbe-probe", daemon=True)
        thread.start()

    def _sample(self):
        import time
        while True:
            value = self._mem()
            if value is not None:
                with self._lock:
                    if value > self._peak:
                        self._peak = value
            time.sleep(self._period)

    def snapshot(self):
        current = self._mem() or 0
        high_water = self._high_water()
        with self._lock:
            peak = max(self._peak, current)
            if high_water is not None and self._last_high_water is not None and high_water > self._last_high_water:
                peak = max(peak, high_water)
            self._last_high_water = high_water
            self._peak = current
        return json.dumps({"cpu_s": self._cpu(), "peak_bytes": peak, "scope": self.scope})

if "%(module)s" not in sys.modules:
    _module = types.ModuleType("%(module)s")
    _module.probe = _Probe(%(scope)r, %(period)r)
    _module.snapshot = _module.probe.snapshot
    sys.modules["%(module)s"] = _module
"""


@dataclass(frozen=True)
class ProbeReading:
    """One snapshot of the probe: cumulative CPU seconds and the peak memory since the previous snapshot."""

    cpu_s: float | None
    peak_bytes: int
    scope: str


def setup_code(scope: str) -> str:
    """The code that installs the probe in a kernel (idempotent: a second run keeps the first probe).

    ``scope`` is ``cgroup`` (the whole sandbox) or ``process`` (the kernel process); ``cgroup`` falls back to
    ``process`` where no cgroup files are readable.
    """
    # Run in a globals dict of its own, so nothing but the module in sys.modules lands in the user's namespace.
    body = _PROBE_SOURCE % {"module": PROBE_MODULE, "scope": scope, "period": SAMPLE_PERIOD_S}
    return f"exec(compile({body!r}, '<pbe-probe>', 'exec'), {{'__name__': '{PROBE_MODULE}'}})"


SNAPSHOT_EXPRESSION = f"__import__('sys').modules['{PROBE_MODULE}'].snapshot()"
"""The user expression that reads (and resets) the probe."""


METADATA_KEY = "pbe_probe"
"""Where the sandbox image's kernel class (``services/sandbox/image/pbe_kernel.py``) puts the reading in each
``execute_reply``'s metadata."""


MAX_READING_CHARS = 4096
"""A probe's reading is a short JSON object; anything longer is not one (read no further)."""


def parse_reply(reply: dict[str, Any], key: str) -> tuple[ProbeReading | None, bool]:
    """Read the probe from an ``execute_reply`` message: from its metadata (the sandbox image's kernel), else
    from the user expression ``key``.

    Returns:
        The reading (``None`` when missing or malformed: the probe is gone, or the cell's code replaced it),
        and whether the kernel reports it in the metadata (so requests need no user expression).
    """
    metadata = reply.get("metadata") or {}
    if isinstance(metadata.get(METADATA_KEY), str):
        return _reading(metadata[METADATA_KEY]), True
    entry = (reply.get("content") or {}).get("user_expressions", {}).get(key)
    if not isinstance(entry, dict) or entry.get("status") != "ok":
        return None, False
    try:
        shown = entry["data"]["text/plain"]
        if not isinstance(shown, str) or len(shown) > MAX_READING_CHARS:  # the cell's code may have replaced it
            return None, False
        text = ast.literal_eval(shown)
    except (KeyError, ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return None, False
    return _reading(text), False


def _reading(text: Any) -> ProbeReading | None:
    if not isinstance(text, str) or len(text) > MAX_READING_CHARS:
        return None
    try:
        values = json.loads(text)
        cpu = values.get("cpu_s")
        return ProbeReading(
            cpu_s=float(cpu) if cpu is not None else None,
            peak_bytes=int(values["peak_bytes"]),
            scope=str(values.get("scope", "")),
        )
    except (KeyError, ValueError, TypeError, AttributeError, RecursionError):
        return None
