"""Replay fidelity: every recorded trajectory of the suite re-executed through real sandboxes, and each code
cell's output compared with the output the recording got.

Each task with a recording and its inputs runs as a session against the replay model (the recorded assistant
messages, in order), in a docker sandbox of its own. The n-th interpreter message of the replay is compared
with the n-th of the recording, both normalised: ANSI colours, memory addresses, absolute paths, object ids,
timings and whitespace runs are written one way. A cell matches when the normalised texts are equal.
Mismatches are sorted into causes:

- ``recording_env_error``: the recording got an error where the replay did not (the benchmark's environment
  had broken packages: ``module 'pandas' has no attribute 'read_csv'``, a circular import...);
- ``replay_error``: the replay got an error where the recording did not;
- ``both_error``: both failed, differently;
- ``output_differs``: both ran, with other output (library versions, random seeds, dict order...);
- ``diverged``: the replay stopped earlier or later than the recording (turn limit, no code).

Prints a table per task and overall, then one JSON line. Usage:
    python scripts/replay_fidelity.py [--suite ../shared/pybench] [--tasks 2,3,4] [--workers 2]
"""

import argparse
import json
import re
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import docker.client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.session import run_task_session  # noqa: E402
from executor.settings import ExecutorSettings  # noqa: E402
from replay.server import create_app  # noqa: E402
from services.endpoint.client import EndpointClient  # noqa: E402
from services.evaluation import Evaluation, ModelEndpoint, Sampling  # noqa: E402
from services.pybench.recordings import read_recordings  # noqa: E402
from services.pybench.rules import ERROR_PREAMBLE, interpreter_output, is_interpreter_message  # noqa: E402
from services.pybench.suite import Suite, load_suite  # noqa: E402
from services.sandbox.contract import DEFAULT_SANDBOX_IMAGE, ROLE_LABEL  # noqa: E402
from services.sandbox.docker import DockerSandboxBackend  # noqa: E402
from tests.servers import serve  # noqa: E402

NETWORK = "pbe-fidelity-sandboxes"

_NORMALISE = [
    (re.compile(r"\x1b\[[0-9;]*[A-Za-z]"), ""),  # ANSI colours
    (re.compile(r"0x[0-9a-fA-F]{6,}"), "0xADDR"),
    (re.compile(r"(/[\w.\-]+)+/(data|output)/"), r"./\2/"),  # absolute paths of the workspace
    (re.compile(r"/(?:usr|opt|home|root|tmp)[\w/.\-]*"), "/PATH"),
    (re.compile(r"\b\d+(\.\d+)?\s*(ms|s|sec|seconds)\b"), "N s"),
    (re.compile(r"<Figure size [^>]*>"), "<Figure>"),
    (re.compile(r"np\.(?:int|uint|float|bool_|str_)\w*\(([^()]*)\)"), r"\1"),  # numpy 2 scalar reprs
    (re.compile(r"[ \t]+"), " "),
    (re.compile(r"\s*\n\s*"), "\n"),
]


def normalise(text: str) -> str:
    text = interpreter_output(text)
    for pattern, replacement in _NORMALISE:
        text = pattern.sub(replacement, text)
    return text.strip()


def interpreter_outputs(messages: list[dict[str, Any]]) -> list[str]:
    """The code interpreter's messages of a trajectory, in order."""
    return [m["content"] for m in messages if is_interpreter_message(m)]


def cause(recorded: str, replayed: str) -> str:
    recorded_error, replayed_error = ERROR_PREAMBLE in recorded, ERROR_PREAMBLE in replayed
    if recorded_error and not replayed_error:
        return "recording_env_error"
    if replayed_error and not recorded_error:
        return "replay_error"
    if recorded_error and replayed_error:
        return "both_error"
    return "output_differs"


