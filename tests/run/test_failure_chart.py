"""Failure tables drawn side by side (run/eval/failure_chart.py): the segments follow the shares, and
the command's errors are one line naming the entry or file."""
import json

import numpy as np
from matplotlib import image as mpimg

from matpo_jax.run.eval import failure_chart
from matpo_jax.run.eval import failures

TAB_GREEN, TAB_PINK = (44, 160, 44), (227, 119, 194)  # matplotlib's C2 (correct) and C6


def _table(correct: int, missing: int) -> dict:
    rows = [{"stage": failures.CORRECT, "samples": correct, "share": correct / 100},
            {"stage": failures.OPENED_MISSING, "samples": missing, "share": missing / 100},
            {"stage": failures.OPENED_TWIN, "samples": 100 - correct - missing,
             "share": (100 - correct - missing) / 100}]
    return {"samples": 100, "accuracy": correct / 100, "question_hops": {"1": 100}, "rows": rows}


def _fraction(pixels, rgb, tolerance=30):
    return np.mean(np.all(np.abs(pixels - np.array(rgb)) < tolerance, axis=-1))


def test_each_bar_is_split_by_the_shares(tmp_path):
    out = failure_chart.plot_failures({"sft": _table(20, 70), "rl": _table(70, 20)},
                                      tmp_path / "f.png")
    pixels = (mpimg.imread(out)[..., :3] * 255).astype(int)
    # The pink of invented pages and the green of correct answers swap between the two bars:
    # the first bar (sft, drawn on top) mostly pink, the second mostly green.
    rows = [r for r in range(pixels.shape[0])
            if _fraction(pixels[r], TAB_GREEN) + _fraction(pixels[r], TAB_PINK) > 0.2]
    top = pixels[rows[: len(rows) // 2]]
    bottom = pixels[rows[len(rows) // 2:]]
    assert _fraction(top, TAB_PINK) > 2.5 * _fraction(top, TAB_GREEN)
    assert _fraction(bottom, TAB_GREEN) > 2.5 * _fraction(bottom, TAB_PINK)


def test_every_stage_has_its_own_colour():
    assert set(failure_chart.STAGE_COLOURS) == set(failures.STAGES)
    assert len(set(failure_chart.STAGE_COLOURS.values())) == len(failures.STAGES)


def test_the_command_reads_failures_json_and_names_what_is_missing(tmp_path, capsys):
    good = tmp_path / "a"
    good.mkdir()
    (good / failures.FAILURES_JSON).write_text(json.dumps(_table(50, 30)))
    out = tmp_path / "chart.png"
    assert failure_chart.main(["x", f"--evals=A:{good}", f"--out={out}"]) == 0
    assert out.exists()
    assert failure_chart.main(["x", f"--evals=A:{good},B:{tmp_path / 'b'}", f"--out={out}"]) == 1
    assert f"{tmp_path / 'b' / failures.FAILURES_JSON} does not exist" in capsys.readouterr().err
    assert failure_chart.main(["x", f"--evals={good}", f"--out={out}"]) == 1
    assert "expected LABEL:DIR" in capsys.readouterr().err
