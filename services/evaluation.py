"""Evaluation schemas: what a user submits, and what the service keeps and shows.

One schema per direction: ``EvaluationCreate`` comes in (it may carry a secret API key), ``Evaluation`` is
stored and returned (it never carries the key).
"""

from datetime import UTC, datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

DEFAULT_MAX_TURNS = 10
"""PyBench's turn limit: at most ten assistant turns per task."""

DEFAULT_CELL_TIMEOUT_S = 120.0
"""Seconds a single code cell may run before the kernel is interrupted."""

DEFAULT_MAX_CONCURRENCY = 16
"""How many sessions of one evaluation may run, and so call its endpoint, at once across all executors, unless
the submission says otherwise (PyBench's own harness runs 16 at once)."""

MAX_CONCURRENCY_LIMIT = 256
"""The most ``max_concurrency`` a submission may ask for."""

MAX_EPOCHS = 10
"""The most epochs one submission may ask for."""

DEFAULT_PROMPT = "llama3"
"""The suite prompt for served open models: code between <|execute_start|> and <|execute_end|>."""


class Sampling(BaseModel):
    """Sampling parameters sent with every chat completion; unset fields take the suite prompt's defaults."""

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1, le=32768)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    """Sent to endpoints that accept one (vLLM, llama.cpp, OpenAI), for runs that can be repeated; each epoch of
    a run gets its own (``services.results.epochs``)."""


class Budgets(BaseModel):
    """Per-task limits a session stops at, each with its own end reason (graded as the session stands)."""

    model_config = {"extra": "forbid"}

    max_tokens_per_task: int | None = Field(
        default=None, ge=1, le=100_000_000, description="prompt and completion tokens of one session, in all"
    )
    max_seconds_per_task: float | None = Field(
        default=None, gt=0, le=86_400, description="seconds of one session, from its first model call"
    )
    max_cost_usd: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        description="USD the evaluation may spend on model calls at its prices (prices required), over all its "
        "sessions: once reached, every session stops before its next turn (cost_budget). Sessions run at once, so "
        "the spend may pass it by the calls in flight.",
    )


class Prices(BaseModel):
    """What the endpoint charges, in USD per million tokens: the results then show what the evaluation cost."""

    model_config = {"extra": "forbid"}

    input_per_million: float = Field(ge=0, le=10_000, description="USD per million prompt tokens")
    output_per_million: float = Field(ge=0, le=10_000, description="USD per million completion tokens")

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_million + completion_tokens * self.output_per_million) / 1e6


BASE_URL_PATTERN = (
    r"^https?://([A-Za-z0-9]([A-Za-z0-9.-]{0,250}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])"
    r"(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?"
    r"(/[A-Za-z0-9._~/-]*)?$"
)
"""An http(s) URL with a host name, an IPv4 address or a bracketed IPv6 address (no zone), an optional port and
a plain path (no credentials, query or fragment). Which addresses may be called is the egress guard's decision
(``services.endpoint.netguard``), made before any connection."""


class ModelEndpoint(BaseModel):
    """An OpenAI-compatible chat-completions endpoint."""

    base_url: str = Field(examples=["http://127.0.0.1:8000/v1"], max_length=2048, pattern=BASE_URL_PATTERN)
    model: str = Field(min_length=1, max_length=256, examples=["Qwen2.5-7B-Instruct"])

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("base_url must be an http:// or https:// URL, e.g. http://127.0.0.1:8000/v1")
        return value.rstrip("/")


class JudgeConfig(BaseModel):
    """The LLM judge of an evaluation: an OpenAI-compatible endpoint, and how it judges."""

    model_config = {"extra": "forbid"}

    endpoint: ModelEndpoint
    mode: Literal["absolute", "pairwise"] = Field(
        default="absolute",
        description="absolute: does the trajectory fulfil the query? pairwise: PyBench's comparison with the "
        "suite's recorded trajectory of the task.",
    )


