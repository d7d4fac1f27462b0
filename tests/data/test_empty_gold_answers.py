"""Issue 48 item 5 (and 11's answer forms): a gold answer empty once normalised ("", "The", ".") is
refused when its dataset is loaded, naming file and line; an empty prediction (\\boxed{},
\\boxed{the}, \\boxed{.}) never scores under exact match, F1 or the judge's grader; answers
written in other Unicode forms (NFC/NFD, typographic apostrophes and dashes) compare equal."""
from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

from matpo_jax.data import musique, published, webwalkerqa
from matpo_jax.rl import rewards
from matpo_jax.run.eval.grading import CORRECT, INCORRECT, NOT_ATTEMPTED, Grader

FIXTURES = Path(__file__).parent / "fixtures"
GOOD_MUSIQUE = (FIXTURES / "musique" / "musique_ans_v1.0_train.jsonl").read_text().splitlines()[0]


def prepare_refused(module, config, tmp_path, files: dict[str, str]) -> tuple[str, Path]:
    manual = tmp_path / "manual"
    manual.mkdir(parents=True)
    for name, content in files.items():
        (manual / name).write_text(content, encoding="utf-8")
    with pytest.raises(published.DatasetRowError) as error:
        module.prepare_dataset(config, manual_dir=manual, data_dir=tmp_path / "tfds")
    return str(error.value), manual


@pytest.mark.parametrize("gold", ["", "The", ".", " a "])
def test_a_gold_answer_empty_once_normalised_is_refused_naming_file_and_line(tmp_path, gold):
    row = json.loads(GOOD_MUSIQUE)
    bad = json.dumps({**row, "id": "2hop__9_9", "answer": gold})
    message, manual = prepare_refused(musique, "ans", tmp_path, {
        "musique_ans_v1.0_train.jsonl": f"{GOOD_MUSIQUE}\n{bad}\n",
        "musique_ans_v1.0_dev.jsonl": f"{GOOD_MUSIQUE}\n"})
    assert message == (f"{manual / 'musique_ans_v1.0_train.jsonl'}:2: answer {gold!r} is empty "
                       "once normalised (case, punctuation and articles dropped): no answer "
                       "could match it; fix or remove the row")
    message, manual = prepare_refused(webwalkerqa, None, tmp_path / "w", {
        "main-00000-of-00001.jsonl": json.dumps({"question": "Who?", "answer": gold}) + "\n"})
    assert message.startswith(f"{manual / 'main-00000-of-00001.jsonl'}:1: answer {gold!r} is")


def test_an_alias_empty_once_normalised_is_dropped():
    assert published.answer_list("Oslo", ["", "the", "Christiania", "Oslo"], path="f",
                                 line=1) == ["Oslo", "Christiania"]


@pytest.mark.parametrize("prediction", ["", "the", ".", "The.", " - "])
def test_an_empty_prediction_never_scores(prediction):
    for gold in ("The", "Oslo", ["", "Oslo"]):
        for method in ("exact", "f1"):
            assert rewards.accuracy(prediction, gold, method) == 0.0, (prediction, gold, method)
    grades = Grader("exact").grade_many([("q", ["Oslo"], prediction), ("q", ["The"], prediction)])
    assert grades == [NOT_ATTEMPTED, NOT_ATTEMPTED]


def test_unicode_forms_of_one_answer_compare_equal():
    nfc, nfd = unicodedata.normalize("NFC", "Zoë"), unicodedata.normalize("NFD", "Zoë")
    assert nfc != nfd
    for prediction, gold in ((nfd, nfc), ("O’Brien", "O'Brien"), ("1990–1995", "1990-1995"),
                             ("“Yes”", '"Yes"'), ("Ｏｓｌｏ", "Oslo")):
        assert rewards.accuracy(prediction, gold, "exact") == 1.0, (prediction, gold)
        assert rewards.accuracy(prediction, gold, "f1") == 1.0, (prediction, gold)
    assert Grader("exact").grade_many([("q", [nfc], nfd)]) == [CORRECT]
    assert Grader("exact").grade_many([("q", ["Zoe"], nfc)]) == [INCORRECT]  # not accent-blind
