"""Task schemas: one task of a suite, as the executor runs it and the grader checks it."""

from typing import Any

from pydantic import BaseModel, Field

PAPER_CATEGORIES = ("Chart", "Text", "Image&Audio", "Math", "Software")
"""PyBench's five reporting categories, in the paper's order."""


class TaskInput(BaseModel):
    """An input file named by a task, relative to the suite root (``./data/x.csv``)."""

    path: str
    present: bool


class Task(BaseModel):
    """One task of a suite."""

    index: int
    category1: str
    category2: str = ""
    category3: str = ""
    paper_category: str
    query: str
    inputs: list[TaskInput]
    checks: list[dict[str, Any]] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    source: dict[str, Any] = Field(default_factory=dict, exclude=True)
    """The task's record as the suite wrote it (for PyBench-compatible exports)."""

    @property
    def available(self) -> bool:
        """Whether every input file the task names is present in this copy of the suite."""
        return all(item.present for item in self.inputs)

    @property
    def missing_inputs(self) -> list[str]:
        return [item.path for item in self.inputs if not item.present]


class TaskSummary(BaseModel):
    """A task as listed by the API."""

    index: int
    paper_category: str
    category1: str
    available: bool
    missing_inputs: list[str]
