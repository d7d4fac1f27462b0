"""Two evaluations compared question by question (paired.py): the gain, its interval, the
exact McNemar test, the per-hop breakdown, and the command's errors."""
import json
import math

import numpy as np
import pytest

from matpo_jax.run.eval import paired


def write_results(directory, grades, hops=None):
    """results.jsonl as `python -m matpo_jax.evaluate` writes it: one greedy sample a question."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "results.jsonl", "w") as f:
        for i, grade in enumerate(grades):
            record = {"id": f"validation-{i:05d}", "question": f"q{i}", "answers": ["a"],
                      "categories": {"hops": [str(hops[i] if hops else 1)]}, "grader": "exact",
                      "samples": [{"prediction": "a" if grade else "b",
                                   "grade": "correct" if grade else "incorrect"}]}
            f.write(json.dumps(record) + "\n")
    return directory


def test_gain_interval_and_mcnemar_of_discordant_questions(tmp_path):
    # 20 questions: 5 right on both sides, 1 right -> wrong, 7 wrong -> right, 7 wrong on both.
    before = [1] * 5 + [1] + [0] * 7 + [0] * 7
    after = [1] * 5 + [0] + [1] * 7 + [0] * 7
    gains = paired.compare(write_results(tmp_path / "sft", before),
                                write_results(tmp_path / "rl", after), by=None)
    g = gains["all"]
    assert (g.questions, g.right_to_wrong, g.wrong_to_right) == (20, 1, 7)
    assert g.before == pytest.approx(0.30) and g.after == pytest.approx(0.60)
    assert g.gain == pytest.approx(0.30)
    # The interval is the mean difference +- 1.96 standard errors of the 20 differences.
    diff = np.array(after) - np.array(before)
    half = 1.959964 * diff.std(ddof=1) / math.sqrt(20)
    assert (g.ci_low, g.ci_high) == pytest.approx((0.30 - half, 0.30 + half), abs=1e-6)
    # Exact two-sided binomial over the 8 discordant questions: 2 (C(8,0) + C(8,1)) / 2^8.
    assert g.mcnemar_p == pytest.approx(2 * 9 / 256)


def test_mcnemar_is_symmetric_and_one_without_discordant_questions():
    assert paired.mcnemar_exact_p(3, 11) == pytest.approx(paired.mcnemar_exact_p(11, 3))
    assert paired.mcnemar_exact_p(0, 0) == 1.0
    assert paired.mcnemar_exact_p(5, 5) == 1.0  # capped: the two tails overlap
    assert paired.mcnemar_exact_p(0, 10) == pytest.approx(2 / 1024)


def test_breakdown_by_hop_count(tmp_path):
    hops = [1, 1, 1, 1, 2, 2, 2, 2]
    before = [1, 0, 0, 0, 1, 1, 0, 0]
    after = [1, 1, 1, 0, 1, 0, 0, 0]
    gains = paired.compare(write_results(tmp_path / "a", before, hops),
                                write_results(tmp_path / "b", after, hops), by="hops")
    assert set(gains) == {"all", "hops=1", "hops=2"}
    assert gains["hops=1"].gain == pytest.approx(0.5)
    assert (gains["hops=2"].right_to_wrong, gains["hops=2"].wrong_to_right) == (1, 0)
    assert gains["all"].gain == pytest.approx(1 / 8)
    table = paired.markdown_table(gains)
    assert "| hops=1 | 4 | 25.0% | 75.0% | +50.0 |" in table


def test_sampled_evaluations_have_an_interval_but_no_mcnemar(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for directory, grades in ((a, ["correct", "incorrect"]), (b, ["correct", "correct"])):
        directory.mkdir()
        (directory / "results.jsonl").write_text(json.dumps(
            {"id": "q0", "samples": [{"grade": g} for g in grades]}) + "\n" + json.dumps(
            {"id": "q1", "samples": [{"grade": "incorrect"}, {"grade": "incorrect"}]}) + "\n")
    g = paired.compare(a, b)["all"]
    assert g.gain == pytest.approx(0.25)
    assert g.mcnemar_p is None and g.right_to_wrong is None


def test_questions_on_one_side_only_are_named(tmp_path):
    a = write_results(tmp_path / "a", [1, 0, 1])
    b = write_results(tmp_path / "b", [1, 0])
    with pytest.raises(paired.PairedError, match="validation-00002"):
        paired.compare(a, b)


def test_command_prints_the_table_writes_json_and_names_a_missing_directory(tmp_path, capsys):
    a = write_results(tmp_path / "a", [0, 0, 1, 0], [1, 2, 1, 2])
    b = write_results(tmp_path / "b", [1, 1, 1, 0], [1, 2, 1, 2])
    out = tmp_path / "paired.json"
    assert paired.main(["paired", f"--before={a}", f"--after={b}", f"--out={out}"]) == 0
    assert "| all | 4 | 25.0% | 75.0% | +50.0 |" in capsys.readouterr().out
    written = json.loads(out.read_text())
    assert written["all"]["wrong_to_right"] == 2 and written["hops=2"]["gain"] == 0.5
    assert paired.main(["paired", f"--before={tmp_path / 'nowhere'}", f"--after={b}"]) == 1
    assert "nowhere: no result lines" in capsys.readouterr().err


def test_demo_prints_the_paired_gain_of_its_two_evaluations(tmp_path):
    from matpo_jax.demo import paired_line

    eval_dir = tmp_path / "eval"
    assert "no per-question results" in paired_line(str(eval_dir))
    for tag, grades in (("sft", [0, 0, 1, 1]), ("final", [1, 1, 1, 0])):
        source = write_results(tmp_path / tag, grades)
        eval_dir.mkdir(exist_ok=True)
        (eval_dir / f"{tag}_questions.jsonl").write_text((source / "results.jsonl").read_text())
    line = paired_line(str(eval_dir))
    assert line.startswith("gain +25.0 points over the same 4 questions")
    assert "2 wrong -> right, 1 right -> wrong, McNemar p = 1" in line


def test_seed_mean_gain_averages_each_question_over_seeds_first(tmp_path):
    # Two seeds from one start: question 0 gained on both, question 1 on one, question 2 lost on
    # one, question 3 right throughout.
    start = write_results(tmp_path / "start", [0, 0, 1, 1])
    seed0 = write_results(tmp_path / "s0", [1, 1, 1, 1])
    seed1 = write_results(tmp_path / "s1", [1, 0, 0, 1])
    g = paired.seed_mean_gain([(start, seed0), (start, seed1)])
    diff = np.array([1.0, 0.5, -0.5, 0.0])  # per question, after averaged over the seeds
    half = 1.959964 * diff.std(ddof=1) / math.sqrt(4)
    assert g.questions == 4 and g.before == pytest.approx(0.5) and g.after == pytest.approx(0.75)
    assert (g.gain, g.ci_low, g.ci_high) == pytest.approx((0.25, 0.25 - half, 0.25 + half),
                                                          abs=1e-6)
    assert g.mcnemar_p is None  # fractional scores
    # One seed alone is the ordinary paired comparison, McNemar included.
    assert paired.seed_mean_gain([(start, seed0)]) == paired.compare(start, seed0)["all"]


def test_seed_mean_gain_refuses_seeds_on_other_questions(tmp_path):
    start = write_results(tmp_path / "start", [0, 1, 1])
    short = write_results(tmp_path / "short", [1, 1])
    with pytest.raises(paired.PairedError, match="short"):
        paired.seed_mean_gain([(start, start), (start, short)])


def test_gain_difference_is_one_methods_gain_minus_the_others_per_question(tmp_path):
    # Method a (e.g. MATPO) and method b (a single agent) on the same 6 questions, each before and
    # after its own RL.
    a_before = write_results(tmp_path / "a0", [1, 0, 0, 1, 0, 1])
    a_after = write_results(tmp_path / "a1", [1, 1, 1, 1, 0, 1])
    b_before = write_results(tmp_path / "b0", [0, 0, 1, 1, 0, 0])
    b_after = write_results(tmp_path / "b1", [0, 1, 0, 1, 0, 0])
    g = paired.gain_difference((a_before, a_after), (b_before, b_after))
    gap_before = np.array([1, 0, -1, 0, 0, 1])
    gap_after = np.array([1, 0, 1, 0, 0, 1])
    diff = gap_after - gap_before
    half = 1.959964 * diff.std(ddof=1) / math.sqrt(6)
    assert g.questions == 6
    assert (g.before, g.after) == pytest.approx((gap_before.mean(), gap_after.mean()))
    # a gained 2/6, b gained 0: all of the gap's growth is a's training.
    a_gain = paired.compare(a_before, a_after)["all"].gain
    b_gain = paired.compare(b_before, b_after)["all"].gain
    assert g.gain == pytest.approx(a_gain - b_gain) and g.gain == pytest.approx(2 / 6)
    assert (g.ci_low, g.ci_high) == pytest.approx((2 / 6 - half, 2 / 6 + half), abs=1e-6)
    # Gaps are not 0/1 scores, even when no question's gap is negative.
    assert g.mcnemar_p is None and g.right_to_wrong is None
    same = paired.gain_difference((a_before, a_after), (a_before, a_after))
    assert (same.gain, same.ci_low, same.ci_high) == (0.0, 0.0, 0.0)


def test_gain_difference_names_the_evaluation_on_other_questions(tmp_path):
    full = write_results(tmp_path / "full", [0, 1, 1])
    short = write_results(tmp_path / "short", [1, 1])
    with pytest.raises(paired.PairedError, match="b's after"):
        paired.gain_difference((full, full), (full, short))