def replay_task(suite: Suite, index: int, url: str, recorded: list[dict[str, Any]], image: str) -> dict[str, Any]:
    task = suite.task(index)
    evaluation = Evaluation(
        id=f"fidelity{index}",
        model=ModelEndpoint(base_url=url, model="pybench-replay"),
        suite=suite.name,
        tasks=[index],
        max_turns=10,
        cell_timeout_s=120,
        prompt="gpt",
        sampling=Sampling(),
    )
    settings = ExecutorSettings(SANDBOX_IMAGE=image, SANDBOX_MEMORY_MB=4096, SANDBOX_READY_TIMEOUT_S=120)
    model = EndpointClient(url, "pybench-replay", timeout_s=60)
    backend = DockerSandboxBackend(network=NETWORK)
    began = time.monotonic()
    try:
        trajectory, _ = run_task_session(
            evaluation, task, 1, suite=suite, backend=backend, settings=settings, model=model
        )
    finally:
        model.close()
    ours = interpreter_outputs([m.model_dump() for m in trajectory.messages])
    theirs = interpreter_outputs(recorded)
    causes: Counter[str] = Counter()
    matched = recorded_ok = recorded_ok_matched = 0
    for position in range(max(len(ours), len(theirs))):
        if position >= len(ours) or position >= len(theirs):
            causes["diverged"] += 1
            continue
        same = normalise(ours[position]) == normalise(theirs[position])
        if ERROR_PREAMBLE not in theirs[position]:
            recorded_ok += 1
            recorded_ok_matched += same
        if same:
            matched += 1
        else:
            causes[cause(theirs[position], ours[position])] += 1
    return {
        "task": index,
        "cells": max(len(ours), len(theirs)),
        "matched": matched,
        "recorded_ok": recorded_ok,
        "recorded_ok_matched": recorded_ok_matched,
        "causes": dict(causes),
        "end_reason": trajectory.end_reason.value,
        "wall_s": round(time.monotonic() - began, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, default=Path(__file__).resolve().parent.parent.parent / "shared/pybench")
    parser.add_argument("--tasks", default="", help="comma-separated task indices (default: every recorded one)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--image", default=DEFAULT_SANDBOX_IMAGE)
    args = parser.parse_args()
    suite = load_suite(args.suite)
    recordings: dict[int, list[dict[str, str]]] = {}
    for recording in read_recordings(args.suite / "trajectory.jsonl"):
        if recording.index is not None:
            recordings.setdefault(recording.index, recording.messages)
    wanted = [int(t) for t in args.tasks.split(",") if t.strip()] or sorted(recordings)
    runnable = [i for i in wanted if i in recordings and i in suite.tasks and suite.task(i).available]
    skipped = [i for i in wanted if i not in runnable]
    engine = docker.client.from_env()
    if not engine.networks.list(names=[NETWORK]):
        engine.networks.create(NETWORK, driver="bridge", internal=True, labels={ROLE_LABEL: "fidelity"})
    began = time.monotonic()
    try:
        with serve(create_app(args.suite / "trajectory.jsonl")) as url, ThreadPoolExecutor(args.workers) as pool:
            futures = [pool.submit(replay_task, suite, i, url + "/v1", recordings[i], args.image) for i in runnable]
            rows = [future.result() for future in futures]
    finally:
        for index in runnable:
            DockerSandboxBackend(network=NETWORK).reap(evaluation_id=f"fidelity{index}")
        for network in engine.networks.list(names=[NETWORK]):
            network.remove()
    cells = sum(r["cells"] for r in rows)
    matched = sum(r["matched"] for r in rows)
    causes: Counter[str] = Counter()
    for row in rows:
        causes.update(row["causes"])
        print(f"task {row['task']:>4}: {row['matched']:>2}/{row['cells']:<2} cells match  {row['causes'] or ''}")
    exact = sum(1 for r in rows if r["cells"] and r["matched"] == r["cells"])
    ok = sum(r["recorded_ok"] for r in rows)
    ok_matched = sum(r["recorded_ok_matched"] for r in rows)
    print(f"\n{matched}/{cells} cells match ({matched / cells:.1%}); {exact}/{len(rows)} tasks match in every cell")
    print(f"where the recording ran without error: {ok_matched}/{ok} cells match ({ok_matched / max(ok, 1):.1%})")
    print(f"mismatch causes: {dict(causes.most_common())}; skipped (no recording or inputs): {skipped}")
    figures = {
        "bench": "replay_fidelity",
        "tasks": len(rows),
        "skipped": skipped,
        "cells": cells,
        "cells_matched": matched,
        "cell_match_rate": round(matched / cells, 4) if cells else 0.0,
        "tasks_fully_matched": exact,
        "recorded_ok_cells": ok,
        "recorded_ok_matched": ok_matched,
        "recorded_ok_match_rate": round(ok_matched / ok, 4) if ok else 0.0,
        "causes": dict(causes),
        "wall_s": round(time.monotonic() - began, 1),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
