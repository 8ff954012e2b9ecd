"""The CLI's commands: each takes the parsed arguments, a gateway client and a printer, and returns an exit
status (0), raising the errors ``main`` turns into one ``error:`` line.

Every command raises ``GatewayError`` for an error answer and ``GatewayUnreachableError`` for none; the
others it may raise are in its docstring.
"""

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from gateway.client import GatewayClient
from services.verdict import Results

from . import preflight
from .errors import CommandError, UsageError
from .export import export
from .printer import Printer
from .report import (
    interval_text,
    manifest_line,
    print_intervals,
    print_pass_rates,
    print_tasks,
    summary_line,
    usage_line,
)
from .watch import task_categories, watch

MAX_PAGE = 100
"""The most evaluations the gateway lists in one page."""


def parse_tasks(spec: str) -> list[int]:
    """``1,2,5-9`` -> ``[1, 2, 5, 6, 7, 8, 9]`` (sorted, each once).

    Raises:
        UsageError: a part is not a number or a range ``a-b`` with ``a <= b``.
    """
    tasks: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        low, dash, high = part.partition("-")
        try:
            first, last = (int(low), int(high)) if dash else (int(part), int(part))
        except ValueError:
            raise UsageError(f"--tasks: {part!r} is neither a task index nor a range like 5-9") from None
        if first > last or first < 0:
            raise UsageError(f"--tasks: {part!r} is not a range from a lower to a higher index")
        tasks.update(range(first, last + 1))
    if not tasks:
        raise UsageError("--tasks names no task; give indices like 1,2,5-9 or leave it out for every task")
    return sorted(tasks)


def secret_from_env(variable: str | None, flag: str) -> str | None:
    """The value of the environment variable a ``--...-key-env`` flag names (None without the flag).

    Raises:
        UsageError: the variable is not set, or empty.
    """
    if variable is None:
        return None
    value = os.environ.get(variable)
    if not value:
        raise UsageError(f"{flag} names {variable}, which is not set; export {variable}=<the API key> first")
    return value


def _print_json(printer: Printer, data: Any) -> None:
    print(json.dumps(data, indent=1, ensure_ascii=False, default=str), file=printer.out, flush=True)


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def submit(args: argparse.Namespace, client: GatewayClient, printer: Printer) -> int:
    """Check the endpoints (unless --no-preflight), submit, print the evaluation id; then watch with --watch.

    Raises:
        UsageError: a key variable is not set, a bad --tasks, a judge without its model.
        PreflightError: the model or judge endpoint is unreachable or does not serve the model.
        GatewayError: the gateway refused the submission (422, 403 for a refused endpoint, 429, ...).
        GatewayUnreachableError: no answer from the gateway.
    """
    model_key = secret_from_env(args.model_key_env, "--model-key-env")
    body: dict[str, Any] = {"model": {"base_url": args.model_url, "model": args.model}}
    if model_key:
        body["api_key"] = model_key
    if args.tasks is not None:
        body["tasks"] = parse_tasks(args.tasks)
    if args.prompt is not None:
        body["prompt"] = args.prompt
    if args.max_turns is not None:
        body["max_turns"] = args.max_turns
    if args.max_concurrency is not None:
        body["max_concurrency"] = args.max_concurrency
    if args.epochs is not None:
        body["epochs"] = args.epochs
    for field, value in (("suite", args.suite), ("mode", args.mode), ("cell_timeout_s", args.cell_timeout)):
        if value is not None:
            body[field] = value
    sampling = {
        name: value
        for name, value in (
            ("temperature", args.temperature),
            ("top_p", args.top_p),
            ("max_tokens", args.max_tokens),
            ("frequency_penalty", args.frequency_penalty),
            ("seed", args.seed),
        )
        if value is not None
    }
    if sampling:
        body["sampling"] = sampling
    prices = [args.input_price, args.output_price]
    if any(p is not None for p in prices):
        if not all(p is not None for p in prices):
            raise UsageError("a cost needs both --input-price and --output-price (USD per million tokens)")
        body["prices"] = {"input_per_million": args.input_price, "output_per_million": args.output_price}
    budgets = {
        name: value
        for name, value in (
            ("max_tokens_per_task", args.max_tokens_per_task),
            ("max_seconds_per_task", args.max_seconds_per_task),
            ("max_cost_usd", args.max_cost),
        )
        if value is not None
    }
    if budgets:
        if "max_cost_usd" in budgets and "prices" not in body:
            raise UsageError("--max-cost needs --input-price and --output-price (USD per million tokens)")
        body["budgets"] = budgets
    if args.reply_cache:
        body["reply_cache"] = True
    if args.no_server_preflight:
        body["preflight"] = False
    judge_given = [args.judge_url is not None, args.judge_model is not None]
    if any(judge_given) and not all(judge_given):
        raise UsageError("a judge needs both --judge-url and --judge-model")
    judge_key = secret_from_env(args.judge_key_env, "--judge-key-env")
    if args.judge_url is not None:
        body["judge"] = {"endpoint": {"base_url": args.judge_url, "model": args.judge_model}, "mode": args.judge_mode}
        if judge_key:
            body["judge_api_key"] = judge_key
    if not args.no_preflight:
        preflight.check_model(args.model_url, args.model, model_key)
        _note(f"preflight: {args.model_url} serves {args.model!r}")
        if args.judge_url is not None:
            preflight.check_model(args.judge_url, args.judge_model, judge_key, role="judge")
            _note(f"preflight: {args.judge_url} serves the judge {args.judge_model!r}")
    view = client.submit(body, idempotency_key=args.idempotency_key)
    evaluation = view["evaluation"]
    if args.json:
        _print_json(printer, view)
    else:
        printer.line(evaluation["id"])
    unavailable = evaluation.get("unavailable_tasks") or []
    skipped = f" ({len(unavailable)} unavailable here: {', '.join(map(str, unavailable))})" if unavailable else ""
    _note(
        f"submitted evaluation {evaluation['id']}: {len(evaluation['tasks'])} tasks{skipped}, at most "
        f"{evaluation.get('max_concurrency', '?')} at once; follow it with `pybench-eval watch {evaluation['id']}`"
    )
    if args.watch:
        watch(client, evaluation["id"], printer, json_lines=args.json)
    return 0


