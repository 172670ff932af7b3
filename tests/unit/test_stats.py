"""Fault statistics against the worked numbers in shared/reference/load-and-soak.md (checked with scipy)."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import InputError
from stackproof.cli import main
from verify.load.stats import clean_questions_needed, compare_arms, fault_stats, parse_rate

P0 = 1 / 450


def test_a_clean_917_question_run_is_luck_13_percent_of_the_time() -> None:
    assert fault_stats(P0, 917).p_luck == pytest.approx(0.13, abs=0.001)
    # 815 questions at 1/400 and 1,019 at 1/500 give the same 13%.
    assert fault_stats(1 / 400, 815).p_luck == pytest.approx(0.13, abs=0.002)
    assert fault_stats(1 / 500, 1019).p_luck == pytest.approx(0.13, abs=0.002)


def test_clean_questions_needed_to_claim_a_fix() -> None:
    assert clean_questions_needed(P0, 0.95) == 1347  # about 3/p0, the rule of three
    assert clean_questions_needed(1 / 400, 0.95) == 1197 and clean_questions_needed(1 / 500, 0.95) == 1497
    # ln(0.01)/ln(1-1/450) = 2070.04: the reference rounds to 2,070; n >= that is 2,071.
    assert clean_questions_needed(P0, 0.99) == 2071
    assert fault_stats(P0, 100).need_clean_10x_lower_95 == pytest.approx(13_500, rel=0.01)


def test_exact_poisson_interval() -> None:
    four = fault_stats(P0, 1800, 4)
    rarest, most = four.one_per_ci95
    assert round(most) == 176 and rarest is not None and round(rarest) == 1652  # 4 in 1,800: 1 per [176, 1,652]
    clean = fault_stats(P0, 1800, 0)
    assert clean.one_per_ci95[0] is None  # no lower bound on the rate with no faults
    assert round(clean.one_per_ci95[1]) == 488  # two-sided upper bound: 1 per 488
    assert round(1 / clean.one_sided_upper95) == 601  # one-sided, about 3/n: 1 per 601


def test_two_arm_comparison() -> None:
    four = compare_arms(4, 1800, 0, 1800)
    assert four.p_conditional == pytest.approx(0.0625) and four.p_etest == pytest.approx(0.021, abs=0.001)
    five = compare_arms(5, 1800, 0, 1800)
    assert five.p_conditional == pytest.approx(0.5**5)  # 0.031: 5 faults against none is the first p < 0.05
    assert compare_arms(0, 1800, 0, 1800).p_conditional == 1.0


def test_sizing_a_faulty_arm() -> None:
    assert fault_stats(P0, 3000).p_faulty_arm_shows_5 == pytest.approx(0.79, abs=0.01)
    assert fault_stats(P0, 3600).p_faulty_arm_shows_5 == pytest.approx(0.90, abs=0.01)


@pytest.mark.parametrize("text", ["1/450", "0.00222222", " 1/450 "])
def test_rates_parse_as_fractions_or_decimals(text: str) -> None:
    assert parse_rate(text) == pytest.approx(P0, rel=1e-3)


@pytest.mark.parametrize("text", ["450", "0", "1/0", "abc", "-0.1"])
def test_bad_rates_are_usage_errors(text: str) -> None:
    with pytest.raises(InputError):
        parse_rate(text)


def test_stats_command(capsys) -> None:
    assert main(["stats", "--baseline-rate", "1/450", "--questions", "917", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert round(document["faults"]["p_luck"], 2) == 0.13 and document["faults"]["need_clean_95"] == 1347
    assert (
        main(
            [
                "stats",
                "--baseline-rate",
                "1/450",
                "--questions",
                "1800",
                "--faults",
                "4",
                "--other-questions",
                "1800",
                "--other-faults",
                "0",
            ]
        )
        == 0
    )
    assert "conditional binomial p = 0.0625" in capsys.readouterr().out
    assert main(["stats", "--baseline-rate", "450", "--questions", "3"]) == 2
    assert main(["stats", "--baseline-rate", "1/450", "--questions", "10", "--other-faults", "1"]) == 2