class EvaluationCreate(BaseModel):
    """The body of ``POST /v1/evaluations``."""

    model_config = {
        "extra": "forbid",
        # The cost limit's rule (``_cost_needs_prices``) in the schema too, so clients and fuzzers know it.
        "json_schema_extra": {
            "if": {
                "properties": {
                    "budgets": {
                        "type": "object",
                        "properties": {"max_cost_usd": {"type": "number"}},
                        "required": ["max_cost_usd"],
                    }
                },
                "required": ["budgets"],
            },
            "then": {"properties": {"prices": {"type": "object"}}, "required": ["prices"]},
        },
    }

    model: ModelEndpoint
    api_key: SecretStr | None = Field(default=None, description="Sent as a bearer token; never stored in clear.")
    suite: str = Field(default="pybench", pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    tasks: list[int] | None = Field(default=None, description="Task indices; all tasks when omitted.")
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=1, le=30)
    cell_timeout_s: float = Field(default=DEFAULT_CELL_TIMEOUT_S, gt=0, le=3600)
    prompt: str = Field(default=DEFAULT_PROMPT, pattern=r"^[a-z0-9_]{1,64}$")
    mode: Literal["pybench", "tools"] = Field(
        default="pybench",
        description="pybench: code read from the reply's text, as the benchmark; tools: an execute_python tool "
        "over the OpenAI tools API, for models that prefer native tool calling.",
    )
    sampling: Sampling = Field(default_factory=Sampling)
    judge: JudgeConfig | None = Field(default=None, description="An LLM judge besides the unit tests (optional).")
    preflight: bool = Field(
        default=True,
        description="Check the endpoint first: it answers, serves the model, and replies to a canary prompt with "
        "code in the prompt's format; the evaluation is refused otherwise.",
    )
    judge_api_key: SecretStr | None = Field(
        default=None, description="The judge's bearer token; never stored in clear."
    )
    prices: Prices | None = Field(default=None, description="USD per million tokens, for the results' cost.")
    budgets: Budgets | None = Field(
        default=None,
        description="Per-task limits on tokens and wall time, and a cost limit per evaluation: a session past one "
        "stops before its next turn, ending token_budget, time_budget or cost_budget, and is graded as it stands.",
    )
    reply_cache: bool = Field(
        default=False,
        description="Keep the model's replies by what was asked (endpoint, model, messages, sampling with the seed, "
        "epoch): a session run again after an infrastructure failure replays the replies it had, runs their cells "
        "again in its fresh sandbox, and calls the model only for the turns that remain. Only for endpoints that "
        "answer the same request the same way (greedy decoding, or a seed they honour).",
    )
    epochs: int = Field(
        default=1,
        ge=1,
        le=MAX_EPOCHS,
        description="Independent runs of every task (each its own sessions, sandbox and attempts, each graded), as "
        "evaluations of one run; their statistics (mean over epochs, clustered standard error, pass@k, pass^k) are "
        "at GET /v1/evaluations/{id}/epochs. Each epoch gets its own sampling seed, derived from the run and the "
        "epoch (or from sampling.seed when given), and a share of max_concurrency.",
    )
    max_concurrency: int = Field(
        default=DEFAULT_MAX_CONCURRENCY,
        ge=1,
        le=MAX_CONCURRENCY_LIMIT,
        description="How many of this evaluation's sessions may run, and so call the endpoint, at once across all "
        "executors: a GPU server's batch size, or what a rate-limited API allows. Other evaluations share the "
        "executors with it fairly.",
    )

    @model_validator(mode="after")
    def _cost_needs_prices(self) -> "EvaluationCreate":
        if self.budgets is not None and self.budgets.max_cost_usd is not None and self.prices is None:
            raise ValueError(
                "budgets.max_cost_usd needs prices (USD per million prompt and completion tokens) to count the cost"
            )
        return self

    @field_validator("tasks")
    @classmethod
    def _unique_tasks(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("tasks must name at least one task, or be omitted for all tasks")
        if len(set(value)) != len(value):
            raise ValueError("tasks must not repeat an index")
        return value


class EvaluationStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


class TaskState(StrEnum):
    """Where one task of an evaluation stands."""

    QUEUED = "queued"
    RUNNING = "running"
    GRADING = "grading"
    DONE = "done"
    UNAVAILABLE = "unavailable"
    CANCELLED = "cancelled"
    """The evaluation was cancelled before the task's session started or finished (a running session stops
    before its next turn); it has no verdict."""

    @property
    def finished(self) -> bool:
        return self in (TaskState.DONE, TaskState.UNAVAILABLE, TaskState.CANCELLED)


class GradingRecord(BaseModel):
    """One grading of an evaluation, as its manifest lists it: grading 1 when the evaluation is accepted, one more
    per ``POST .../regrade`` (``services.results.manifest``). What graded it is filled in from its verdicts once the
    evaluation completes under it."""

    grading: int = Field(description="Its number: 1 for the grading of the sessions as they ended, then 2, 3, ...")
    started_at: datetime = Field(
        description="When it started: the evaluation's acceptance for grading 1, the regrade request for later ones."
    )
    graded: list[Literal["checks", "judge"]] = Field(
        description="What it graded: the checks (both gradings, original and fixed) always, and the LLM judge's "
        "judgment when the evaluation had a judge for it."
    )
    judge_model: str | None = Field(default=None, description="The judge's model for this grading; None without one.")
    grader_versions: list[str] = Field(
        default_factory=list,
        description="The service versions (<version>+<commit>) of the grader builds that graded its verdicts: one, "
        "unless graders were upgraded while it ran; empty until the evaluation completes under it.",
    )
    checks_hashes: list[str] = Field(
        default_factory=list,
        description="The checks hashes its verdicts were graded with (Verdict.checks_hash: sha256 of the check "
        "code's version and every task's checks as the grader applies them); empty until it completes.",
    )
    comparable_key: str | None = Field(
        default=None,
        description="The evaluation's comparable key when it completed under this grading (it changes only when "
        "the checks did); None until then.",
    )


class RunManifest(BaseModel):
    """What an evaluation ran with, so that two runs can be told comparable or not (made by
    ``services.results.manifest.build_manifest`` when the evaluation is accepted). Hashes are sha256 in hex."""

    service_version: str
    suite: str
    suite_hash: str
    """Of the suite's tasks, their checks and the bytes of their input files."""
    tasks_hash: str
    """Of the sorted task indices the evaluation runs."""
    prompt: str
    system_prompt_hash: str
    mode: str
    sampling: Sampling
    max_turns: int
    cell_timeout_s: float
    sandbox_image: str | None = None
    """The session sandboxes' image as the executors advertised it (``name@sha256:...`` where the backend knows
    its digest); None when no executor had advertised one yet."""
    judge_model: str | None = None
    judge_mode: str | None = None
    judge_prompt_hash: str | None = None
    """As the graders advertised it for that mode; None without a judge, or before any grader advertised."""
    comparable_key: str
    """Runs with the same key ran the same suite version, the same tasks, prompt, mode and turn limit, and their
    current verdicts were graded with the same checks: only they are ranked together. Set at submission; a grading
    graded with checks other than the baseline's changes it (``services.results.manifest.graded_key``)."""
    base_key: str | None = Field(
        default=None,
        description="The comparable key as submitted, before any grading's checks entered it (None in manifests "
        "recorded before gradings were: their comparable_key is still the submitted one).",
    )
    gradings: list[GradingRecord] = Field(
        default_factory=list,
        description="Every grading of the evaluation, oldest first (empty in manifests recorded before gradings "
        "were; those list only the regrades made since).",
    )


class Evaluation(BaseModel):
    """An accepted evaluation as stored and shown; it never holds the API key."""

    id: str
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    owner: str = ""
    """The id of the API key that submitted it (``admin`` for the operator's bootstrap key)."""
    model: ModelEndpoint
    has_api_key: bool = False
    suite: str
    tasks: list[int]
    unavailable_tasks: list[int] = Field(default_factory=list)
    max_turns: int
    cell_timeout_s: float
    prompt: str
    mode: Literal["pybench", "tools"] = "pybench"
    sampling: Sampling
    judge: JudgeConfig | None = None
    has_judge_api_key: bool = False
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    budgets: Budgets | None = None
    reply_cache: bool = False
    """Its sessions keep and replay the model's replies (``services.live.replies``)."""
    grading: int = 1
    """How many times it was graded: 1, then one more per ``POST .../regrade``."""
    run_id: str | None = None
    """The run this evaluation is an epoch of (its first epoch's id); None for a run of one epoch."""
    epoch: int = 1
    epochs: int = 1
    """How many epochs its run has."""
    """At most this many of its sessions run at once (``services.live.admission``)."""
    prices: Prices | None = None
    manifest: RunManifest | None = None
    """What the run ran with, recorded at submission (``services.results.manifest``); None in evaluations stored before
    manifests were recorded."""


class Progress(BaseModel):
    """How many tasks of an evaluation are in each state."""

    total: int
    counts: dict[TaskState, int]

    @property
    def finished(self) -> int:
        return sum(n for state, n in self.counts.items() if state.finished)

    @property
    def complete(self) -> bool:
        """Every task is finished (done, unavailable or cancelled): the evaluation's results are final."""
        return self.finished == self.total


class EvaluationView(BaseModel):
    """The answer of ``GET /v1/evaluations/{id}``."""

    evaluation: Evaluation
    status: EvaluationStatus
    progress: Progress


class EvaluationPage(BaseModel):
    """One page of ``GET /v1/evaluations``, newest first."""

    items: list[EvaluationView]
    next_cursor: str | None = None
    """Pass as ``cursor`` for the next page; None on the last page."""
