"""RL's question pool: with data.rl_skips_demonstrated it is exactly the train questions SFT did
not demonstrate, so no RL reward can come from an answer SFT trained the model to say."""
from types import SimpleNamespace

import pytest

from matpo_jax.config import base_config
from matpo_jax.data import synthetic_multihop
from matpo_jax.data.task_assets import TaskAssets
from matpo_jax.data.loader import decode_record, make_loader, open_source
from matpo_jax.run.rl import rl_question_source
from matpo_jax.run.sft import demonstrated_indices


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    config = synthetic_multihop.make_config(seed=3, num_entities=60, num_questions=200, noise=0.3)
    data_dir = tmp_path_factory.mktemp("tfds")
    synthetic_multihop.prepare_dataset(config, data_dir)
    # the world's dataset only: these tests read questions, no corpus or tokenizer
    return TaskAssets(name="synthetic_multihop", config=config, data_dir=str(data_dir),
                      corpus_path=None, tokenizer_dir="", chat=None)


@pytest.fixture
def runtime(assets):
    cfg = base_config()
    cfg.sft.num_demos, cfg.data.batch_size = 40, 4
    return SimpleNamespace(cfg=cfg, assets=assets)


def _ids(source):
    return [decode_record(source[i])["id"] for i in range(len(source))]


def test_rl_pool_is_the_train_split_less_the_demonstrated_questions(runtime):
    train = open_source(runtime.assets.config, runtime.assets.data_dir)["train"]
    every = _ids(train)
    assert sorted(_ids(rl_question_source(runtime))) == sorted(every)  # off: the whole split

    runtime.cfg.data.rl_skips_demonstrated = True
    pool = rl_question_source(runtime)
    demonstrated = {every[i] for i in demonstrated_indices(runtime.cfg, len(train))}
    assert len(demonstrated) == 40
    assert set(_ids(pool)).isdisjoint(demonstrated)
    assert sorted(_ids(pool) + sorted(demonstrated)) == sorted(every)
    # a resumed run rebuilds the pool: grain checks its restored iterator against repr(source)
    assert repr(rl_question_source(runtime)) == repr(pool) and "0x" not in repr(pool)
    # what the RL loop reads through it: undemonstrated questions only
    batches = iter(make_loader("train", 4, seed=0, num_epochs=1, source=pool))
    seen = {qid for batch in batches for qid in batch["id"]}
    assert seen and seen.isdisjoint(demonstrated)


def test_too_few_undemonstrated_questions_name_the_fields(runtime):
    runtime.cfg.data.rl_skips_demonstrated = True
    train = open_source(runtime.assets.config, runtime.assets.data_dir)["train"]
    runtime.cfg.sft.num_demos = len(train) - 2
    with pytest.raises(ValueError, match="data.num_questions"):
        rl_question_source(runtime)
