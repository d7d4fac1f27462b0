"""The one normalisation of answers, for grading and for checking gold answers when data is loaded.

SQuAD's (lower case, punctuation and the articles a/an/the dropped, whitespace collapsed), made
to hold for the text real datasets carry: Unicode's compatibility form first (NFKC: "Zoë" typed as
e + combining diaeresis equals the precomposed one, full-width letters their ASCII ones), and every
Unicode punctuation mark dropped like the ASCII ones (’ and ', – and -, « and ").
An answer that normalises to nothing ("", "The", ".") can match nothing: a gold answer like that
is refused when its dataset is loaded (data/published.answer_list), a prediction like that
never scores (rl/rewards.accuracy, run/eval/grading.Grader).
"""
from __future__ import annotations

import re
import string
import unicodedata

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ASCII_PUNCTUATION = frozenset(string.punctuation)  # includes the symbols $+<=>^`|~


def _is_punctuation(ch: str) -> bool:
    return ch in _ASCII_PUNCTUATION or unicodedata.category(ch).startswith("P")


def normalize_answer(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(ch for ch in text if not _is_punctuation(ch))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def is_empty_answer(text: str | None) -> bool:
    """No answer, or one with nothing left to compare once normalised."""
    return text is None or not normalize_answer(text)
