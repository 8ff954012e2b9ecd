"""Suite loading: a suite in PyBench's layout, read from a path.

The layout::

    <root>/data/meta/task.json   the tasks (index, category1..3, user, file_paths)
    <root>/data/                 their input files
    <root>/prompts/<name>.txt    system prompts; <name>.json the run settings that go with each
    <root>/checks.json           optional: per-task checks, as data
    <root>/trajectory.jsonl      optional: recorded trajectories

A task whose input file is missing is kept and marked unavailable.
"""

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from services.errors import SuiteError, TaskNotFoundError
from services.pybench.categories import paper_category
from services.task import Task, TaskInput, TaskSummary


class PromptConfig(BaseModel):
    """A suite prompt's run settings (``prompts/<name>.json``)."""

    code_start_token: str = "```python"
    code_end_token: str = "```"
    mode: str = "prompt"
    max_turns: int = 10
    sampling: dict[str, float | int] = {}


class Suite:
    """A loaded suite. Use ``load_suite`` to get one."""

    def __init__(self, name: str, root: Path, tasks: dict[int, Task]) -> None:
        self.name = name
        self.root = root
        self.tasks = tasks
        self._content_hash: str | None = None

    def task(self, index: int) -> Task:
        """Return a task by index.

        Raises:
            TaskNotFoundError: the suite has no such task.
        """
        try:
            return self.tasks[index]
        except KeyError:
            raise TaskNotFoundError(
                f"suite {self.name!r} has no task {index}; its tasks are "
                f"{min(self.tasks)}..{max(self.tasks)} ({len(self.tasks)} in all)"
            ) from None

    def input_file(self, relative: str) -> Path:
        """Return the path of an input file named relative to the suite root (``./data/x.csv``).

        Raises:
            SuiteError: the name leaves the suite folder.
        """
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise SuiteError(f"input {relative!r} is outside the suite folder {self.root}")
        return path

    def system_prompt(self, name: str) -> str:
        """Return the text of ``prompts/<name>.txt``.

        Raises:
            SuiteError: no such prompt; the message lists the prompts there are.
        """
        path = self.root / "prompts" / f"{name}.txt"
        if not path.is_file():
            raise SuiteError(f"suite {self.name!r} has no prompt {name!r}; it has: {', '.join(self.prompts())}")
        return path.read_text(encoding="utf-8")

    def prompt_config(self, name: str) -> PromptConfig:
        """Return the run settings of ``prompts/<name>.json`` (defaults when the file is absent)."""
        path = self.root / "prompts" / f"{name}.json"
        if not path.is_file():
            return PromptConfig()
        return PromptConfig.model_validate_json(path.read_text(encoding="utf-8"))

    def prompts(self) -> list[str]:
        return sorted(p.stem for p in (self.root / "prompts").glob("*.txt"))

    def content_hash(self) -> str:
        """sha256 (hex) of every task's definition and checks and of the bytes of its input files, read once per
        loaded suite: two suites with the same hash grade the same way."""
        if self._content_hash is None:
            digest = hashlib.sha256(self.name.encode())
            for index in sorted(self.tasks):
                task = self.tasks[index]
                digest.update(task.model_dump_json().encode())
                for item in task.inputs:
                    path = self.root / item.path
                    digest.update(item.path.encode())
                    if path.is_file():
                        with path.open("rb") as handle:
                            digest.update(hashlib.file_digest(handle, "sha256").digest())
            self._content_hash = digest.hexdigest()
        return self._content_hash

    def summaries(self) -> list[TaskSummary]:
        return [
            TaskSummary(
                index=t.index,
                paper_category=t.paper_category,
                category1=t.category1,
                available=t.available,
                missing_inputs=t.missing_inputs,
            )
            for t in self.tasks.values()
        ]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SuiteError(f"cannot read {path}: {exc}; is PBE_SUITE_PATH a suite in PyBench's layout?") from exc


@lru_cache(maxsize=8)
def load_suite(root: Path, name: str = "pybench") -> Suite:
    """Load the suite at ``root``.

    Raises:
        SuiteError: the task file is missing or malformed.
    """
    root = Path(root)
    raw_tasks = _read_json(root / "data" / "meta" / "task.json")
    checks_path = root / "checks.json"
    checks = {int(e["index"]): e for e in _read_json(checks_path)} if checks_path.is_file() else {}
    tasks: dict[int, Task] = {}
    try:
        for raw in raw_tasks:
            index = int(raw["index"])
            extra = checks.get(index, {})
            inputs = [TaskInput(path=p, present=(root / p).is_file()) for p in raw.get("file_paths", [])]
            tasks[index] = Task(
                index=index,
                category1=raw["category1"].replace("\n", ""),
                category2=raw.get("category2", ""),
                category3=raw.get("category3", ""),
                paper_category=paper_category(raw["category1"], raw.get("category2", "")),
                query=raw["user"],
                inputs=inputs,
                checks=extra.get("checks", []),
                notes=extra.get("notes", []),
                source=raw,
            )
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise SuiteError(f"malformed task in {root / 'data/meta/task.json'}: {exc}") from exc
    return Suite(name, root, tasks)
