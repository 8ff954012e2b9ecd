"""The statistics of pass rates, checked against hand-worked values and brute force written here independently."""

import itertools
import json
import math
import random
import statistics
from collections.abc import Mapping, Sequence

import pytest

from services.results.estimates import compare, estimate, student_t_quantile

Outcomes = Mapping[int, Sequence[bool | None]]
Table = dict[int, list[bool | None]]

T, F, X = True, False, None  # passed, failed, infrastructure failure


def graded(epochs: Sequence[bool | None]) -> list[bool]:
    return [o for o in epochs if o is not None]


def brute_pass_k(outcomes: Outcomes, k: int, *, every: bool) -> float:
    """pass@k (``every`` False) or pass^k (True) by enumerating each task's k-subsets of graded samples."""
    per_task = []
    for epochs in outcomes.values():
        samples = graded(epochs)
        if len(samples) < k:
            continue
        subsets = list(itertools.combinations(samples, k))
        hits = sum(1 for s in subsets if (all(s) if every else any(s)))
        per_task.append(hits / len(subsets))
    return sum(per_task) / len(per_task)


def brute_sign_flip(differences: Sequence[float]) -> float:
    """The exact sign-flip p-value by listing every sign pattern."""
    n = len(differences)
    observed = abs(sum(differences) / n)
    patterns = list(itertools.product((1, -1), repeat=n))
    extreme = sum(
        1
        for signs in patterns
        if abs(sum(s * d for s, d in zip(signs, differences, strict=True)) / n) >= observed - 1e-12
    )
    return extreme / len(patterns)


