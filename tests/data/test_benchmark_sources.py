"""The loader serves every dataset by its data.name: the published benchmarks built from
<manual_dir>/<name>/, the synthetic world as before, batches of plain python values."""
from __future__ import annotations

from pathlib import Path

import pytest

from matpo_jax.data import loader, published

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tfds")


@pytest.mark.parametrize("name, split, first_id, size", [
    ("musique", "train", "2hop__460946_294723", 3),
    ("musique", None, "2hop__111_222", 2),  # None: the benchmark's split (validation)
    ("frames", None, "frames-0", 3),
    ("webwalkerqa", None, "webwalkerqa-main-00000", 3),
    ("webwalkerqa", "silver", "webwalkerqa-silver-00000", 2),
    ("gaia", None, "c61d22de-5f6c-4958-a7f6-5e9707bd3466", 3),  # config text: no attachments
])
def test_question_source_of_every_benchmark(data_dir, name, split, first_id, size):
    source = loader.question_source(name, split, data_dir=data_dir, manual_dir=FIXTURES)
    assert len(source) == size
    record = loader.decode_record(source[0])
    assert record["id"] == first_id
    assert isinstance(record["question"], str) and record["question"]
    assert loader.answers_of(record) == record["answers"]
    assert all(isinstance(a, str) for a in record["answers"])


def test_configs_by_name_and_a_prepared_dataset_needs_no_files(data_dir):
    everything = loader.question_source("gaia", data_dir=data_dir, manual_dir=FIXTURES,
                                        config="all")
    assert len(everything) == 4
    # Built once: later runs read it without the manual dir.
    again = loader.question_source("gaia", data_dir=data_dir, manual_dir=None, config="all")
    assert len(again) == 4


def test_batches_are_plain_python(data_dir):
    source = loader.question_source("musique", "train", data_dir=data_dir, manual_dir=FIXTURES)
    batches = list(loader.make_loader("train", 2, seed=0, shuffle=False, num_epochs=1,
                                      drop_remainder=False, source=source))
    assert [b["id"] for b in batches] == [["2hop__460946_294723", "3hop1__9988_1234_5678"],
                                          ["4hop2__1_2_3_4"]]
    first = batches[0]
    assert first["answers"][0] == ["Miquette Giraudy", "M. Giraudy"]
    assert first["hops"] == [2, 3] and all(type(h) is int for h in first["hops"])
    paragraphs = first["paragraphs"][1]
    assert paragraphs["title"] == ["Lyon", "Lyon", "Rhone"]
    assert paragraphs["is_supporting"] == [False, False, True]
    assert all(type(flag) is bool for flag in paragraphs["is_supporting"])
    assert first["answerable"] == [True, True]


def test_synthetic_world_records_keep_their_single_answer(prepared):
    data_dir, builder = prepared
    source = loader.question_source("synthetic_multihop", "validation", data_dir=data_dir,
                                    config=builder.builder_config, prepare=False)
    record = loader.decode_record(source[0])
    assert set(record) == {"id", "question", "answer", "hops", "chain"}
    assert loader.answers_of(record) == [record["answer"]]


def test_unknown_names_and_splits_and_missing_files(data_dir, tmp_path):
    with pytest.raises(ValueError, match="dataset 'hotpotqa' has no builder; known: "
                                         "synthetic_multihop, musique, frames, webwalkerqa, gaia"):
        loader.open_dataset("hotpotqa", data_dir=data_dir)
    with pytest.raises(ValueError, match=r"dataset 'frames' has no split 'train'; "
                                         r"it has \['test'\]"):
        loader.question_source("frames", "train", data_dir=data_dir, manual_dir=FIXTURES)
    # <manual_dir>/<name>/ is where the files are looked for
    with pytest.raises(published.DatasetFileError, match=str(tmp_path / "frames")):
        loader.question_source("frames", data_dir=tmp_path / "tfds", manual_dir=tmp_path)
