"""Submit PyBench tasks against the replay model to a running stack, wait, and print the verdicts.

Usage: python scripts/demo.py --gateway http://127.0.0.1:8080 --tasks 2,3,7
The replay model (service ``replay`` of the compose stack) answers with the suite's recorded trajectories.
"""

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.cli.report import interval_text  # noqa: E402
from gateway.client import GatewayClient  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", default="http://127.0.0.1:8080")
    parser.add_argument("--tasks", default="13,16,30,44,77,90,103,112,121,134,135", help="comma-separated task indices")
    parser.add_argument("--model-url", default="http://replay:8000/v1", help="as the executor reaches it")
    parser.add_argument("--model", default="pybench-replay", help="the model name the endpoint serves")
    parser.add_argument(
        "--preflight",
        action="store_true",
        help="let the gateway check the endpoint first (a real model; the replay model answers recorded tasks only)",
    )
    parser.add_argument("--max-tokens", type=int, help="tokens per reply at most (a small CPU model: keep it short)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument(
        "--key-env", default="PBE_ADMIN_KEY", help="the environment variable that holds this service's API key"
    )
    args = parser.parse_args()
    tasks = [int(t) for t in args.tasks.split(",") if t.strip()]
    client = GatewayClient(args.gateway, api_key=os.environ.get(args.key_env))
    started = time.monotonic()
    body: dict[str, Any] = {
        "model": {"base_url": args.model_url, "model": args.model},
        "tasks": tasks,
        "prompt": "gpt",
        "preflight": args.preflight,
    }
    if args.max_tokens:
        body["sampling"] = {"temperature": 0.0, "max_tokens": args.max_tokens}
    view = client.submit(body)
    evaluation_id = view["evaluation"]["id"]
    print(f"evaluation {evaluation_id}: {len(tasks)} tasks submitted, waiting ...", flush=True)
    client.wait(evaluation_id, args.timeout)
    results = client.results(evaluation_id)
    print(f"\n{'task':>5}  {'category':<12} {'verdict':<12} {'turns':>5}  sandbox")
    for verdict in results["verdicts"]:
        sandbox = (verdict.get("sandbox_id") or "-")[:12]
        reason = f"  ({verdict['reason']})" if verdict["status"] not in ("passed", "failed") else ""
        print(
            f"{verdict['task_index']:>5}  {verdict['paper_category']:<12} {verdict['status']:<12} "
            f"{verdict['turns']:>5}  {sandbox}{reason}"
        )
    metrics = results["metrics"]
    print(
        f"\npass rate {metrics['passed']}/{metrics['tasks']} = {metrics['pass_rate']:.1%}, "
        f"average turns {metrics['avg_turns']:.1f}, wall time {time.monotonic() - started:.1f} s"
    )
    for name, category in metrics["per_category"].items():
        print(f"  {name:<12} {category['passed']}/{category['tasks']}")
    for grading, parts in results.get("statistics", {}).items():
        print(f"{grading} tests: {interval_text(parts['all'])} (95% interval over the tasks decided)")
    client.close()
    print(f"\ndashboard: {args.gateway.rstrip('/')}/dashboard/evaluations/{evaluation_id}")
    print(f"  (sign in with the API key in ${args.key_env}; `make down` stops the stack)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
