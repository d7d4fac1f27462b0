import glob
import os

import grain.python as grain
import pytest
import tensorflow_datasets as tfds

from matpo_jax.data import synthetic_multihop
from matpo_jax.data.loader import make_loader
from matpo_jax.data.synthetic_world import SPLITS, build_world


def _decode(record):
    return {k: (v.decode() if isinstance(v, bytes) else int(v)) for k, v in record.items()}


def test_built_without_tensorflow_and_read_back_equals_the_world(prepared, small_config):
    data_dir, builder = prepared
    assert "tensorflow" not in __import__("sys").modules  # the numpy-only path of tfds
    world = build_world(**small_config.world_kwargs())
    source = tfds.data_source(f"synthetic_multihop/{small_config.name}", data_dir=data_dir,
                              download=False)
    for split in SPLITS:
        files = glob.glob(os.path.join(builder.data_dir, f"*-{split}.array_record-*"))
        assert files, split
        read = sorted((_decode(source[split][i]) for i in range(len(source[split]))),
                      key=lambda r: r["id"])
        assert read == sorted((q.to_record() for q in world.questions[split]), key=lambda r: r["id"])
    corpus = synthetic_multihop.corpus_path(builder)
    assert os.path.dirname(corpus) == os.fspath(builder.data_dir)
    assert open(corpus, encoding="utf-8").read() == world.corpus_jsonl()


def test_same_config_gives_identical_array_record_bytes(prepared, small_config, tmp_path):
    _, builder = prepared
    again = synthetic_multihop.prepare_dataset(small_config, tmp_path)
    for path in sorted(glob.glob(os.path.join(builder.data_dir, "*.array_record-*"))):
        twin = os.path.join(again.data_dir, os.path.basename(path))
        assert open(path, "rb").read() == open(twin, "rb").read(), path


def test_make_config_rejects_unknown_fields():
    with pytest.raises(ValueError, match="nosie"):
        synthetic_multihop.make_config(nosie=0.5)
    assert synthetic_multihop.make_config(seed=1, noise=0.25).name == "s1_e300_n0p25_q4000_h4"


def _loader(prepared, small_config, **kwargs):
    data_dir, _ = prepared
    args = dict(split="train", batch_size=4, seed=0, data_dir=data_dir, config=small_config)
    args.update(kwargs)
    return make_loader(**args)


def test_batches_are_python_dicts_and_one_epoch_covers_the_split(prepared, small_config):
    world = build_world(**small_config.world_kwargs())
    batches = list(_loader(prepared, small_config, split="validation", batch_size=3, shuffle=False,
                           num_epochs=1, drop_remainder=False))
    first = batches[0]
    assert set(first) == {"id", "question", "answer", "hops", "chain"}
    assert all(isinstance(x, str) for x in first["question"] + first["answer"])
    assert all(isinstance(h, int) for h in first["hops"]) and len(first["id"]) == 3
    ids = [i for b in batches for i in b["id"]]
    assert sorted(ids) == sorted(q.id for q in world.questions["validation"])
    by_id = {q.id: q for q in world.questions["validation"]}
    for b in batches:
        for i, question, answer in zip(b["id"], b["question"], b["answer"]):
            assert (question, answer) == (by_id[i].question, by_id[i].answer)


def test_order_is_a_function_of_the_seed(prepared, small_config):
    def first_ids(seed):
        it = iter(_loader(prepared, small_config, seed=seed))
        return [i for _ in range(5) for i in next(it)["id"]]

    assert first_ids(0) == first_ids(0)
    assert first_ids(0) != first_ids(1)


def test_restored_iterator_yields_exactly_the_next_batches(prepared, small_config):
    it = iter(_loader(prepared, small_config, batch_size=16))
    n_train = len(build_world(**small_config.world_kwargs()).questions["train"])
    for _ in range(n_train // 16 - 1):  # stop just before an epoch boundary
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(4)]  # crosses into the next (reshuffled) epoch
    restored = iter(_loader(prepared, small_config, batch_size=16))
    restored.set_state(state)
    assert [next(restored) for _ in range(4)] == expected
    fresh = iter(_loader(prepared, small_config, batch_size=16))
    assert next(fresh) != expected[0]  # the state, not luck, made them equal


def test_shard_options_split_the_records_between_hosts(prepared, small_config):
    def ids(index):
        options = grain.ShardOptions(shard_index=index, shard_count=2, drop_remainder=True)
        loader = _loader(prepared, small_config, shard_options=options, shuffle=False,
                         num_epochs=1, batch_size=1)
        return {i for b in loader for i in b["id"]}

    a, b = ids(0), ids(1)
    assert a and b and not a & b


def test_world_with_an_sft_split_builds_it_as_a_fourth_split(tmp_path):
    from matpo_jax.data.synthetic_world import SFT_SPLIT
    config = synthetic_multihop.make_config(seed=5, num_entities=60, num_questions=200, noise=0.3,
                                            sft_fraction=0.3)
    assert config.name.endswith("_sft0p3")  # never shares a directory with the 3-split world
    synthetic_multihop.prepare_dataset(config, tmp_path)
    source = tfds.data_source(f"synthetic_multihop/{config.name}", data_dir=tmp_path,
                              download=False)
    world = build_world(**config.world_kwargs())
    assert set(source) == {*SPLITS, SFT_SPLIT}
    read = sorted(_decode(source[SFT_SPLIT][i])["id"] for i in range(len(source[SFT_SPLIT])))
    assert read == sorted(q.id for q in world.questions[SFT_SPLIT]) and read
