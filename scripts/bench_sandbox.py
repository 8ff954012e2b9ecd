"""Benchmark the docker sandbox, in one run on this machine:

- cold start: a sandbox started (container up, kernel gateway answering, kernel started, first cell run),
  beside a bare ``docker run --rm <image> true`` of the same image (the engine's own floor);
- warm hand-out: ``WarmPool.take`` when the pool's sandbox is ready (checked alive, kernel answering);
- the round trip of a trivial cell through the kernel gateway's websocket (with the per-cell telemetry probe),
  beside the same cell through a local kernel driven by nbclient (as PyBench's harness runs), measured in
  alternating rounds so both see the same machine.

Prints a table, then one JSON line of figures (the last line), so runs can be compared.

Usage: python scripts/bench_sandbox.py [--starts 5] [--handouts 5] [--cells 600] [--rounds 6]
"""

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.pool import POOL_EVALUATION, WarmPool, start_sandbox  # noqa: E402
from services.sandbox.base import SandboxSpec  # noqa: E402
from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE  # noqa: E402
from services.sandbox.docker import DockerSandboxBackend  # noqa: E402

BENCH_NETWORK = "pbe-bench-sandboxes"
BENCH_EVALUATION = "bench"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed_ms(run: Callable[[], object], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        began = time.perf_counter()
        run()
        samples.append((time.perf_counter() - began) * 1000)
    return samples


def cold_starts_s(backend: DockerSandboxBackend, image: str, count: int) -> list[float]:
    starts = []
    for attempt in range(count):
        began = time.perf_counter()
        sandbox = start_sandbox(backend, SandboxSpec(BENCH_EVALUATION, 0, attempt + 1, image=image))
        sandbox.kernel.execute("pass", timeout_s=60)
        starts.append(time.perf_counter() - began)
        sandbox.kernel.close()
        backend.stop(sandbox.handle)
    return starts


def bare_docker_runs_s(image: str, count: int) -> list[float]:
    runs = []
    for _ in range(count):
        began = time.perf_counter()
        subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "--entrypoint", "true", image],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        runs.append(time.perf_counter() - began)
    return runs


def warm_handouts_ms(backend: DockerSandboxBackend, image: str, count: int) -> list[float]:
    pool = WarmPool(backend, SandboxSpec(BENCH_EVALUATION, 0, 0, image=image))
    handouts = []
    try:
        for attempt in range(count):
            if not pool.wait_ready(120):
                raise RuntimeError(f"the warm pool did not get a sandbox ready: {pool.last_error}")
            began = time.perf_counter()
            sandbox = pool.take(SandboxSpec(BENCH_EVALUATION, 1, attempt + 1, image=image))
            handouts.append((time.perf_counter() - began) * 1000)
            assert sandbox.warm, "the pool started a sandbox on demand"
            sandbox.kernel.close()
            backend.stop(sandbox.handle)
    finally:
        pool.close()
    return handouts


@contextlib.contextmanager
def nbclient_cell() -> Iterator[Callable[[], object]]:
    """The same trivial cell through a local ipykernel driven by nbclient (no container, no gateway)."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook()
    notebook.cells.append(nbformat.v4.new_code_cell("1"))
    client = NotebookClient(notebook, timeout=10, kernel_name="python3")
    with client.setup_kernel():
        cell = notebook.cells[0]
        client.execute_cell(cell, 0)
        yield lambda: client.execute_cell(cell, 0)


def cell_rtts_ms(backend: DockerSandboxBackend, image: str, cells: int, rounds: int) -> tuple[list[float], list[float]]:
    """Round trips of a trivial cell through a sandbox and through nbclient, measured in alternating rounds so
    both see the same machine."""
    sandbox = start_sandbox(backend, SandboxSpec(BENCH_EVALUATION, 2, 1, image=image))
    ours: list[float] = []
    theirs: list[float] = []
    try:
        with nbclient_cell() as baseline:
            sandbox.kernel.execute("1", timeout_s=10)
            time.sleep(1.0)  # let the engine settle after the sandboxes removed just before
            for _ in range(rounds):
                ours += timed_ms(lambda: sandbox.kernel.execute("1", timeout_s=10), cells // rounds)
                theirs += timed_ms(baseline, cells // rounds)
    finally:
        sandbox.kernel.close()
        backend.stop(sandbox.handle)
    return ours, theirs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--handouts", type=int, default=5)
    parser.add_argument("--cells", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--image", default=DEFAULT_SANDBOX_IMAGE)
    args = parser.parse_args()
    backend = DockerSandboxBackend(network=BENCH_NETWORK)
    try:
        bare = bare_docker_runs_s(args.image, args.starts)
        starts = cold_starts_s(backend, args.image, args.starts)
        handouts = warm_handouts_ms(backend, args.image, args.handouts)
        rtts, baseline = cell_rtts_ms(backend, args.image, args.cells, args.rounds)
    finally:
        backend.reap(evaluation_id=BENCH_EVALUATION)
        backend.reap(evaluation_id=POOL_EVALUATION)
    figures = {
        "cold_start_p50_s": round(statistics.median(starts), 3),
        "cold_start_max_s": round(max(starts), 3),
        "bare_docker_run_p50_s": round(statistics.median(bare), 3),
        "warm_handout_p50_ms": round(statistics.median(handouts), 2),
        "warm_handout_max_ms": round(max(handouts), 2),
        "cell_rtt_p50_ms": round(statistics.median(rtts), 2),
        "cell_rtt_p95_ms": round(percentile(rtts, 0.95), 2),
        "cell_rtt_p99_ms": round(percentile(rtts, 0.99), 2),
        "nbclient_rtt_p50_ms": round(statistics.median(baseline), 2),
        "nbclient_rtt_p99_ms": round(percentile(baseline, 0.99), 2),
        "cell_rtt_ratio_to_nbclient": round(statistics.median(rtts) / statistics.median(baseline), 3),
        "starts": len(starts),
        "handouts": len(handouts),
        "cells": len(rtts),
    }
    rows = [
        ("cold start (container, gateway, kernel, first cell), p50", f"{figures['cold_start_p50_s']} s"),
        ("bare `docker run --rm <image> true`, p50", f"{figures['bare_docker_run_p50_s']} s"),
        ("warm hand-out (pool ready, checked alive), p50", f"{figures['warm_handout_p50_ms']} ms"),
        ("trivial cell round trip via kernel gateway, p50", f"{figures['cell_rtt_p50_ms']} ms"),
        ("  p95 / p99", f"{figures['cell_rtt_p95_ms']} / {figures['cell_rtt_p99_ms']} ms"),
        ("same cell via local nbclient kernel, p50", f"{figures['nbclient_rtt_p50_ms']} ms"),
        ("ratio sandbox / nbclient (p50)", f"{figures['cell_rtt_ratio_to_nbclient']}"),
    ]
    for label, value in rows:
        print(f"{label:<58} {value}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
