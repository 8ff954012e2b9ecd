"""Pass rates over tasks and epochs: the estimate, its uncertainty, and the paired comparison of two runs.

The input, per task, is its outcomes over epochs: True (passed), False (failed) or None (the environment broke:
the outcome is left out of every denominator and counted beside it as ``excluded``). A task whose epochs are all
None is left out; ``tasks`` counts those with at least one graded epoch, ``samples`` their graded outcomes::

    per task i:  n_i graded epochs, c_i passed, m_i = c_i / n_i
    mean         m   = (1/n) sum_i m_i                      every task weighs the same, however many epochs survived
    SE           sqrt( sum_i (m_i - m)^2 / (n (n - 1)) )    clustered by task; None with one task
    interval     m +- t(n-1, (1 + confidence) / 2) SE       Student's t, clipped to [0, 1]
    pass@k       1 - C(n_i - c_i, k) / C(n_i, k)            at least one of k epochs passes (Chen et al. 2021)
    pass^k       C(c_i, k) / C(n_i, k)                      all k epochs pass (tau-bench, Yao et al. 2024)

pass@k and pass^k are averaged over the tasks with n_i >= k, for k = 1 .. the most graded epochs of any task.

``compare`` pairs the tasks graded on both sides and reports the mean of the per-task differences B - A with the
same clustered SE and t interval (not clipped), and a two-sided p-value: the exact McNemar test when every paired
task has one graded epoch a side, else a sign-flip permutation test of the mean difference.

References: M. Chen et al., "Evaluating Large Language Models Trained on Code", 2021 (pass@k); S. Yao et al.,
"tau-bench", 2024 (pass^k); Q. McNemar, Psychometrika 12, 1947 (the test of paired proportions, here in its exact
binomial form); E. Miller, "Adding Error Bars to Evals", 2024 (standard errors clustered by task).
"""

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_CONFIDENCE = 0.95
"""The coverage of the intervals ``estimate`` and ``compare`` report."""

DEFAULT_PERMUTATIONS = 10000
"""How many random sign flips the permutation test draws when there are too many tasks to enumerate them all."""

EXACT_PERMUTATION_TASKS = 16
"""Up to this many paired tasks the permutation test enumerates every sign pattern (2**16 of them) exactly."""

TIE_TOLERANCE = 1e-12
"""A permuted mean this close to the observed one in size counts as at least as extreme (rounding is no evidence)."""

_DECIMALS = 6


@dataclass(frozen=True)
class RateEstimate:
    """The pass rate of one run over tasks and epochs, with its uncertainty (what ``estimate`` returns)."""

    mean: float | None
    """The mean over tasks of each task's pass rate over its graded epochs; None without a graded task."""
    standard_error: float | None
    """Clustered by task; None with fewer than two graded tasks (it cannot be estimated)."""
    ci_low: float | None
    """The lower end of the t interval, clipped to [0, 1]; None when ``standard_error`` is."""
    ci_high: float | None
    """The upper end of the t interval, clipped to [0, 1]; None when ``standard_error`` is."""
    tasks: int
    """Tasks with at least one graded epoch."""
    samples: int
    """Graded outcomes (True or False) of those tasks."""
    excluded: int
    """Outcomes that were None (infrastructure failures), over every task given."""
    pass_at_k: dict[int, float]
    """k -> the mean pass@k over the tasks with at least k graded epochs."""
    pass_hat_k: dict[int, float]
    """k -> the mean pass^k over the tasks with at least k graded epochs."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values, floats rounded to 6 decimals (the keys of the k maps stay ints)."""
        return {
            "mean": _rounded(self.mean),
            "standard_error": _rounded(self.standard_error),
            "ci_low": _rounded(self.ci_low),
            "ci_high": _rounded(self.ci_high),
            "tasks": self.tasks,
            "samples": self.samples,
            "excluded": self.excluded,
            "pass_at_k": {k: round(v, _DECIMALS) for k, v in self.pass_at_k.items()},
            "pass_hat_k": {k: round(v, _DECIMALS) for k, v in self.pass_hat_k.items()},
        }


