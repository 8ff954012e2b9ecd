"""``make bench-lifecycle``: where a task session's time and CPU go outside its cells, phase by phase.

Runs ``--sessions`` task sessions one after another through the docker backend, as an executor does (start the
sandbox, start and warm its kernel, copy the task's inputs, one trivial cell, collect ``./output``, stop), then
one grading sandbox per session (``services.sandbox.grading_docker.run_file_checks`` with a check that opens a produced
CSV), and an idle sandbox for ``--idle-s`` seconds. For each phase it records the wall time and the CPU the
whole machine used meanwhile (``/proc/stat``: the engine, containerd, runc, fuse-overlayfs, the containers and
this process alike), so run it on an otherwise idle machine. The wait for the kernel gateway inside
``DockerSandboxBackend.start`` is timed by wrapping it.

Prints a table (median per phase), then one JSON line whose ``session_cpu_s`` is the CPU one session costs
outside its cells and ``grading_cpu_s`` that of one grading sandbox.

Usage: python scripts/bench_lifecycle.py [--sessions 8] [--idle-s 10] [--image pybench-eval/sandbox:latest]
"""

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.kernel import KernelClient  # noqa: E402
from executor.pool import WarmSandbox, discard, prewarm_code, start_sandbox  # noqa: E402
from grader.file_checks import checker_sources  # noqa: E402
from services.sandbox.base import SandboxSpec  # noqa: E402
from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE, WORKSPACE  # noqa: E402
from services.sandbox.docker import DockerSandboxBackend  # noqa: E402
from services.sandbox.grading_docker import run_file_checks  # noqa: E402

BENCH_NETWORK = "pbe-bench-sandboxes"
BENCH_EVALUATION = "bench-lifecycle"
INPUT_BYTES = 200_000
"""The size of the input file each session gets (PyBench's inputs are mostly CSV and Excel files of this order)."""


