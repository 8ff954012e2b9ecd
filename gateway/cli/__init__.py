"""``pybench-eval``: the command-line client of the gateway.

Commands: ``submit`` (with a preflight of the model endpoint), ``watch``, ``results``, ``list``, ``cancel``,
``retry``, ``leaderboard``, ``export`` and ``keys`` (server-side). The gateway is ``--gateway`` or
``PBE_GATEWAY_URL``; this service's API key is ``--key`` or, better (a flag shows in the process list),
``PBE_API_KEY``. Model and judge keys are only ever read from environment variables named by flags. No key
is ever printed.

Exit status: 0 done; 1 the request failed (an error answer, an unreachable gateway, a failed preflight);
2 the command line is wrong. Errors are one ``error: ...`` line on stderr, never a traceback.
"""

import argparse
import os
import sys
from collections.abc import Callable

from gateway.client import GatewayClient, GatewayError, GatewayUnreachableError

from . import commands
from .errors import CommandError
from .printer import Printer

DEFAULT_GATEWAY_URL = "http://127.0.0.1:8080"
"""Where the gateway listens when neither --gateway nor PBE_GATEWAY_URL says otherwise."""

DEFAULT_TIMEOUT_S = 30.0
"""Seconds a request to the gateway may take."""

Command = Callable[[argparse.Namespace, GatewayClient, Printer], int]