@dataclass(frozen=True)
class PairedComparison:
    """Run B against run A on the tasks both graded (what ``compare`` returns)."""

    tasks: int
    """Paired tasks: those with at least one graded epoch on both sides."""
    difference: float | None
    """The mean over paired tasks of B's pass rate minus A's; None without a paired task."""
    standard_error: float | None
    """Of ``difference``, clustered by task; None with fewer than two paired tasks."""
    ci_low: float | None
    """The lower end of the t interval of ``difference`` (not clipped); None when ``standard_error`` is."""
    ci_high: float | None
    """The upper end of the t interval of ``difference`` (not clipped); None when ``standard_error`` is."""
    p_value: float | None
    """Two-sided, of the hypothesis that A and B pass alike; None without a paired task."""
    test: str | None
    """``"mcnemar-exact"`` or ``"permutation"``; None without a paired task."""
    discordant: tuple[int, int] | None
    """For McNemar: (tasks A passed and B failed, tasks A failed and B passed); None for the permutation test."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values, floats rounded to 6 decimals, ``discordant`` as a list."""
        return {
            "tasks": self.tasks,
            "difference": _rounded(self.difference),
            "standard_error": _rounded(self.standard_error),
            "ci_low": _rounded(self.ci_low),
            "ci_high": _rounded(self.ci_high),
            "p_value": _rounded(self.p_value),
            "test": self.test,
            "discordant": list(self.discordant) if self.discordant is not None else None,
        }


@dataclass(frozen=True)
class _Tally:
    graded: int
    passed: int
    excluded: int

    @property
    def rate(self) -> float:
        return self.passed / self.graded


def estimate(outcomes: Mapping[int, Sequence[bool | None]], *, confidence: float = DEFAULT_CONFIDENCE) -> RateEstimate:
    """The pass rate over tasks and epochs, its standard error clustered by task, a t interval, pass@k and pass^k.

    See the module docstring for each formula. With no graded task every estimate is None and the k maps are
    empty; with one, the standard error and the interval are None. When every task has the same rate (all pass,
    all fail) the standard error is 0 and the interval is [mean, mean].

    Args:
        outcomes: task -> its outcomes over epochs, True (passed), False (failed), None (infrastructure failure).
        confidence: the coverage of the interval.

    Raises:
        ValueError: ``confidence`` is not strictly between 0 and 1, or an outcome is not True, False or None.
    """
    _check_confidence(confidence)
    tallies = [_tally(task, epochs) for task, epochs in outcomes.items()]
    excluded = sum(t.excluded for t in tallies)
    graded = [t for t in tallies if t.graded]
    if not graded:
        return RateEstimate(None, None, None, None, 0, 0, excluded, {}, {})
    mean, error = _mean_and_error([t.rate for t in graded])
    low, high = _interval(mean, error, len(graded), confidence)
    if low is not None and high is not None:
        low, high = max(0.0, low), min(1.0, high)
    pass_at: dict[int, float] = {}
    pass_hat: dict[int, float] = {}
    for k in range(1, max(t.graded for t in graded) + 1):
        eligible = [t for t in graded if t.graded >= k]  # a task with fewer graded epochs has no k-subset
        pass_at[k] = math.fsum(_pass_at_k(t, k) for t in eligible) / len(eligible)
        pass_hat[k] = math.fsum(_pass_hat_k(t, k) for t in eligible) / len(eligible)
    return RateEstimate(
        mean=mean,
        standard_error=error,
        ci_low=low,
        ci_high=high,
        tasks=len(graded),
        samples=sum(t.graded for t in graded),
        excluded=excluded,
        pass_at_k=pass_at,
        pass_hat_k=pass_hat,
    )


