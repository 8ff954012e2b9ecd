"""The manifest of a run: what an evaluation ran with (the service's version, the suite's content, its tasks, the
system prompt, sampling, limits, mode, the sandbox image, the judge), recorded once when it is accepted, and the
key that says which runs are comparable (the leaderboard ranks only runs with the same key together)."""

import functools
import hashlib
import json
import os
import subprocess
from importlib import metadata
from pathlib import Path

from services.components import SANDBOX_IMAGE, judge_prompt_key
from services.evaluation import EvaluationCreate, RunManifest
from services.suite import Suite

PACKAGE = "pybench-eval"


VERSION_VARIABLE = "PBE_SERVICE_VERSION"
"""Set in the application image at its build (``<version>+<commit>``, from ``make images``)."""

TREE = Path(__file__).resolve().parent.parent


@functools.cache
def service_version() -> str:
    """The running build, ``<version>+<commit>``: the image's ``PBE_SERVICE_VERSION`` where it was built with one;
    else the installed package's version and the checkout's commit (``+unknown`` outside a git checkout, and
    ``unknown`` alone when the package was never installed). Raises nothing."""
    built = os.environ.get(VERSION_VARIABLE, "").strip()
    if built and not built.startswith("unknown"):
        return built
    try:
        version = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown"
    return f"{version}+{_commit(TREE)}"


def _commit(tree: Path) -> str:
    """The checkout's commit (12 hex digits, ``.dirty`` with uncommitted changes), or ``unknown``."""
    try:
        head = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + (".dirty" if dirty.stdout.strip() else "")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def comparable_key(
    suite_hash: str,
    tasks: list[int],
    system_prompt_hash: str,
    mode: str,
    max_turns: int,
    budgets: dict[str, float] | None = None,
) -> str:
    """The key of runs that may be ranked together: the same suite content, tasks, prompt, mode and turn limit,
    and the same per-task budgets (runs without budgets keep the key they always had)."""
    identity: dict[str, object] = {
        "suite": suite_hash,
        "tasks": sorted(tasks),
        "prompt": system_prompt_hash,
        "mode": mode,
        "max_turns": max_turns,
    }
    if budgets:
        identity["budgets"] = budgets
    return _sha256(json.dumps(identity, sort_keys=True))[:16]


def build_manifest(body: EvaluationCreate, suite: Suite, tasks: list[int], components: dict[str, str]) -> RunManifest:
    """The manifest of a submission accepted for ``tasks`` of ``suite``; ``components``: what the workers
    advertised (``services.components.advertised``).

    Raises:
        SuiteError: the suite has no such prompt.
    """
    suite_hash = suite.content_hash()
    prompt_hash = _sha256(suite.system_prompt(body.prompt))
    judge = body.judge
    return RunManifest(
        service_version=service_version(),
        suite=suite.name,
        suite_hash=suite_hash,
        tasks_hash=_sha256(",".join(map(str, sorted(tasks)))),
        prompt=body.prompt,
        system_prompt_hash=prompt_hash,
        mode=body.mode,
        sampling=body.sampling,
        max_turns=body.max_turns,
        cell_timeout_s=body.cell_timeout_s,
        sandbox_image=components.get(SANDBOX_IMAGE),
        judge_model=judge.endpoint.model if judge else None,
        judge_mode=judge.mode if judge else None,
        judge_prompt_hash=components.get(judge_prompt_key(judge.mode)) if judge else None,
        comparable_key=comparable_key(
            suite_hash,
            tasks,
            prompt_hash,
            body.mode,
            body.max_turns,
            body.budgets.model_dump(exclude_none=True) if body.budgets else None,
        ),
    )
