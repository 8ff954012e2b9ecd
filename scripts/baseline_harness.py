"""The baseline of ``make bench-throughput``: PyBench's way of running a suite, without isolation.

Runs a plan (JSON, made by ``scripts/bench_throughput.py``) the way the benchmark's own harness does: a Jupyter
kernel per task started in-process with jupyter_client (what nbclient drives), 16 tasks at once in threads, one
temporary folder per task with its inputs in ``./data``, the recorded code cells run one after another, and a
model that takes ``--latency`` seconds before each reply. Nothing is isolated: run it only in a throwaway
virtual environment and a network namespace of its own (the benchmark does both) with a per-cell time limit.

It needs only the standard library and jupyter_client (it runs in that virtual environment, not the project's),
and prints one JSON line: wall time, tasks run, cells run and timed out.

Usage: python baseline_harness.py PLAN.json --threads 16 --latency 0 --cell-timeout 120
"""

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def run_task(task: dict[str, Any], latency_s: float, cell_timeout_s: float, root: Path) -> dict[str, int]:
    """Run one task's recorded cells in a kernel of its own, in a folder of its own; returns cell counts."""
    from jupyter_client.manager import KernelManager

    folder = Path(tempfile.mkdtemp(prefix=f"task-{task['index']}-", dir=root))
    (folder / "output").mkdir()
    for source, dest in task["inputs"]:
        target = folder / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    counts = {"cells": 0, "timed_out": 0}
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(folder))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        for code in task["cells"]:
            time.sleep(latency_s)  # the model's reply that held this cell
            counts["cells"] += 1
            try:
                client.execute_interactive(code, timeout=cell_timeout_s, output_hook=lambda _msg: None)
            except TimeoutError:
                counts["timed_out"] += 1
                manager.interrupt_kernel()
        for _ in range(task["replies"] - len(task["cells"])):
            time.sleep(latency_s)  # replies without code (the last one ends the session)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
        shutil.rmtree(folder, ignore_errors=True)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--cell-timeout", type=float, default=120.0)
    args = parser.parse_args()
    tasks = json.loads(args.plan.read_text())
    root = Path(tempfile.mkdtemp(prefix="pbe-baseline-"))
    lock = threading.Lock()
    totals = {"tasks": 0, "cells": 0, "timed_out": 0, "failed": 0}

    def one(task: dict[str, Any]) -> None:
        try:
            counts = run_task(task, args.latency, args.cell_timeout, root)
        except Exception as exc:  # a broken kernel counts, it does not stop the run
            print(f"task {task['index']}: {type(exc).__name__}: {exc}", file=sys.stderr)
            with lock:
                totals["failed"] += 1
            return
        with lock:
            totals["tasks"] += 1
            totals["cells"] += counts["cells"]
            totals["timed_out"] += counts["timed_out"]

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        list(pool.map(one, tasks))
    wall = time.monotonic() - started
    shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"wall_s": round(wall, 2), **totals}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