def compare(
    a: Mapping[int, Sequence[bool | None]],
    b: Mapping[int, Sequence[bool | None]],
    *,
    permutations: int = DEFAULT_PERMUTATIONS,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> PairedComparison:
    """Run B against run A, paired by task: the mean difference of pass rates, its t interval and a p-value.

    Tasks graded on one side only (absent, or all None) are left out. The test is chosen by the data:

    - every paired task has exactly one graded epoch a side: the exact two-sided McNemar test, a binomial test of
      the discordant pairs with p = 1/2: min(1, 2 sum_{i <= min(b, c)} C(b + c, i) / 2^(b + c)), 1 with none;
    - otherwise: a sign-flip permutation test of the mean per-task difference. With up to
      ``EXACT_PERMUTATION_TASKS`` tasks every sign pattern is enumerated and p = count / 2^n; with more,
      ``permutations`` patterns are drawn from ``random.Random(seed)`` and p = (1 + count) / (1 + permutations).
      A pattern counts when |its mean| >= |the observed mean| - ``TIE_TOLERANCE``.

    Args:
        a: task -> run A's outcomes over epochs (True, False, or None for an infrastructure failure).
        b: task -> run B's outcomes, the same way.
        permutations: how many sign patterns the Monte Carlo permutation test draws.
        seed: the seed of those draws (the same seed gives the same p-value).
        confidence: the coverage of the interval.

    Raises:
        ValueError: ``confidence`` is not strictly between 0 and 1, ``permutations`` is below 1, or an outcome is
            not True, False or None.
    """
    _check_confidence(confidence)
    if permutations < 1:
        raise ValueError(f"permutations must be at least 1, got {permutations}")
    tallies_a = {task: _tally(task, epochs) for task, epochs in a.items()}
    tallies_b = {task: _tally(task, epochs) for task, epochs in b.items()}
    paired = sorted(t for t, tally in tallies_a.items() if tally.graded and t in tallies_b and tallies_b[t].graded)
    if not paired:
        return PairedComparison(0, None, None, None, None, None, None, None)
    pairs = [(tallies_a[t], tallies_b[t]) for t in paired]
    differences = [tb.rate - ta.rate for ta, tb in pairs]
    difference, error = _mean_and_error(differences)
    low, high = _interval(difference, error, len(differences), confidence)
    if all(ta.graded == 1 and tb.graded == 1 for ta, tb in pairs):
        a_only = sum(1 for ta, tb in pairs if ta.passed and not tb.passed)
        b_only = sum(1 for ta, tb in pairs if tb.passed and not ta.passed)
        p_value = _mcnemar_exact(a_only, b_only)
        return PairedComparison(len(pairs), difference, error, low, high, p_value, "mcnemar-exact", (a_only, b_only))
    p_value = _sign_flip_p_value(differences, permutations, seed)
    return PairedComparison(len(pairs), difference, error, low, high, p_value, "permutation", None)


def student_t_quantile(probability: float, df: int) -> float:
    """The t with P(T <= t) = ``probability`` for Student's t distribution with ``df`` degrees of freedom.

    Found by bisection on the exact finite series of P(|T| <= t) for integer degrees of freedom (Abramowitz and
    Stegun 26.7.3 and 26.7.4, in theta = atan(t / sqrt(df))), to a relative 1e-13 in t. Each step costs O(df).

    Raises:
        ValueError: ``probability`` is not strictly between 0 and 1, or ``df`` is below 1.
    """
    if not 0.0 < probability < 1.0:
        raise ValueError(f"probability must be strictly between 0 and 1, got {probability}")
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if probability == 0.5:
        return 0.0
    if probability < 0.5:
        return -student_t_quantile(1.0 - probability, df)
    target = 2.0 * probability - 1.0  # P(|T| <= t)
    low, high = 0.0, 1.0
    while _t_central(high, df) < target and high < 1e300:  # the series reaches 1.0 long before
        low, high = high, 2.0 * high
    while high - low > 1e-13 * high:
        middle = 0.5 * (low + high)
        if _t_central(middle, df) < target:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


def _t_central(t: float, df: int) -> float:
    """P(|T| <= t) for t >= 0 and Student's t with ``df`` degrees of freedom."""
    theta = math.atan(t / math.sqrt(df))
    sin, cos = math.sin(theta), math.cos(theta)
    cos2 = cos * cos
    term = total = 1.0
    if df % 2 == 0:  # sin(theta) (1 + (1/2) cos^2 + (1 3)/(2 4) cos^4 + ... up to cos^(df - 2))
        for j in range(1, df // 2):
            term *= cos2 * (2 * j - 1) / (2 * j)
            total += term
        return sin * total
    if df == 1:
        return 2.0 * theta / math.pi
    for j in range(1, (df - 1) // 2):  # (2/pi)(theta + sin cos (1 + (2/3) cos^2 + ... up to cos^(df - 3)))
        term *= cos2 * (2 * j) / (2 * j + 1)
        total += term
    return 2.0 / math.pi * (theta + sin * cos * total)


def _tally(task: int, epochs: Sequence[bool | None]) -> _Tally:
    graded = passed = excluded = 0
    for outcome in epochs:
        if outcome is None:
            excluded += 1
        elif outcome is True or outcome is False:
            graded += 1
            passed += outcome
        else:
            raise ValueError(f"task {task}: outcome {outcome!r} is not True, False or None")
    return _Tally(graded, passed, excluded)


def _mean_and_error(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean of ``values`` and its standard error sqrt(sum (v - mean)^2 / (n (n - 1))), None when n is 1."""
    n = len(values)
    if min(values) == max(values):  # exactly 0, not a rounding residue
        return values[0], (0.0 if n > 1 else None)
    mean = math.fsum(values) / n
    if n == 1:
        return mean, None
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n * (n - 1)))


def _interval(mean: float, error: float | None, n: int, confidence: float) -> tuple[float | None, float | None]:
    if error is None:
        return None, None
    if error == 0.0:
        return mean, mean
    half = student_t_quantile((1.0 + confidence) / 2.0, n - 1) * error
    return mean - half, mean + half


def _pass_at_k(tally: _Tally, k: int) -> float:
    """1 - C(n - c, k) / C(n, k) as 1 - prod_{i = n - c + 1}^{n} (1 - k / i) (Chen et al. 2021)."""
    n, c = tally.graded, tally.passed
    if n - c < k:  # every k-subset holds a pass
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def _pass_hat_k(tally: _Tally, k: int) -> float:
    """C(c, k) / C(n, k): the chance that k epochs drawn without replacement all passed (Yao et al. 2024)."""
    return math.comb(tally.passed, k) / math.comb(tally.graded, k)


def _mcnemar_exact(a_only: int, b_only: int) -> float:
    discordant = a_only + b_only
    if discordant == 0:
        return 1.0
    tail = sum(math.comb(discordant, i) for i in range(min(a_only, b_only) + 1))
    return min(1.0, 2 * tail / (1 << discordant))


def _sign_flip_p_value(differences: Sequence[float], permutations: int, seed: int) -> float:
    n = len(differences)
    observed = abs(sum(differences)) / n - TIE_TOLERANCE
    if n <= EXACT_PERMUTATION_TASKS:
        sums = [0.0]  # the sum under every sign pattern, built one task at a time
        for d in differences:
            sums = [s + d for s in sums] + [s - d for s in sums]
        return sum(1 for s in sums if abs(s) / n >= observed) / len(sums)
    rng = random.Random(seed)
    count = 0
    for _ in range(permutations):
        signs = rng.getrandbits(n)
        total = sum(d if signs >> i & 1 else -d for i, d in enumerate(differences))
        count += abs(total) / n >= observed
    return (1 + count) / (1 + permutations)


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence}")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, _DECIMALS)
