"""``make bench-real-model``: the whole suite against a real small model, through the running compose stack.

SmolLM2-135M-Instruct under llama.cpp's server (the stack's ``model`` service, profile ``smollm2``) answers every
task of the suite, one epoch, with the LLM judge on the same server. A 135M model on CPU writes odd replies (no
code, broken fences, endless text, code that raises): the point is that every session and every grading ends with
a recorded reason, whatever it writes.

The evaluation is left in the stack (its dashboard page is printed) and exported with
``pybench-eval export --files --notebooks`` into ``--out``. It prints the wall time, each grading's pass rate with
its 95% interval, the verdicts by status, the sessions' end reasons (read from the exported notebooks), the
infrastructure failures, the tokens, and one JSON line last.

Needs the stack up with the model (``make up MODEL=smollm2``; ``make bench-real-model`` does it) and
``PBE_ADMIN_KEY``. On two cores it takes about an hour; ``--tasks`` runs a few.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.cli.report import interval_text  # noqa: E402
from gateway.client import GatewayClient, finished  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL_URL = "http://model:8000/v1"
MODEL_NAME = "smollm2"


def submission(args: argparse.Namespace) -> dict[str, Any]:
    """The evaluation's body: the model and the judge on the same llama.cpp server, one epoch, the suite's prompt,
    short replies (a CPU model), one session at a time (see ``--max-concurrency``)."""
    endpoint = {"base_url": args.model_url, "model": args.model}
    body: dict[str, Any] = {
        "model": endpoint,
        "prompt": "gpt",
        "preflight": True,
        "epochs": 1,
        "max_turns": args.max_turns,
        "max_concurrency": args.max_concurrency,
        "sampling": {"temperature": args.temperature, "max_tokens": args.max_tokens, "seed": args.seed},
    }
    if args.tasks:
        body["tasks"] = [int(t) for t in args.tasks.split(",") if t.strip()]
    if args.judge:
        body["judge"] = {"endpoint": endpoint, "mode": "absolute"}
    if args.max_seconds_per_task:
        body["budgets"] = {"max_seconds_per_task": args.max_seconds_per_task}
    return body


def follow(client: GatewayClient, evaluation_id: str, timeout_s: float, every_s: float) -> dict[str, Any]:
    """Poll the evaluation until it completes, printing its progress every ``every_s``; return its last view.

    Raises:
        TimeoutError: not complete within ``timeout_s`` (the evaluation keeps running in the stack).
    """
    started = time.monotonic()
    last_print = 0.0
    while True:
        view = client.evaluation(evaluation_id)
        now = time.monotonic()
        if finished(view):
            return view
        if now - started > timeout_s:
            raise TimeoutError(f"evaluation {evaluation_id} not complete after {timeout_s:.0f} s: {view['progress']}")
        if now - last_print >= every_s:
            counts = {state: n for state, n in view["progress"]["counts"].items() if n}
            print(f"  {now - started:7.0f} s  {counts}", flush=True)
            last_print = now
        time.sleep(5.0)


def export(gateway: str, evaluation_id: str, out: Path) -> None:
    """``pybench-eval export <id> --files --notebooks`` as a user runs it.

    Raises:
        RuntimeError: the command failed (its output is in the message).
    """
    command = [sys.executable, "-m", "gateway.cli", "--gateway", gateway, "export", evaluation_id]
    command += ["--out", str(out), "--files", "--notebooks"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"export failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")


def end_reasons(out: Path) -> collections.Counter[str]:
    """The sessions' end reasons, from the exported notebooks' metadata (the last attempt of each task)."""
    reasons: collections.Counter[str] = collections.Counter()
    for notebook in sorted((out / "notebooks").glob("*.ipynb")):
        metadata = json.loads(notebook.read_text()).get("metadata", {}).get("pybench_eval", {})
        reasons[metadata.get("end_reason") or "unknown"] += 1
    return reasons


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", default=f"http://127.0.0.1:{os.environ.get('PBE_GATEWAY_PORT', '8080')}")
    parser.add_argument("--model-url", default=MODEL_URL, help="as the executors reach it")
    parser.add_argument("--model", default=MODEL_NAME)
    parser.add_argument("--tasks", default="", help="comma-separated task indices (default: the whole suite)")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per reply at most")
    parser.add_argument("--temperature", type=float, default=0.2, help="PyBench samples at 0.2")
    parser.add_argument("--seed", type=int, default=20261128)
    # One session at a time: llama.cpp's server keeps the last prompt's cache, so a conversation's next turn evaluates
    # only its new tokens; two interleaved conversations made it evaluate every prompt whole (2,000 tokens at ~150
    # a second on one thread: 20 to 30 s a call, against 5 to 8).
    parser.add_argument("--max-concurrency", type=int, default=1)
    parser.add_argument("--max-seconds-per-task", type=float, default=0.0, help="a time budget per task (0: none)")
    parser.add_argument("--no-judge", dest="judge", action="store_false")
    parser.add_argument("--timeout", type=float, default=4 * 3600.0)
    parser.add_argument("--follow", metavar="ID", help="attach to an evaluation already submitted (a rerun's report)")
    parser.add_argument("--out", type=Path, default=ROOT / "var" / "bench-real-model")
    args = parser.parse_args()
    os.environ.setdefault("PBE_API_KEY", os.environ.get("PBE_ADMIN_KEY", ""))
    # The submission's preflight asks the model first, which answers one request at a time: give it minutes, and
    # an idempotency key, so that a submission retried after a lost answer is the same evaluation.
    client = GatewayClient(args.gateway, api_key=os.environ.get("PBE_API_KEY"), timeout_s=600.0)

    started = time.monotonic()
    if args.follow:
        view = client.evaluation(args.follow)
        created = datetime.fromisoformat(view["evaluation"]["created_at"].replace("Z", "+00:00"))
        started -= max(0.0, time.time() - created.timestamp())  # the wall time counts from its submission
        print(f"evaluation {args.follow}: following ({view['progress']['total']} tasks)", flush=True)
    else:
        view = client.submit(submission(args), idempotency_key=f"bench-real-model-{os.getpid()}-{time.time():.0f}")
        print(f"evaluation {view['evaluation']['id']}: {view['progress']['total']} tasks submitted", flush=True)
    evaluation_id = view["evaluation"]["id"]
    follow(client, evaluation_id, args.timeout, every_s=60.0)
    wall_s = time.monotonic() - started
    results = client.results(evaluation_id)
    metrics = results["metrics"]

    out = args.out / evaluation_id
    export_started = time.monotonic()
    export(args.gateway, evaluation_id, out)
    export_s = time.monotonic() - export_started
    reasons = end_reasons(out)
    notebooks = len(list((out / "notebooks").glob("*.ipynb"))) if (out / "notebooks").is_dir() else 0
    files = sum(1 for path in (out / "files").rglob("*") if path.is_file()) if (out / "files").is_dir() else 0
    client.close()

    by_status = {status: n for status, n in metrics["by_status"].items() if n}
    infra = by_status.get("infra_error", 0)
    print(f"\n{metrics['tasks']} tasks in {wall_s:.0f} s ({wall_s / max(metrics['tasks'], 1):.1f} s a task)")
    for grading, parts in results.get("statistics", {}).items():
        print(f"  {grading:<9} {interval_text(parts['all'])}")
    print(f"verdicts by status: {by_status}")
    print(f"sessions' end reasons: {dict(reasons.most_common())}")
    print(
        f"turns {metrics['avg_turns']:.2f} a task; tokens {metrics['prompt_tokens']} prompt, "
        f"{metrics['completion_tokens']} completion"
    )
    print(f"export: {out} in {export_s:.1f} s, {notebooks} notebooks, {files} saved files")
    print(f"dashboard: {args.gateway.rstrip('/')}/dashboard/evaluations/{evaluation_id} (the evaluation stays)")
    figures = {
        "benchmark": "real-model",
        "evaluation_id": evaluation_id,
        "model": args.model,
        "tasks": metrics["tasks"],
        "wall_s": round(wall_s, 1),
        "passed": metrics["passed"],
        "statistics": {
            grading: {key: parts["all"].get(key) for key in ("mean", "ci_low", "ci_high", "tasks", "excluded")}
            for grading, parts in results.get("statistics", {}).items()
        },
        "by_status": by_status,
        "infrastructure_failures": infra,
        "end_reasons": dict(reasons),
        "avg_turns": metrics["avg_turns"],
        "prompt_tokens": metrics["prompt_tokens"],
        "completion_tokens": metrics["completion_tokens"],
        "export_s": round(export_s, 1),
        "notebooks": notebooks,
        "saved_files": files,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