def _common(top: bool) -> argparse.ArgumentParser:
    """The options every command takes, before or after its name (only the top level sets their defaults)."""
    parser = argparse.ArgumentParser(add_help=False)

    def default(value: object) -> object:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "--gateway",
        metavar="URL",
        default=default(os.environ.get("PBE_GATEWAY_URL") or DEFAULT_GATEWAY_URL),
        help=f"the gateway's base URL (default: $PBE_GATEWAY_URL, else {DEFAULT_GATEWAY_URL})",
    )
    parser.add_argument(
        "--key",
        metavar="KEY",
        default=default(os.environ.get("PBE_API_KEY")),
        help="this service's API key (default: $PBE_API_KEY, which is better: a flag shows in the process list)",
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON for machines")
    parser.add_argument(
        "--timeout", type=float, metavar="S", default=default(DEFAULT_TIMEOUT_S), help="seconds per request"
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The command line; defaults are read from the environment now, not at import."""
    common = _common(top=False)
    parser = argparse.ArgumentParser(
        prog="pybench-eval",
        description="Evaluate LLM agents on PyBench through a pybench-eval gateway.",
        parents=[_common(top=True)],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str, handler: Command) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        command.set_defaults(handler=handler)
        return command

    submit = add("submit", "submit a model endpoint for evaluation; prints the evaluation id", commands.submit)
    submit.add_argument("--model-url", required=True, metavar="URL", help="OpenAI-compatible base URL, e.g. .../v1")
    submit.add_argument("--model", required=True, metavar="NAME", help="the model name the endpoint serves")
    submit.add_argument("--model-key-env", metavar="VAR", help="the environment variable holding the model's key")
    submit.add_argument("--tasks", metavar="SPEC", help="task indices like 1,2,5-9 (default: every task)")
    submit.add_argument("--prompt", metavar="NAME", help="the suite prompt (the gateway's default: llama3)")
    submit.add_argument("--max-turns", type=int, metavar="N", help="assistant turns per task (default 10)")
    submit.add_argument(
        "--max-concurrency",
        type=int,
        metavar="N",
        help="sessions of this evaluation that may call the endpoint at once, across all executors (default 16)",
    )
    submit.add_argument("--suite", metavar="NAME", help="the suite to run (default: pybench)")
    submit.add_argument(
        "--epochs", type=int, metavar="N", help="independent runs of every task, 1-10 (default 1); see `epochs ID`"
    )
    submit.add_argument("--seed", type=int, metavar="S", help="the sampling seed (epoch e gets S + e - 1)")
    submit.add_argument(
        "--mode",
        choices=("pybench", "tools"),
        help="pybench: code read from the reply's text (the benchmark's way, default); tools: an execute_python tool",
    )
    submit.add_argument("--cell-timeout", type=float, metavar="S", help="seconds a code cell may run (default 120)")
    submit.add_argument("--temperature", type=float, metavar="T", help="sampling temperature (0-2)")
    submit.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling (0-1]")
    submit.add_argument("--max-tokens", type=int, metavar="N", help="tokens per reply at most")
    submit.add_argument("--frequency-penalty", type=float, metavar="F", help="frequency penalty (-2 to 2)")
    submit.add_argument(
        "--input-price", type=float, metavar="USD", help="price per million prompt tokens, for the cost column"
    )
    submit.add_argument(
        "--output-price", type=float, metavar="USD", help="price per million completion tokens, for the cost column"
    )
    submit.add_argument(
        "--max-tokens-per-task", type=int, metavar="N", help="a session stops past N tokens (token_budget)"
    )
    submit.add_argument(
        "--max-seconds-per-task", type=float, metavar="S", help="a session stops past S seconds (time_budget)"
    )
    submit.add_argument(
        "--max-cost",
        type=float,
        metavar="USD",
        help="the evaluation stops every session once it spent USD at its prices (cost_budget; needs the prices)",
    )
    submit.add_argument(
        "--reply-cache",
        action="store_true",
        help="keep the model's replies so a retried session pays only for the turns that remain (deterministic "
        "endpoints only: greedy decoding, or a seed the endpoint honours)",
    )
    submit.add_argument(
        "--no-server-preflight",
        action="store_true",
        help="ask the gateway not to check the endpoint before accepting (its own preflight, on by default)",
    )
    submit.add_argument("--judge-url", metavar="URL", help="an LLM judge's OpenAI-compatible base URL")
    submit.add_argument("--judge-model", metavar="NAME", help="the judge's model name")
    submit.add_argument("--judge-mode", choices=("absolute", "pairwise"), default="absolute")
    submit.add_argument("--judge-key-env", metavar="VAR", help="the environment variable holding the judge's key")
    submit.add_argument("--idempotency-key", metavar="K", help="a repeated submission with it returns the same one")
    submit.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip checking GET <model-url>/models from here (when only the workers can reach the endpoint)",
    )
    submit.add_argument("--watch", action="store_true", help="then watch it until it ends")

    watch = add("watch", "follow an evaluation live until it ends, then print its pass rates", commands.watch_command)
    watch.add_argument("id", help="the evaluation id")

    results = add("results", "pass rates per category and the verdict of every task", commands.results)
    results.add_argument("id", help="the evaluation id")

    listing = add("list", "your evaluations, newest first", commands.list_command)
    listing.add_argument("--status", choices=("queued", "running", "completed", "cancelled"))
    listing.add_argument("--model", metavar="NAME", help="only this model name")
    listing.add_argument("--limit", type=int, default=20, metavar="N", help="at most this many (default 20)")

    cancel = add("cancel", "cancel queued tasks (running ones stop at their next turn)", commands.cancel)
    cancel.add_argument("id", help="the evaluation id")

    send_keys = add(
        "send-keys", "give the gateway an evaluation's API keys again (after it lost them)", commands.send_keys
    )
    send_keys.add_argument("id", help="the evaluation id")
    send_keys.add_argument("--model-key-env", metavar="VAR", help="the environment variable holding the model's key")
    send_keys.add_argument("--judge-key-env", metavar="VAR", help="the environment variable holding the judge's key")

    retry = add("retry", "run failed, infra_error and ungradable tasks again", commands.retry)
    retry.add_argument("id", help="the evaluation id")
    retry.add_argument("--tasks", metavar="SPEC", help="only these (like 1,2,5-9); default: every failed one")
    retry.add_argument(
        "--model-key-env", metavar="VAR", help="the variable holding the model's key (a finished evaluation needs it)"
    )
    retry.add_argument("--judge-key-env", metavar="VAR", help="the environment variable holding the judge's key")

    add("leaderboard", "per model, its best and latest completed evaluation", commands.leaderboard)

    regrade = add("regrade", "grade a finished evaluation again from its stored sessions", commands.regrade)
    regrade.add_argument("id", help="the evaluation id")
    regrade.add_argument("--judge-url", metavar="URL", help="a new LLM judge's OpenAI-compatible base URL")
    regrade.add_argument("--judge-model", metavar="NAME", help="the new judge's model name")
    regrade.add_argument("--judge-mode", choices=("absolute", "pairwise"), default="absolute", help="how it judges")
    regrade.add_argument("--judge-key-env", metavar="VAR", help="the environment variable holding the judge's key")

    epochs = add("epochs", "a run's epochs and its statistics: mean, 95%% interval, pass@k, pass^k", commands.epochs)
    epochs.add_argument("id", help="the id of any epoch of the run")

    compare = add("compare", "does B beat A on the same tasks? the paired difference and its p-value", commands.compare)
    compare.add_argument("a", help="the evaluation compared against")
    compare.add_argument("b", help="the evaluation compared (differences are B - A)")

    export = add("export", "write results.json, trajectory.jsonl and notebooks to a folder", commands.export_command)
    export.add_argument("id", help="the evaluation id")
    export.add_argument("--out", required=True, metavar="DIR", help="the folder to write (made if missing)")
    export.add_argument("--notebooks", action="store_true", help="also one .ipynb per task (needs nbformat)")
    export.add_argument("--files", action="store_true", help="also the files each session saved under ./output")

    keys = sub.add_parser(
        "keys",
        help="create --name N [--admin] | list | revoke ID: this service's API keys (server-side, needs Redis)",
        description="Runs `python -m gateway.keys` where the gateway's Redis is reachable (PBE_REDIS_URL).",
    )
    keys.add_argument("rest", nargs=argparse.REMAINDER, metavar="create --name N [--admin] | list | revoke ID")
    keys.set_defaults(handler=None)
    return parser


def _waiting(seconds: float, why: str) -> None:
    """Say on stderr that a call waits out a refusal (429, or 503 with Retry-After) before asking again."""
    print(f"note: {why}; asking again in {seconds:g} s", file=sys.stderr, flush=True)


def _fail(message: str, status: int) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (see the module's docstring). Never raises for the errors a
    user can cause: they are printed as one line."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.command == "keys":
            if not args.rest:
                return _fail("keys needs a command: create --name N [--admin], list or revoke ID", 2)
            return commands.keys(args)
        printer = Printer(sys.stdout)
        with GatewayClient(args.gateway, api_key=args.key or None, timeout_s=args.timeout, on_wait=_waiting) as client:
            handler: Command = args.handler
            return handler(args, client, printer)
    except GatewayError as exc:
        if exc.status == 401:
            hint = "set PBE_API_KEY (or pass --key) to an API key of this gateway"
            return _fail(f"{exc}; {hint}" if args.key else f"no API key: {hint} ({exc.detail})", 1)
        return _fail(str(exc), 1)
    except GatewayUnreachableError as exc:
        return _fail(f"{exc}; check --gateway or PBE_GATEWAY_URL, and that the gateway runs", 1)
    except CommandError as exc:
        return _fail(str(exc), exc.exit_status)
    except KeyboardInterrupt:
        return _fail("interrupted (an evaluation goes on: `pybench-eval watch ID` follows it again)", 130)
