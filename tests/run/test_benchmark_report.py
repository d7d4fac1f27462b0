"""avg@K, pass@K, not-attempted, calls per question and judge failures, by category, against
values computed by hand (see run/eval/summary.py's docstring for the definitions)."""
from __future__ import annotations

import math

import pytest

from matpo_jax.run.eval.summary import markdown_table, summarize, write_report

C, I, N, F = "correct", "incorrect", "not_attempted", None  # F: the judge failed


def result(qid, grades, tools, workers, **categories):
    return {"id": qid, "categories": categories,
            "samples": [{"grade": g, "tool_calls": t, "worker_calls": w, "prediction": None}
                        for g, t, w in zip(grades, tools, workers)]}


# K = 4. Per question: graded g, correct c, not attempted n, failed f.
RESULTS = [
    result("q1", [C, I, N, C], [2, 0, 1, 1], [1, 0, 0, 1], level=["1"], type=["a", "b"]),
    result("q2", [I, I, F, I], [0, 0, 0, 0], [0, 0, 0, 0], level=["1"], type=["a"]),
    result("q3", [F, F, F, F], [4, 4, 4, 4], [2, 2, 2, 2], level=["2"], type=["b", "b"]),
    result("q4", [F, C, I, N], [1, 1, 1, 1], [0, 0, 0, 0], level=["2"], type=["b"]),
    result("q5", [I, I, I, I], [3, 1, 0, 0], [1, 1, 0, 0], level=["2"], type=["a"]),
]


def test_all_questions_by_hand():
    s = summarize(RESULTS)["all"]
    assert (s.questions, s.samples) == (5, 4)
    # avg@4 over graded questions q1 q2 q4 q5 (q3 has no grade): 2/4, 0/3, 1/3, 0/4
    assert s.avg_at_k == pytest.approx((0.5 + 0 + 1 / 3 + 0) / 4)
    # pass@4 over decided questions: q1 (pass), q4 (pass, despite a failure), q5 (fail);
    # q2 (no correct, one failed sample) and q3 (all failed) are unknown
    assert s.pass_at_k == pytest.approx(2 / 3)
    assert s.not_attempted == pytest.approx((1 / 4 + 0 + 1 / 3 + 0) / 4)
    assert s.tool_calls == pytest.approx((4 / 4 + 0 + 16 / 4 + 4 / 4 + 4 / 4) / 5)
    assert s.worker_calls == pytest.approx((2 / 4 + 0 + 8 / 4 + 0 + 2 / 4) / 5)
    assert (s.judge_failures, s.ungraded) == (0 + 1 + 4 + 1 + 0, 1)


def test_groups_by_category_value():
    groups = summarize(RESULTS)
    assert list(groups) == ["all", "level 1", "level 2", "type a", "type b"]
    level1, level2 = groups["level 1"], groups["level 2"]
    assert level1.questions == 2 and level1.avg_at_k == pytest.approx((0.5 + 0) / 2)
    assert level1.pass_at_k == pytest.approx(1.0)  # q2 undecided
    assert level2.questions == 3 and level2.avg_at_k == pytest.approx((1 / 3 + 0) / 2)
    assert level2.pass_at_k == pytest.approx(1 / 2) and level2.judge_failures == 5
    # q1 is of both types; q3 lists type b twice and counts once
    assert groups["type a"].questions == 3 and groups["type b"].questions == 3
    assert groups["type b"].avg_at_k == pytest.approx((0.5 + 1 / 3) / 2)


def test_a_group_without_any_grade_has_no_accuracy():
    s = summarize([RESULTS[2]])["all"]
    assert math.isnan(s.avg_at_k) and math.isnan(s.pass_at_k) and math.isnan(s.not_attempted)
    assert (s.judge_failures, s.ungraded) == (4, 1)


def test_markdown_table_and_files(tmp_path):
    summaries = {"gaia": summarize(RESULTS), "frames": summarize([RESULTS[2]])}
    table = markdown_table(summaries)
    lines = table.splitlines()
    assert lines[0].startswith("| dataset | group | questions | avg@4 | pass@4 | not attempted")
    assert len(lines) == 2 + 5 + 3  # header, gaia's 5 groups, frames' all / level 2 / type b
    assert lines[2] == "| gaia | all | 5 | 20.8 | 66.7 | 14.6 | 1.40 | 0.60 | 6 (1 ungraded) |"
    assert lines[7] == "| frames | all | 1 | - | - | - | 4.00 | 2.00 | 4 (1 ungraded) |"
    assert write_report(str(tmp_path), summaries, "# header") == table
    assert (tmp_path / "report.md").read_text() == "# header\n\n" + table
    assert '"avg_at_k"' in (tmp_path / "report.json").read_text()