def brute_mcnemar(a_only: int, b_only: int) -> float:
    """Two-sided binomial test with p = 1/2: every split of the discordant pairs at least as far from even."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    far = abs(a_only - n / 2)
    return min(1.0, sum(math.comb(n, i) for i in range(n + 1) if abs(i - n / 2) >= far) / 2.0**n)


def rates(outcomes: Outcomes) -> dict[int, float]:
    return {task: graded(e).count(True) / len(graded(e)) for task, e in outcomes.items() if graded(e)}


# --- Student's t ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("df", "tabled"),
    [(1, 12.706205), (2, 4.302653), (5, 2.570582), (10, 2.228139), (30, 2.042272), (120, 1.979930)],
)
def test_the_t_quantile_matches_the_tables(df: int, tabled: float) -> None:
    assert student_t_quantile(0.975, df) == pytest.approx(tabled, abs=1e-6)
    assert student_t_quantile(0.025, df) == pytest.approx(-tabled, abs=1e-6)


def test_the_t_quantile_at_other_levels_and_its_approach_to_the_normal() -> None:
    assert student_t_quantile(0.995, 2) == pytest.approx(9.924843, abs=1e-6)  # tabled
    assert student_t_quantile(0.95, 4) == pytest.approx(2.131847, abs=1e-6)  # tabled
    assert student_t_quantile(0.5, 7) == 0.0
    dfs = [120, 1000, 10000]
    quantiles = [student_t_quantile(0.975, df) for df in dfs]
    assert quantiles == sorted(quantiles, reverse=True)
    # z + (z^3 + z) / (4 df): the first term of the expansion of t around the normal quantile z = 1.959964
    assert quantiles[-1] == pytest.approx(1.959964 + (1.959964**3 + 1.959964) / 40000, abs=1e-6)
    assert quantiles[-1] - 1.959964 < 3e-4


@pytest.mark.parametrize(("probability", "df"), [(0.0, 3), (1.0, 3), (0.975, 0)])
def test_the_t_quantile_refuses_what_it_cannot_compute(probability: float, df: int) -> None:
    with pytest.raises(ValueError):
        student_t_quantile(probability, df)


# --- estimate ---------------------------------------------------------------------------------------------------


def test_all_pass_is_one_with_no_spread() -> None:
    result = estimate({1: [T, T, T], 2: [T, T], 3: [T, T, T]})
    assert (result.mean, result.standard_error, result.ci_low, result.ci_high) == (1.0, 0.0, 1.0, 1.0)
    assert (result.tasks, result.samples, result.excluded) == (3, 8, 0)
    assert result.pass_at_k == {1: 1.0, 2: 1.0, 3: 1.0}
    assert result.pass_hat_k == {1: 1.0, 2: 1.0, 3: 1.0}


def test_all_fail_is_zero_with_no_spread() -> None:
    result = estimate({1: [F, F], 2: [F, F], 3: [F, X]})
    assert (result.mean, result.standard_error, result.ci_low, result.ci_high) == (0.0, 0.0, 0.0, 0.0)
    assert (result.tasks, result.samples, result.excluded) == (3, 5, 1)
    assert result.pass_at_k == {1: 0.0, 2: 0.0}
    assert result.pass_hat_k == {1: 0.0, 2: 0.0}


def test_one_task_has_no_standard_error() -> None:
    result = estimate({4: [T, F, F, T]})
    assert result.mean == 0.5
    assert (result.standard_error, result.ci_low, result.ci_high) == (None, None, None)
    assert result.tasks == 1
    assert result.pass_at_k[2] == pytest.approx(1 - 1 / 6)  # of the 6 pairs only (F, F) has no pass
    assert result.pass_hat_k[2] == pytest.approx(1 / 6)  # only (T, T) is all passes


def test_nothing_graded_is_nothing_estimated() -> None:
    for outcomes in ({}, {1: [X, X], 2: []}):
        result = estimate(outcomes)
        assert (result.mean, result.standard_error, result.ci_low, result.ci_high) == (None, None, None, None)
        assert (result.tasks, result.samples) == (0, 0)
        assert (result.pass_at_k, result.pass_hat_k) == ({}, {})
    assert estimate({1: [X, X], 2: []}).excluded == 2


def test_the_clustered_standard_error_of_a_hand_worked_table() -> None:
    # task | outcomes        | n | c | m_i  | m_i - m | (m_i - m)^2
    #   1  | T F             | 2 | 1 | 1/2  |  -1/12  |   1/144
    #   2  | T T T F         | 4 | 3 | 3/4  |  +2/12  |   4/144
    #   3  | F T None None   | 2 | 1 | 1/2  |  -1/12  |   1/144
    # m = (1/2 + 3/4 + 1/2) / 3 = 7/12 (pooled over samples it would be 5/8: each task weighs the same instead)
    # SE = sqrt( (6/144) / (3 * 2) ) = sqrt(1/144) = 1/12
    # interval = 7/12 -+ t(2, 0.975) / 12 = (7 -+ 4.302653) / 12 = [0.224779, 0.941888]
    result = estimate({1: [T, F], 2: [T, T, T, F], 3: [F, T, X, X]})
    assert result.mean == pytest.approx(7 / 12)
    assert result.standard_error == pytest.approx(1 / 12)
    assert result.ci_low == pytest.approx(0.224779, abs=1e-6)
    assert result.ci_high == pytest.approx(0.941888, abs=1e-6)
    assert (result.tasks, result.samples, result.excluded) == (3, 8, 2)


def test_the_interval_is_clipped_to_zero_and_one_and_follows_the_confidence() -> None:
    # m_i = 1, 1/2, 0: m = 1/2, SE = sqrt((1/4 + 0 + 1/4) / 6) = sqrt(1/12); 4.302653 * 0.288675 > 1/2
    outcomes = {1: [T, T], 2: [T, F], 3: [F, F]}
    result = estimate(outcomes)
    assert result.standard_error == pytest.approx(math.sqrt(1 / 12))
    assert (result.ci_low, result.ci_high) == (0.0, 1.0)
    # 7/12 -+ t(2, 0.995) / 12 with t(2, 0.995) = 9.924843: both ends beyond [0, 1]
    wide = estimate({1: [T, F], 2: [T, T, T, F], 3: [F, T]}, confidence=0.99)
    assert (wide.ci_low, wide.ci_high) == (0.0, 1.0)
    # 7/12 -+ t(2, 0.8) / 12 with t(2, 0.8) = 1.885618
    narrow = estimate({1: [T, F], 2: [T, T, T, F], 3: [F, T]}, confidence=0.8)
    assert narrow.ci_low == pytest.approx((7 - 1.885618) / 12, abs=1e-6)
    assert narrow.ci_high == pytest.approx((7 + 1.885618) / 12, abs=1e-6)


def test_infrastructure_failures_leave_the_denominator_and_are_counted() -> None:
    outcomes: Table = {1: [T, X, F], 2: [X, X], 3: [T, T, T], 4: [X, F, X, X]}
    result = estimate(outcomes)
    # task 2 has no graded epoch and is left out; task 1 is 1 of 2, task 3 is 3 of 3, task 4 is 0 of 1
    assert (result.tasks, result.samples, result.excluded) == (3, 6, 6)
    assert result.mean == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert result.standard_error == pytest.approx(statistics.stdev([0.5, 1.0, 0.0]) / math.sqrt(3))
    # k = 1: all three tasks; k = 2: tasks 1 (n = 2) and 3; k = 3: task 3 alone
    assert result.pass_at_k == pytest.approx({1: 0.5, 2: 1.0, 3: 1.0})
    assert result.pass_hat_k == pytest.approx({1: 0.5, 2: 0.5, 3: 1.0})


def test_pass_at_k_and_pass_hat_k_agree_with_enumerating_subsets() -> None:
    outcomes: Table = {
        1: [T, F, F, T, F, X, F],  # 6 graded, 2 passed
        2: [F, F, F, F, F],  # never passes
        3: [T, T, F, T],  # 4 graded: left out from k = 5
        4: [T, X, X],  # 1 graded: left out from k = 2
        5: [F, T, F, F, F, F, F, F],  # 8 graded, 1 passed: alone at k = 7 and 8
        6: [T, T, T, T, T, F],
    }
    result = estimate(outcomes)
    assert sorted(result.pass_at_k) == sorted(result.pass_hat_k) == list(range(1, 9))
    for k in range(1, 9):
        assert result.pass_at_k[k] == pytest.approx(brute_pass_k(outcomes, k, every=False), abs=1e-12), k
        assert result.pass_hat_k[k] == pytest.approx(brute_pass_k(outcomes, k, every=True), abs=1e-12), k
    assert result.pass_at_k[1] == pytest.approx(result.mean)
    assert result.pass_at_k[8] == pytest.approx(1.0) and result.pass_hat_k[8] == 0.0  # task 5 alone


def test_the_estimate_as_a_dict_is_json_and_rounded() -> None:
    result = estimate({1: [T, F, F], 2: [T, T, F], 3: [T, X]})
    data = result.as_dict()
    # pass^2: task 1 has 0 of its 3 pairs all passed, task 2 has 1 of 3, task 3 (one sample) is left out
    assert json.loads(json.dumps(data))["pass_hat_k"] == {"1": 0.666667, "2": 0.166667, "3": 0.0}
    # pass@2: 2 of task 1's 3 pairs hold a pass, all of task 2's
    assert data["pass_at_k"] == {1: 0.666667, 2: 0.833333, 3: 1.0}
    assert data["mean"] == 0.666667 and data["standard_error"] == round(result.standard_error or 0, 6)
    assert (data["tasks"], data["samples"], data["excluded"]) == (3, 7, 1)


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.5, 95.0, math.nan])
def test_a_confidence_outside_zero_and_one_is_refused(confidence: float) -> None:
    with pytest.raises(ValueError, match="confidence"):
        estimate({1: [T]}, confidence=confidence)
    with pytest.raises(ValueError, match="confidence"):
        compare({1: [T]}, {1: [F]}, confidence=confidence)


def test_an_outcome_that_is_not_a_verdict_is_refused() -> None:
    with pytest.raises(ValueError, match="task 3"):
        estimate({1: [T], 3: [T, 1]})  # type: ignore[list-item]


# --- compare ----------------------------------------------------------------------------------------------------


def test_mcnemar_without_discordant_pairs_is_p_one() -> None:
    a: Table = {1: [T], 2: [F], 3: [T, X], 4: [F]}
    result = compare(a, {1: [T], 2: [F], 3: [X, T], 4: [F]})
    assert (result.test, result.discordant, result.p_value) == ("mcnemar-exact", (0, 0), 1.0)
    assert (result.tasks, result.difference, result.standard_error) == (4, 0.0, 0.0)
    assert (result.ci_low, result.ci_high) == (0.0, 0.0)


def test_mcnemar_of_one_against_nine_discordant_pairs() -> None:
    # A passed task 0 and B failed it; B passed tasks 1..9 and A failed them; both passed 10 and failed 11
    a = {0: [T]} | {t: [F] for t in range(1, 10)} | {10: [T], 11: [F]}
    b = {0: [F]} | {t: [T] for t in range(1, 10)} | {10: [T], 11: [F]}
    result = compare(a, b)
    assert result.test == "mcnemar-exact"
    assert result.discordant == (1, 9)
    assert result.p_value == 2 * (1 + 10) / 1024 == 0.021484375
    assert result.p_value == brute_mcnemar(1, 9)
    assert result.tasks == 12
    assert result.difference == pytest.approx((9 - 1) / 12)
    differences = [-1.0] + [1.0] * 9 + [0.0, 0.0]
    assert result.standard_error == pytest.approx(statistics.stdev(differences) / math.sqrt(12))
    half = 2.200985 * statistics.stdev(differences) / math.sqrt(12)  # t(11, 0.975) = 2.200985, tabled
    assert result.ci_low == pytest.approx(8 / 12 - half, abs=1e-6)
    assert result.ci_high == pytest.approx(8 / 12 + half, abs=1e-6)


@pytest.mark.parametrize(("a_only", "b_only"), [(0, 1), (3, 0), (2, 2), (4, 7), (13, 5)])
def test_mcnemar_agrees_with_summing_binomials(a_only: int, b_only: int) -> None:
    a = {t: [T] for t in range(a_only)} | {100 + t: [F] for t in range(b_only)} | {200: [T], 201: [F]}
    b = {t: [F] for t in range(a_only)} | {100 + t: [T] for t in range(b_only)} | {200: [T], 201: [F]}
    result = compare(a, b)
    assert result.discordant == (a_only, b_only)
    assert result.p_value == pytest.approx(brute_mcnemar(a_only, b_only), abs=1e-15)
    if a_only == b_only:
        assert result.p_value == 1.0  # 2 * (1 + 4 + 6) / 16 is capped


def test_the_permutation_test_enumerates_every_sign_pattern() -> None:
    a: Table = {1: [T, F], 2: [F, F], 3: [T, T], 4: [F, F, X], 5: [T, F, F, F], 6: [T], 8: [T]}
    b: Table = {1: [T, T], 2: [T, F], 3: [T, T], 4: [T, T], 5: [T, T, F, F], 7: [T], 8: [X, X]}
    # differences of tasks 1..5 (6, 7 and 8 are graded on one side only): 1/2, 1/2, 0, 1, 1/4, sum 9/4. Of the 2^5
    # patterns only all-plus and all-minus (each with either sign of the 0) reach |sum| >= 9/4: p = 4/32
    result = compare(a, b)
    assert (result.test, result.discordant, result.tasks) == ("permutation", None, 5)
    assert result.p_value == 0.125
    differences = [0.5, 0.5, 0.0, 1.0, 0.25]
    assert result.p_value == brute_sign_flip(differences)
    assert result.difference == pytest.approx(0.45)
    assert result.standard_error == pytest.approx(statistics.stdev(differences) / math.sqrt(5))
    half = 2.776445 * statistics.stdev(differences) / math.sqrt(5)  # t(4, 0.975) = 2.776445, tabled
    assert result.ci_low == pytest.approx(0.45 - half, abs=1e-6)
    assert result.ci_high == pytest.approx(0.45 + half, abs=1e-6)


def test_the_exact_permutation_test_on_thirds_with_ties_and_both_signs() -> None:
    rng = random.Random(11)
    a = {t: [rng.random() < 0.4 for _ in range(3)] for t in range(12)}
    b = {t: [rng.random() < 0.6 for _ in range(3)] for t in range(12)}
    result = compare(a, b)
    ra, rb = rates(a), rates(b)
    differences = [rb[t] - ra[t] for t in sorted(ra)]
    assert len({abs(d) for d in differences}) < len(differences)  # equal sizes: patterns tie with the observed
    assert result.test == "permutation" and result.tasks == 12
    assert result.p_value == pytest.approx(brute_sign_flip(differences), abs=1e-15)
    assert result.difference == pytest.approx(statistics.fmean(differences))


def test_the_monte_carlo_permutation_test_is_seeded_and_near_the_exact_value() -> None:
    rng = random.Random(5)
    a = {t: [rng.random() < 0.45 for _ in range(4)] for t in range(20)}
    b = {t: [rng.random() < 0.6 for _ in range(4)] for t in range(20)}
    first = compare(a, b, permutations=4000, seed=3)
    assert first == compare(a, b, permutations=4000, seed=3)
    assert first.test == "permutation" and first.tasks == 20
    assert first.p_value is not None
    assert (first.p_value * 4001) == pytest.approx(round(first.p_value * 4001))  # (1 + count) / (1 + draws)
    # the exact value over all 2^20 patterns, by sums built one task at a time
    ra, rb = rates(a), rates(b)
    differences = [rb[t] - ra[t] for t in sorted(ra)]
    sums = [0.0]
    for d in differences:
        sums = [s + d for s in sums] + [s - d for s in sums]
    exact = sum(1 for s in sums if abs(s) >= abs(sum(differences)) - 20e-12) / len(sums)
    assert 0.01 < exact < 0.5  # a p-value the draws can miss
    assert first.p_value == pytest.approx(exact, abs=4 * math.sqrt(exact * (1 - exact) / 4000) + 1 / 4000)
    once = compare(a, b, permutations=1, seed=0)
    assert once.p_value in (0.5, 1.0)


def test_one_graded_epoch_on_one_side_only_is_a_permutation_test() -> None:
    a = {t: [t % 2 == 0] for t in range(6)}
    b = {t: [T, F] for t in range(6)}  # B's rates are 1/2: differences -1/2 (A passed) and +1/2 (A failed)
    result = compare(a, b)
    assert (result.test, result.discordant, result.tasks, result.difference) == ("permutation", None, 6, 0.0)
    assert result.p_value == 1.0


def test_no_paired_task_is_nothing_compared() -> None:
    result = compare({1: [T], 2: [X]}, {2: [T], 3: [F]})
    assert result.as_dict() == {
        "tasks": 0,
        "difference": None,
        "standard_error": None,
        "ci_low": None,
        "ci_high": None,
        "p_value": None,
        "test": None,
        "discordant": None,
    }


def test_one_paired_task_has_a_p_value_but_no_interval() -> None:
    result = compare({1: [F, F]}, {1: [T, T], 2: [T]})
    assert (result.tasks, result.difference, result.test) == (1, 1.0, "permutation")
    assert (result.standard_error, result.ci_low, result.ci_high) == (None, None, None)
    assert result.p_value == 1.0  # the 2 patterns: +1 and -1, both as extreme


def test_the_comparison_as_a_dict_is_json_and_rounded() -> None:
    a = {t: [T] for t in range(3)} | {t: [F] for t in range(3, 7)}
    b = {t: [F] for t in range(3)} | {t: [T] for t in range(3, 7)}
    data = compare(a, b).as_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["discordant"] == [3, 4] and data["difference"] == round(1 / 7, 6)
    assert data["p_value"] == 1.0  # 2 * (1 + 7 + 21 + 35) / 128


def test_fewer_than_one_permutation_is_refused() -> None:
    with pytest.raises(ValueError, match="permutations"):
        compare({1: [T]}, {1: [F]}, permutations=0)
