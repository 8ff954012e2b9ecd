"""PyBench's scores over a list of verdicts: pass rates overall and per paper category, average turns, tokens
and cost (not the Prometheus series: those are ``services.observability.monitoring``).

Each pass rate comes twice: over every task of the evaluation, as the benchmark divides by all 143
(unavailable, ungradable and infra-failed tasks count as not passed, their counts beside it), and over the
tasks the grading could decide. Both gradings are reported: ``original`` at the top level, ``fixed`` beside.
"""

from collections.abc import Sequence
from statistics import fmean

from services.evaluation import Prices
from services.results.comparison import estimates
from services.task import PAPER_CATEGORIES
from services.verdict import (
    AgreementMatrix,
    CategoryMetrics,
    GradingMetrics,
    JudgeMetrics,
    Metrics,
    Results,
    Verdict,
    VerdictStatus,
)

_SCORED = (VerdictStatus.PASSED, VerdictStatus.FAILED)

PAPER_FAILED_TURNS = 10
"""What a failed task counts in the paper's average turns (the turn limit)."""


def _rate(passed: int, tasks: int) -> float:
    return passed / tasks if tasks else 0.0


def _grading_metrics(categories: Sequence[str], statuses: Sequence[VerdictStatus]) -> GradingMetrics:
    """The pass rates of one grading, given each task's category and status (in the same order)."""
    passed = sum(1 for s in statuses if s is VerdictStatus.PASSED)
    gradable = sum(1 for s in statuses if s in _SCORED)
    per_category: dict[str, CategoryMetrics] = {}
    for category in PAPER_CATEGORIES:
        members = [s for c, s in zip(categories, statuses, strict=True) if c == category]
        if members:
            won = sum(1 for s in members if s is VerdictStatus.PASSED)
            decided = sum(1 for s in members if s in _SCORED)
            per_category[category] = CategoryMetrics(
                tasks=len(members),
                passed=won,
                pass_rate=_rate(won, len(members)),
                gradable=decided,
                pass_rate_gradable=_rate(won, decided),
            )
    return GradingMetrics(
        tasks=len(statuses),
        passed=passed,
        pass_rate=_rate(passed, len(statuses)),
        gradable=gradable,
        pass_rate_gradable=_rate(passed, gradable),
        per_category=per_category,
        by_status={status: sum(1 for s in statuses if s is status) for status in VerdictStatus},
    )


def _agreement(verdicts: Sequence[Verdict]) -> AgreementMatrix:
    matrix = AgreementMatrix()
    for v in verdicts:
        tests = v.fixed.status if v.fixed else v.status
        if v.judgment is None or tests not in _SCORED:
            continue
        by_tests, by_judge = tests is VerdictStatus.PASSED, v.judgment.passed
        if by_tests and by_judge:
            matrix.both_passed += 1
        elif by_tests:
            matrix.tests_only += 1
        elif by_judge:
            matrix.judge_only += 1
        else:
            matrix.both_failed += 1
        if by_tests != by_judge:
            matrix.disagreeing.append(v.task_index)
    return matrix


def _judge_status(verdict: Verdict) -> VerdictStatus:
    """The judge's grade as a status: passed or failed when it decided, ungradable otherwise."""
    if verdict.judgment is None or verdict.judgment.status not in ("passed", "failed"):
        return VerdictStatus.UNGRADABLE
    return VerdictStatus.PASSED if verdict.judgment.passed else VerdictStatus.FAILED


def _judge_metrics(verdicts: Sequence[Verdict]) -> JudgeMetrics | None:
    judged = [v.judgment for v in verdicts if v.judgment is not None]
    if not judged:
        return None
    grading = _grading_metrics([v.paper_category for v in verdicts], [_judge_status(v) for v in verdicts])
    agreement = {"all": _agreement(verdicts)}
    for category in grading.per_category:
        agreement[category] = _agreement([v for v in verdicts if v.paper_category == category])
    return JudgeMetrics(
        judged=len(judged),
        passed=grading.passed,
        pass_rate=grading.pass_rate,
        unparseable=sum(1 for j in judged if j.status == "unparseable"),
        errors=sum(1 for j in judged if j.status == "error"),
        per_category=grading.per_category,
        agreement=agreement,
    )


def _passed_for_turns(verdict: Verdict) -> bool:
    """Whether a task counts as passed in the paper's average turns: by the judge when there is one."""
    if verdict.judgment is not None:
        return verdict.judgment.passed
    return verdict.status is VerdictStatus.PASSED


def compute_metrics(verdicts: list[Verdict], prices: Prices | None = None) -> Metrics:
    """Return the metrics of ``verdicts`` (one per task); an empty list gives zeros. With ``prices``, the cost of
    the tokens the sessions used."""
    categories = [v.paper_category for v in verdicts]
    original = _grading_metrics(categories, [v.status for v in verdicts])
    fixed = _grading_metrics(categories, [v.fixed.status if v.fixed else v.status for v in verdicts])
    scored = [v for v in verdicts if v.status in _SCORED]
    paper_turns = [v.turns if _passed_for_turns(v) else PAPER_FAILED_TURNS for v in scored]
    prompt_tokens = sum(v.prompt_tokens or 0 for v in verdicts)
    completion_tokens = sum(v.completion_tokens or 0 for v in verdicts)
    return Metrics(
        **original.model_dump(exclude={"per_category"}),
        per_category=original.per_category,
        avg_turns=fmean(v.turns for v in scored) if scored else 0.0,
        avg_turns_paper=fmean(paper_turns) if paper_turns else 0.0,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cost_usd=prices.cost_usd(prompt_tokens, completion_tokens) if prices else None,
        model_calls_saved=sum(v.replayed_turns for v in verdicts),
        tokens_saved=sum(v.replayed_tokens for v in verdicts),
        fixed=fixed,
        llm=_judge_metrics(verdicts),
    )


def build_results(evaluation_id: str, verdicts: list[Verdict], complete: bool, prices: Prices | None = None) -> Results:
    """Return the results document of an evaluation: its verdicts (by task) and their metrics (with their cost at
    ``prices``, the submission's)."""
    ordered = sorted(verdicts, key=lambda v: v.task_index)
    return Results(
        evaluation_id=evaluation_id,
        complete=complete,
        verdicts=ordered,
        metrics=compute_metrics(ordered, prices),
        statistics=estimates([ordered]),
    )
