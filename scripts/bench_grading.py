"""Benchmark grading: every task of the suite graded (checks only, the judge aside), as an evaluation's graders do.

Each task gets a session: its recorded trajectory from the suite's ``trajectory.jsonl`` (a stand-in answer
where none is recorded) and, for each file its query asks for, a file with that name whose content is the
task's first input (so the checks open real CSVs, images and audio). Sessions are graded under both
gradings with ``--workers`` graders in parallel (the compose stack runs two), the checks that open files in a
fresh grading sandbox each.

Prints a table, then one JSON line of figures (the last line).

Usage: python scripts/bench_grading.py [--suite ../shared/pybench] [--workers 2]
"""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader import session_files  # noqa: E402
from grader.checks import runs_in_process  # noqa: E402
from grader.file_checks import checker_sources  # noqa: E402
from grader.grading import grade  # noqa: E402
from grader.variants import Grading, checks_for  # noqa: E402
from services.pybench.recordings import read_recordings  # noqa: E402
from services.pybench.suite import Suite, load_suite  # noqa: E402
from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE  # noqa: E402
from services.sandbox.grading_docker import run_file_checks  # noqa: E402
from services.task import Task  # noqa: E402
from services.trajectory import EndReason, Message, Trajectory  # noqa: E402
from services.verdict import CheckResult, Verdict  # noqa: E402

TARGET_S = 30.0
"""The target: all 143 tasks of an evaluation graded (checks only) in at most this long."""


def recordings(suite: Suite) -> dict[int, list[Message]]:
    """The recorded messages of each task (the first line of a task wins); none without a ``trajectory.jsonl``."""
    path = suite.root / "trajectory.jsonl"
    found: dict[int, list[Message]] = {}
    if path.is_file():
        for recording in read_recordings(path):
            if recording.index is not None:
                found.setdefault(recording.index, [Message.model_validate(m) for m in recording.messages])
    return found


def query_outputs(suite: Suite) -> dict[int, list[str]]:
    """The output paths each task's query names (``checks.json``)."""
    path = suite.root / "checks.json"
    entries = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    return {int(entry["index"]): list(entry.get("query_output_paths") or []) for entry in entries}


def stage_outputs(task: Task, suite: Suite, outputs: list[str], folder: Path) -> list[str]:
    """Write a file for each output the query names, with the task's first present input as content."""
    source = next((suite.input_file(i.path) for i in task.inputs if i.present), None)
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for name in outputs:
        relative = name.removeprefix("./").removeprefix("output/").rstrip("/")
        if not relative:
            continue
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith("/"):
            target.mkdir(exist_ok=True)
            continue
        if source is not None and source.is_file():
            shutil.copyfile(source, target)
        else:
            target.write_bytes(b"produced")
        names.append("./output/" + relative)
    return names


def grade_task(
    task: Task, suite: Suite, messages: list[Message], outputs: list[str], folder: Path, image: str
) -> tuple[Verdict, float]:
    produced = stage_outputs(task, suite, outputs, folder)
    trajectory = Trajectory(
        evaluation_id="bench-grading", task_index=task.index, attempt=1, messages=messages, end_reason=EndReason.NO_CODE
    )

    def run(checks: list[dict[str, Any]]) -> list[CheckResult]:
        return run_file_checks(
            checks, session_files.gather(folder, suite, checks), checker=checker_sources(), image=image, timeout_s=120
        )

    began = time.perf_counter()
    verdict = grade(task, trajectory, produced, run)
    return verdict, time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, default=Path(__file__).resolve().parent.parent.parent / "shared/pybench")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--image", default=DEFAULT_SANDBOX_IMAGE)
    args = parser.parse_args()
    suite = load_suite(args.suite)
    recorded = recordings(suite)
    outputs = query_outputs(suite)
    tasks = [suite.task(i) for i in sorted(suite.tasks)]
    sandboxed = sum(
        1 for t in tasks if any(not runs_in_process(c) for g in Grading for c in checks_for(t.index, t.checks, g))
    )
    scratch = Path(tempfile.mkdtemp(prefix="pbe-bench-grading-"))
    try:
        began = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            futures = [
                pool.submit(
                    grade_task,
                    task,
                    suite,
                    recorded.get(task.index, [Message(role="assistant", content="Finished.")]),
                    outputs.get(task.index, []),
                    scratch / str(task.index),
                    args.image,
                )
                for task in tasks
            ]
            outcomes = [future.result() for future in futures]
        wall_s = time.perf_counter() - began
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    durations = [seconds for _, seconds in outcomes]
    by_status: dict[str, int] = {}
    fixed_status: dict[str, int] = {}
    for verdict, _ in outcomes:
        by_status[verdict.status.value] = by_status.get(verdict.status.value, 0) + 1
        if verdict.fixed is not None:
            fixed_status[verdict.fixed.status.value] = fixed_status.get(verdict.fixed.status.value, 0) + 1
    figures = {
        "bench": "grading",
        "tasks": len(tasks),
        "sandboxed_tasks": sandboxed,
        "workers": args.workers,
        "wall_s": round(wall_s, 2),
        "per_task_p50_s": round(statistics.median(durations), 3),
        "per_task_max_s": round(max(durations), 3),
        "original": by_status,
        "fixed": fixed_status,
        "target_s": TARGET_S,
        "met": wall_s <= TARGET_S,
    }
    rows = [
        ("tasks graded (both gradings)", f"{len(tasks)} ({sandboxed} with checks in a grading sandbox)"),
        ("graders in parallel", str(args.workers)),
        ("wall time, all tasks", f"{wall_s:.1f} s (target <= {TARGET_S:.0f} s)"),
        ("per task p50 / max", f"{statistics.median(durations):.2f} s / {max(durations):.2f} s"),
        ("original grading", json.dumps(by_status)),
        ("fixed grading", json.dumps(fixed_status)),
    ]
    for label, value in rows:
        print(f"{label:<34} {value}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