def watch_command(args: argparse.Namespace, client: GatewayClient, printer: Printer) -> int:
    """Raises: as ``watch.watch``."""
    watch(client, args.id, printer, json_lines=args.json)
    return 0


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}" if value < 0 else f"{100 * value:.1f}"


def regrade(args: argparse.Namespace, client: GatewayClient, printer: Printer) -> int:
    """Ask for a regrade (with a new judge when ``--judge-url`` and ``--judge-model`` are given) and say which
    grading it is."""
    if bool(args.judge_url) != bool(args.judge_model):
        raise UsageError("a new judge needs both --judge-url and --judge-model")
    judge = None
    if args.judge_url:
        judge = {"endpoint": {"base_url": args.judge_url, "model": args.judge_model}, "mode": args.judge_mode}
    judge_key = os.environ.get(args.judge_key_env) if args.judge_key_env else None
    view = client.regrade(args.id, judge, judge_key)
    if args.json:
        _print_json(printer, view)
        return 0
    printer.line(
        f"evaluation {args.id}: grading {view['evaluation']['grading']} under way "
        f"({view['progress']['counts'].get('grading', 0)} tasks); follow it with `pybench-eval watch {args.id}`"
    )
    return 0


def epochs(args: argparse.Namespace, client: GatewayClient, printer: Printer) -> int:
    """Print a run's epochs (id, seed, status) and, per grading, its rate with the 95% interval, pass@k and
    pass^k."""
    run = client.epochs(args.id)
    if args.json:
        _print_json(printer, run)
        return 0
    printer.table(
        ["epoch", "evaluation", "seed", "status"],
        [[str(e["epoch"]), e["evaluation_id"], str(e["seed"]), e["status"]] for e in run["epochs"]],
        title=f"run {run['run_id']}" + ("" if run["complete"] else " (not complete: statistics so far)"),
    )
    for grading, parts in run["statistics"].items():
        overall = parts["all"]
        at_k = ", ".join(f"pass@{k} {100 * v:.1f}%" for k, v in overall["pass_at_k"].items())
        hat_k = ", ".join(f"pass^{k} {100 * v:.1f}%" for k, v in overall["pass_hat_k"].items())
        printer.line(f"{grading}: {interval_text(overall)}; {at_k}; {hat_k}")
    return 0


