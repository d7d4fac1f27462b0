"""The paper's configs (Qwen3 0.6B / 4B / 14B on MuSiQue) and their offline variants validate
through the typed config path, and a run on a published dataset refuses what it cannot do."""
from pathlib import Path

import pytest

from matpo_jax.config import (ConfigError, PUBLISHED_SPLITS, apply_overrides, load_config_file,
                              to_typed)
from matpo_jax.data import loader

REPO = Path(__file__).resolve().parents[2]
CONFIGS = ["qwen3_0_6b_musique.py", "qwen3_4b_musique.py", "qwen3_14b_musique.py"]


@pytest.mark.parametrize("name", CONFIGS)
def test_musique_configs_validate_online_and_offline(name):
    path = REPO / "configs" / name
    online = to_typed(load_config_file(path, "checkpoint=/ckpt/qwen3"), check_files=False)
    offline = to_typed(load_config_file(path, "checkpoint=/ckpt/qwen3,offline"),
                       check_files=False)
    for cfg in (online, offline):
        assert cfg.model.hf_checkpoint == "/ckpt/qwen3"  # the checkpoint's tokenizer too
        assert (cfg.data.name, cfg.data.split, cfg.sft.steps) == ("musique", "train", 0)
        assert (cfg.data.batch_size, cfg.rollout.group_size, cfg.train.steps) == (256, 8, 180)
        assert (cfg.rl.lr, cfg.rl.weight_decay, cfg.rl.grad_clip) == (1e-5, 0.01, 1.0)
        assert cfg.rollout.max_context == 40960 and cfg.tools.max_response_chars == 20000
    assert (online.tools.search_backend, online.tools.page_backend) == ("serper", "fetch")
    assert online.reward.method == "judge"
    assert online.eval.datasets == ("gaia", "frames", "webwalkerqa")
    # offline: the local service over MuSiQue's paragraphs, no URL anywhere
    assert (offline.tools.search_backend, offline.tools.search_url) == ("local", None)
    assert (offline.tools.page_backend, offline.tools.page_url) == ("service", None)
    assert (offline.reward.method, offline.reward.judge_url) == ("exact", None)
    assert offline.eval.datasets == ("musique",)


def test_a_published_dataset_run_refuses_sft_and_a_missing_tokenizer():
    def offline():
        return load_config_file(REPO / "configs" / "qwen3_4b_musique.py", "offline")

    with pytest.raises(ConfigError) as error:
        to_typed(apply_overrides(offline(), {"sft.steps": 10, "data.split": "test",
                                       "eval.datasets": ("synthetic_multihop", "musique")}),
                 check_files=False)
    problems = error.value.problems
    assert len(problems) == 3
    assert problems[0].startswith("sft.steps = 10: scripted SFT demonstrations exist only for "
                                  "the synthetic world")
    assert problems[1] == "data.split = 'test': musique's splits are train, validation"
    assert problems[2].startswith("eval.datasets: 'synthetic_multihop' is evaluated only")
    with pytest.raises(ConfigError, match=r"^model.hf_checkpoint: data.name = 'musique' needs"):
        to_typed(apply_overrides(offline(), {"model.hf_checkpoint": None}), check_files=False)


def test_published_splits_are_the_builders_splits(tmp_path):
    fixtures = REPO / "tests" / "data" / "fixtures"
    for name, splits in PUBLISHED_SPLITS.items():
        sources = loader.open_dataset(name, data_dir=tmp_path, manual_dir=fixtures)
        assert tuple(sorted(sources)) == tuple(sorted(splits)), name


def test_published_dataset_files_are_named_by_the_field(tmp_path, real_qwen3_tokenizer_dir):
    """No data.manual_dir, or one without the files: one line naming data.manual_dir."""
    from matpo_jax.data.task_assets import prepare_task

    def offline(**overrides):
        cfg = load_config_file(REPO / "configs" / "qwen3_0_6b_musique.py", "offline")
        return to_typed(apply_overrides(cfg, {"model.hf_checkpoint": None,
                                              "model.tokenizer": str(real_qwen3_tokenizer_dir),
                                              **overrides}), check_files=False)

    with pytest.raises(ConfigError, match=r"^data.manual_dir: not set, and musique is not "
                                          r"prepared in "):
        prepare_task(offline(), str(tmp_path / "tfds"))
    with pytest.raises(ConfigError, match=r"^data.manual_dir: .*nothing/musique: manual dir of "
                                          r"musique is missing or empty; download musique"):
        prepare_task(offline(**{"data.manual_dir": str(tmp_path / "nothing")}),
                     str(tmp_path / "tfds"))
    fixtures = REPO / "tests" / "data" / "fixtures"
    assets = prepare_task(offline(**{"data.manual_dir": str(fixtures)}), str(tmp_path / "tfds"))
    assert assets.world is None and assets.tokenizer_dir == str(real_qwen3_tokenizer_dir)
    assert assets.corpus_path.endswith("musique/ans/1.0.0/corpus.jsonl")
    assert len(assets.source("train")) == 3 and len(assets.source("validation")) == 2
