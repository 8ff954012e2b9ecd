"""Benchmark the docker sandbox: cold start (container up, kernel gateway answering) and the round trip of a
trivial cell through the kernel gateway's websocket. Prints a table, then one JSON line of figures.

Usage: python scripts/bench_sandbox.py [--starts 5] [--cells 300]
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.kernel import KernelClient  # noqa: E402
from executor.sandboxes.base import SandboxSpec  # noqa: E402
from executor.sandboxes.docker import DockerSandboxBackend  # noqa: E402
from executor.settings import DEFAULT_SANDBOX_IMAGE  # noqa: E402

BENCH_NETWORK = "pbe-bench-sandboxes"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--cells", type=int, default=300)
    parser.add_argument("--image", default=DEFAULT_SANDBOX_IMAGE)
    args = parser.parse_args()
    backend = DockerSandboxBackend(network=BENCH_NETWORK)
    starts: list[float] = []
    rtts: list[float] = []
    try:
        for attempt in range(args.starts):
            began = time.perf_counter()
            handle = backend.start(SandboxSpec("bench", 0, attempt + 1, image=args.image))
            kernel = KernelClient(handle.url, handle.token)
            kernel.start()
            kernel.execute("pass", timeout_s=60)
            starts.append(time.perf_counter() - began)
            if attempt == 0:
                for _ in range(args.cells):
                    t0 = time.perf_counter()
                    kernel.execute("1", timeout_s=10)
                    rtts.append((time.perf_counter() - t0) * 1000)
            kernel.close()
            backend.stop(handle)
    finally:
        backend.reap(evaluation_id="bench")
    figures = {
        "cold_start_p50_s": round(statistics.median(starts), 3),
        "cold_start_max_s": round(max(starts), 3),
        "cell_rtt_p50_ms": round(statistics.median(rtts), 2),
        "cell_rtt_p95_ms": round(percentile(rtts, 0.95), 2),
        "cell_rtt_p99_ms": round(percentile(rtts, 0.99), 2),
        "starts": len(starts),
        "cells": len(rtts),
    }
    print(f"cold start (container, gateway, kernel, first cell): p50 {figures['cold_start_p50_s']} s")
    print(
        f"trivial cell round trip: p50 {figures['cell_rtt_p50_ms']} ms, p95 {figures['cell_rtt_p95_ms']} ms, "
        f"p99 {figures['cell_rtt_p99_ms']} ms over {len(rtts)} cells"
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