def compare(args: argparse.Namespace, client: GatewayClient, printer: Printer) -> int:
    """Print the paired comparison of two evaluations: per grading and category, B - A in points, its 95% interval,
    the p-value and the test."""
    raw = client.compare(args.a, args.b)
    if args.json:
        _print_json(printer, raw)
        return 0
    headers = ["grading", "category", "tasks", "B - A (points)", "95% interval", "p-value", "test"]
    rows = []
    for grading, parts in raw["gradings"].items():
        for category, row in [("all", parts["all"]), *sorted(parts["per_category"].items())]:
            interval = "-" if row["ci_low"] is None else f"[{_percent(row['ci_low'])}, {_percent(row['ci_high'])}]"
            p_value = "-" if row["p_value"] is None else f"{row['p_value']:.4g}"
            rows.append([grading, category, str(row["tasks"]), _percent(row["difference"]), interval, p_value,
                         row["test"] or "-"])  # fmt: skip
    models = raw["models"]
    printer.table(headers, rows, title=f"B {args.b} ({models['b']}) against A {args.a} ({models['a']})")
    return 0


def results(args: argparse.Namespace, client: GatewayClient, printer: Printer) -> int:
    raw = client.results(args.id)
    if args.json:
        _print_json(printer, raw)
        return 0
    document = Results.model_validate(raw)
    view = client.evaluation(args.id)
    evaluation = view["evaluation"]
    states = {int(t["index"]): str(t["state"]) for t in client.tasks(args.id)}
    categories = task_categories(client, str(evaluation["suite"]), list(states))
    graded = len(document.verdicts)
    printer.line(
        f"evaluation {args.id} · model {evaluation['model']['model']} · {view['status']} · "
        f"{graded} of {len(states)} tasks graded"
    )
    printer.line(f"passed: {summary_line(document)}")
    printer.line(usage_line(document.metrics))
    manifest = evaluation.get("manifest")
    if manifest:
        printer.line(manifest_line(manifest))
    printer.line()
    print_pass_rates(printer, document.metrics)
    print_intervals(printer, document.statistics)
    print_tasks(printer, document, states, categories)
    return 0


def _finished(view: dict[str, Any]) -> str:
    counts = view["progress"]["counts"]
    done = sum(int(counts.get(s, 0)) for s in ("done", "unavailable", "cancelled"))
    return f"{done}/{view['progress']['total']}"


def list_command(args: argparse.Namespace, client: GatewayClient, printer: Printer) -> int:
    """Raises: UsageError: --limit below 1."""
    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    items: list[dict[str, Any]] = []
    cursor = None
    while len(items) < args.limit:
        page = client.evaluations(
            limit=min(MAX_PAGE, args.limit - len(items)), cursor=cursor, model=args.model, status=args.status
        )
        items += page["items"]
        cursor = page.get("next_cursor")
        if not cursor:
            break
    if args.json:
        _print_json(printer, items)
        return 0
    rows = [
        [
            v["evaluation"]["id"],
            str(v["evaluation"]["created_at"])[:19].replace("T", " "),
            v["evaluation"]["model"]["model"],
            v["status"],
            _finished(v),
        ]
        for v in items
    ]
    printer.table(["evaluation", "created (UTC)", "model", "status", "finished"], rows)
    if not items:
        printer.line("no evaluations; submit one with `pybench-eval submit`")
    return 0


def cancel(args: argparse.Namespace, client: GatewayClient, printer: Printer) -> int:
    view = client.cancel(args.id)
    if args.json:
        _print_json(printer, view)
        return 0
    counts = view["progress"]["counts"]
    printer.line(
        f"evaluation {args.id}: {view['status']}; {counts.get('cancelled', 0)} queued tasks cancelled, "
        f"{counts.get('running', 0)} running ones stop at their next turn, {counts.get('grading', 0)} finished "
        "ones are graded"
    )
    return 0


def send_keys(args: argparse.Namespace, client: GatewayClient, printer: Printer) -> int:
    """Raises: UsageError: neither key flag, or a key variable that is not set."""
    model_key = secret_from_env(args.model_key_env, "--model-key-env")
    judge_key = secret_from_env(args.judge_key_env, "--judge-key-env")
    if model_key is None and judge_key is None:
        raise UsageError("send-keys needs --model-key-env VAR, --judge-key-env VAR or both")
    view = client.send_keys(args.id, model_key, judge_key)
    if args.json:
        _print_json(printer, view)
        return 0
    sent = " and ".join(name for name, key in (("model", model_key), ("judge", judge_key)) if key)
    printer.line(f"evaluation {args.id}: {sent} key held again; run `pybench-eval retry {args.id}` for failed tasks")
    return 0