def machine_cpu_s() -> float:
    """CPU seconds every core of the machine has spent busy since boot (user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(value) for value in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class Phases:
    """Wall time and machine CPU per named phase, summed within one session and kept per session."""

    def __init__(self) -> None:
        self.sessions: list[dict[str, tuple[float, float]]] = []
        self._current: dict[str, tuple[float, float]] = defaultdict(lambda: (0.0, 0.0))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._current[name] = self._current[name]  # listed in the order phases begin, a sub-phase after its own
        wall, cpu = time.perf_counter(), machine_cpu_s()
        try:
            yield
        finally:
            spent_wall, spent_cpu = self._current[name]
            self._current[name] = (spent_wall + time.perf_counter() - wall, spent_cpu + machine_cpu_s() - cpu)

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        """Time every call of ``owner.attribute`` as the phase ``name``."""
        original: Callable[..., Any] = getattr(owner, attribute)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)

    def discard(self) -> None:
        """Forget the session under way."""
        self._current = defaultdict(lambda: (0.0, 0.0))

    def end_session(self) -> None:
        self.sessions.append(dict(self._current))
        self._current = defaultdict(lambda: (0.0, 0.0))

    def medians(self) -> dict[str, tuple[float, float]]:
        names = list(dict.fromkeys(name for session in self.sessions for name in session))
        return {
            name: (
                statistics.median(session.get(name, (0.0, 0.0))[0] for session in self.sessions),
                statistics.median(session.get(name, (0.0, 0.0))[1] for session in self.sessions),
            )
            for name in names
        }


def run_session(backend: DockerSandboxBackend, image: str, attempt: int, phases: Phases) -> dict[str, bytes]:
    spec = SandboxSpec(BENCH_EVALUATION, 1, attempt, image=image)
    with phases.phase("sandbox start (total)"):
        handle = backend.start(spec)
    kernel = KernelClient(handle.url, handle.token, probe_scope=backend.telemetry_scope)
    try:
        with phases.phase("kernel start + probe"):
            kernel.start()
        with phases.phase("warm imports"):
            kernel.run_silent(prewarm_code(), timeout_s=120)
        with phases.phase("input copy"):
            backend.put_file(handle, f"{WORKSPACE}/data/input.csv", b"a,b\n" + b"1,2\n" * (INPUT_BYTES // 4))
        with phases.phase("one cell (pandas read + CSV write)"):
            kernel.execute(
                "import pandas as pd\npd.read_csv('./data/input.csv').head(5).to_csv('./output/1.csv')",
                timeout_s=60,
            )
        with phases.phase("output collection"):
            tree = backend.get_tree(handle, f"{WORKSPACE}/output")
    finally:
        with phases.phase("teardown"):
            discard(backend, WarmSandbox(handle, kernel, warm=False))
    return tree.files


def idle_cpu_per_s(backend: DockerSandboxBackend, image: str, seconds: float) -> float:
    """Machine CPU per second while one started sandbox (kernel started, probe installed) waits on nothing."""
    sandbox = start_sandbox(backend, SandboxSpec(BENCH_EVALUATION, 2, 1, image=image))
    try:
        sandbox.kernel.execute("1", timeout_s=60)
        time.sleep(1.0)
        quiet = machine_cpu_s()
        time.sleep(seconds)
        with_sandbox = (machine_cpu_s() - quiet) / seconds
    finally:
        discard(backend, sandbox)
    time.sleep(1.0)
    quiet = machine_cpu_s()
    time.sleep(seconds)
    without = (machine_cpu_s() - quiet) / seconds
    return max(0.0, with_sandbox - without)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--image", default=DEFAULT_SANDBOX_IMAGE)
    parser.add_argument(
        "--runtime-volume", choices=["auto", "on", "off"], default="auto", help="PBE_SANDBOX_RUNTIME_VOLUME's choice"
    )
    args = parser.parse_args()
    backend = DockerSandboxBackend(network=BENCH_NETWORK, runtime_volume=args.runtime_volume)
    phases = Phases()
    phases.wrap(backend, "_wait_ready", "  of which: until the kernel gateway answers")
    try:
        run_session(backend, args.image, 0, phases)  # the engine's and the page cache's first time: not counted
        phases.discard()
        for attempt in range(1, args.sessions + 1):
            files = run_session(backend, args.image, attempt, phases)
            with phases.phase("grading sandbox"):
                results = run_file_checks(
                    [{"kind": "csv_no_nulls", "path": "./output/1.csv"}],
                    {f"output/{name}": data for name, data in files.items()},
                    checker=checker_sources(),
                    image=args.image,
                    runtime_volume=args.runtime_volume,
                )
            if not results or results[0].passed is None:
                raise SystemExit(f"the grading sandbox did not grade: {results}")
            phases.end_session()
        idle = idle_cpu_per_s(backend, args.image, args.idle_s)
    finally:
        backend.reap(evaluation_id=BENCH_EVALUATION)
    medians = phases.medians()
    print(f"{'phase (median of ' + str(args.sessions) + ' sessions)':<48}{'wall s':>9}{'machine CPU s':>15}")
    for name, (wall, cpu) in medians.items():
        print(f"{name:<48}{wall:>9.3f}{cpu:>15.3f}")
    outside_cells = [
        sum(cpu for name, (_, cpu) in session.items() if not name.startswith("  ") and "cell" not in name
            and name != "grading sandbox")
        for session in phases.sessions
    ]  # fmt: skip
    figures = {
        "bench": "lifecycle",
        "sessions": args.sessions,
        "runtime_volume": backend.runtime.enabled(),
        "session_cpu_s": round(statistics.median(outside_cells), 3),
        "grading_cpu_s": round(medians["grading sandbox"][1], 3),
        "start_cpu_s": round(medians["sandbox start (total)"][1], 3),
        "start_wall_s": round(medians["sandbox start (total)"][0], 3),
        "kernel_cpu_s": round(medians["kernel start + probe"][1], 3),
        "warm_imports_cpu_s": round(medians["warm imports"][1], 3),
        "teardown_cpu_s": round(medians["teardown"][1], 3),
        "idle_sandbox_cpu_per_s": round(idle, 4),
        "phases": {name: {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3)} for name, (wall, cpu) in medians.items()},
    }
    print(f"{'one session outside its cells (CPU)':<48}{'':>9}{figures['session_cpu_s']:>15.3f}")
    print(f"{'an idle started sandbox, CPU per second':<48}{'':>9}{figures['idle_sandbox_cpu_per_s']:>15.4f}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
