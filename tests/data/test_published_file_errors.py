"""Published benchmark files with bytes that are not UTF-8, with no rows, or with a field of the
wrong JSON type: one error naming the file (and line), never a traceback naming none or a value
silently coerced (bool("false") is True)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from matpo_jax.data import frames, musique, published, webwalkerqa

FIXTURES = Path(__file__).parent / "fixtures"
GOOD_MUSIQUE = (FIXTURES / "musique" / "musique_ans_v1.0_train.jsonl").read_text().splitlines()[0]
FRAMES_TSV = (FIXTURES / "frames" / "test.tsv").read_bytes()


def prepare(module, config, tmp_path, files: dict[str, bytes]):
    manual = tmp_path / "manual"
    for name, content in files.items():
        (manual / name).parent.mkdir(parents=True, exist_ok=True)
        (manual / name).write_bytes(content)
    with pytest.raises(published.DatasetRowError) as error:
        module.prepare_dataset(config, manual_dir=manual, data_dir=tmp_path / "tfds")
    return str(error.value), manual


def musique_files(train: bytes, dev: bytes | None = None) -> dict[str, bytes]:
    return {"musique_ans_v1.0_train.jsonl": train,
            "musique_ans_v1.0_dev.jsonl": dev if dev is not None else
            GOOD_MUSIQUE.encode() + b"\n"}


def test_a_byte_that_is_not_utf8_names_file_line_and_column(tmp_path):
    bad = GOOD_MUSIQUE.encode().replace(b"Green", b"Gr\xe9en", 1)
    message, manual = prepare(musique, "ans", tmp_path,
                              musique_files(GOOD_MUSIQUE.encode() + b"\n" + bad + b"\n"))
    column = bad.index(b"\xe9") + 1
    assert message == (f"{manual / 'musique_ans_v1.0_train.jsonl'}:2: not UTF-8: byte 0xe9 at "
                       f"column {column}")
    # FRAMES is read whole: the line and column are found in the bytes.
    lines = FRAMES_TSV.split(b"\n")
    lines[2] = b"\xff" + lines[2]
    message, manual = prepare(frames, None, tmp_path / "f", {"test.tsv": b"\n".join(lines)})
    assert message == f"{manual / 'test.tsv'}:3: not UTF-8: byte 0xff at column 1"
    message, manual = prepare(webwalkerqa, None, tmp_path / "w", {
        "main-00000-of-00001.jsonl": b'{"question": "q\x80", "answer": "a"}\n'})
    assert message == (f"{manual / 'main-00000-of-00001.jsonl'}:1: not UTF-8: byte 0x80 at "
                       f"column 16")


def test_an_empty_file_is_named(tmp_path):
    message, manual = prepare(musique, "ans", tmp_path, musique_files(b"", b"\n\n"))
    assert message in (f"{manual / 'musique_ans_v1.0_train.jsonl'}: empty file (no JSON rows)",
                       f"{manual / 'musique_ans_v1.0_dev.jsonl'}: empty file (no JSON rows)")
    message, manual = prepare(frames, None, tmp_path / "f", {"test.tsv": b""})
    assert message == f"{manual / 'test.tsv'}: empty file (no rows)"
    header_only = FRAMES_TSV.split(b"\n")[0] + b"\n"
    message, manual = prepare(frames, None, tmp_path / "h", {"test.tsv": header_only})
    assert message == f"{manual / 'test.tsv'}: empty file (no rows after the header)"
    message, manual = prepare(webwalkerqa, None, tmp_path / "w",
                              {"main-00000-of-00001.jsonl": b""})
    assert message == f"{manual / 'main-00000-of-00001.jsonl'}: empty file (no JSON rows)"


@pytest.mark.parametrize("paragraph_change, expected", [
    ({"is_supporting": "false"}, "paragraphs[0].is_supporting must be true or false, got 'false'"),
    ({"is_supporting": 1}, "paragraphs[0].is_supporting must be true or false, got 1"),
    ({"title": ["a list"]}, "field 'title' must be text, got list"),
])
def test_musique_paragraph_fields_are_strictly_typed(tmp_path, paragraph_change, expected):
    row = json.loads(GOOD_MUSIQUE)
    row["paragraphs"][0].update(paragraph_change)
    message, manual = prepare(musique, "ans", tmp_path,
                              musique_files(b"\n" + json.dumps(row).encode() + b"\n"))
    assert message == f"{manual / 'musique_ans_v1.0_train.jsonl'}:2: {expected}"