def retry(args: argparse.Namespace, client: GatewayClient, printer: Printer) -> int:
    """Raises: UsageError: a bad --tasks, or a key variable that is not set."""
    tasks = parse_tasks(args.tasks) if args.tasks is not None else None
    model_key = secret_from_env(args.model_key_env, "--model-key-env")
    judge_key = secret_from_env(args.judge_key_env, "--judge-key-env")
    view = client.retry(args.id, tasks, model_key, judge_key)
    if args.json:
        _print_json(printer, view)
        return 0
    queued = view["progress"]["counts"].get("queued", 0)
    printer.line(f"evaluation {args.id}: {view['status']}; {queued} tasks queued (failed ones run as new attempts)")
    return 0


def leaderboard(args: argparse.Namespace, client: GatewayClient, printer: Printer) -> int:
    board = client.leaderboard()
    if args.json:
        _print_json(printer, board)
        return 0

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    if not board:
        printer.line("no completed evaluations yet")
        return 0
    categories = sorted({name for row in board for name in row["best"].get("per_category", {})})
    headers = ["#", "model", "runs", "best", "fixed", "LLM", *categories, "tokens", "cost", "best evaluation"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in board:
        groups.setdefault(row["comparable_key"], []).append(row)
    for key, rows in groups.items():
        first = rows[0]
        table = [
            [
                str(row["rank"]),
                row["model"],
                str(row["evaluations"]),
                rate(row["best"]["pass_rate"]),
                rate(row["best"].get("fixed_pass_rate")),
                rate(row["best"].get("llm_pass_rate")),
                *(rate(row["best"].get("per_category", {}).get(name)) for name in categories),
                str(row["best"].get("prompt_tokens", 0) + row["best"].get("completion_tokens", 0)),
                "-" if row["best"].get("cost_usd") is None else f"${row['best']['cost_usd']:.2f}",
                row["best"]["evaluation_id"],
            ]
            for row in rows
        ]
        title = (
            f"{first['suite']}, {first['task_count']} tasks, prompt {first['prompt']}, mode {first['mode']} "
            f"(comparable runs {key[:12]}; original tests' pass rate)"
        )
        printer.table(headers, table, title=title)
    return 0


def export_command(args: argparse.Namespace, client: GatewayClient, printer: Printer) -> int:
    """Raises: UsageError: --notebooks without nbformat. CommandError: a file cannot be written."""
    out = Path(args.out)
    view = client.evaluation(args.id)
    suite_tasks = {int(t["index"]): t for t in client.suite_tasks(str(view["evaluation"]["suite"]))}
    report = export(client, args.id, out, notebooks=args.notebooks, files=args.files, categories=suite_tasks)
    if report.missing:
        _note(f"no trajectory (yet) for tasks {', '.join(map(str, report.missing))}: not exported")
    if args.json:
        _print_json(
            printer,
            {
                "out": str(out),
                "trajectories": report.trajectories,
                "notebooks": [str(p) for p in report.notebooks],
                "files": [str(p) for p in report.files],
                "missing": report.missing,
            },
        )
        return 0
    printer.line(f"wrote {out / 'results.json'}")
    printer.line(f"wrote {out / 'trajectory.jsonl'} ({len(report.trajectories)} tasks)")
    if args.notebooks:
        printer.line(f"wrote {len(report.notebooks)} notebooks in {out / 'notebooks'}")
    if args.files:
        printer.line(f"wrote {len(report.files)} saved files in {out / 'files'}")
    return 0


def keys(args: argparse.Namespace) -> int:
    """Delegate to ``python -m gateway.keys`` (server-side: it needs the gateway's Redis, PBE_REDIS_URL).

    Raises:
        CommandError: Redis cannot be reached or the settings are invalid.
    """
    from pydantic import ValidationError
    from redis.exceptions import RedisError

    from gateway import keys as key_admin

    try:
        return key_admin.main(list(args.rest))
    except SystemExit as exc:  # its own usage errors
        return exc.code if isinstance(exc.code, int) else 2
    except RedisError as exc:
        raise CommandError(
            f"cannot reach the gateway's Redis ({type(exc).__name__}); keys are made where Redis is reachable: "
            "set PBE_REDIS_URL"
        ) from exc
    except ValidationError as exc:
        raise CommandError(f"invalid settings: {exc.errors()[0]['msg']}; check the PBE_ variables") from exc
