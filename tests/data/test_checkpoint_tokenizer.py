"""With a Hugging Face checkpoint (or tokenizer) configured, a run uses its tokenizer, special
tokens and chat template instead of training one on the synthetic corpus."""
import os

import pytest

from matpo_jax.config import ConfigError, apply_overrides, load_config_file
from matpo_jax.chat.tokenizer_training import PRE_TOKENIZER_VERSION
from matpo_jax.data.world_assets import prepare_world, tokenizer_dir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL_WORLD = {"data.num_entities": 40, "data.num_questions": 80, "data.max_hops": 2}


def config(**overrides):
    cfg = load_config_file(os.path.join(REPO, "configs", "synthetic_tiny.py"))
    return apply_overrides(cfg, {**SMALL_WORLD, **overrides})


def trained_tokenizers(data_dir):
    return [d for root, dirs, _ in os.walk(data_dir) for d in dirs if d.startswith("tokenizer_v")]


def test_checkpoint_tokenizer_replaces_the_trained_one(tmp_path, qwen3_checkpoint):
    cfg = config(**{"model.hf_checkpoint": qwen3_checkpoint.path})
    assets = prepare_world(cfg, str(tmp_path))
    assert assets.tokenizer_dir == qwen3_checkpoint.path == tokenizer_dir(cfg, str(tmp_path))
    assert (assets.chat.im_start_id, assets.chat.im_end_id) == (151644, 151645)
    assert assets.chat.tokenizer.chat_template.startswith("{#- Qwen3's chat template")
    assert trained_tokenizers(tmp_path) == []  # nothing trained on the synthetic corpus


def test_model_tokenizer_wins_and_must_fit_the_vocabulary(tmp_path, real_qwen3_tokenizer_dir,
                                                          untied_checkpoint):
    # model.tokenizer with the config's own small model: 3072 rows cannot hold id 151668.
    with pytest.raises(ConfigError, match=r"model.arch.vocab_size = 3072: the tokenizer in .* "
                                          r"\(model.tokenizer\) uses ids up to 151668"):
        prepare_world(config(**{"model.tokenizer": str(real_qwen3_tokenizer_dir)}), str(tmp_path))
    cfg = config(**{"model.tokenizer": str(real_qwen3_tokenizer_dir), "model.arch.vocab_size": 151680})
    assert prepare_world(cfg, str(tmp_path)).chat.id_count == 151669
    # A checkpoint without tokenizer files, and no model.tokenizer: named in one line.
    with pytest.raises(ConfigError, match=r"model.hf_checkpoint = .*: .*no tokenizer.json"):
        prepare_world(config(**{"model.hf_checkpoint": untied_checkpoint.path}), str(tmp_path))
    assert trained_tokenizers(tmp_path) == []


def test_without_a_checkpoint_the_world_tokenizer_is_trained(tmp_path):
    cfg = config(**{"model.arch.vocab_size": 600})
    assets = prepare_world(cfg, str(tmp_path))
    assert assets.tokenizer_dir == tokenizer_dir(cfg, str(tmp_path))
    assert trained_tokenizers(tmp_path) == [f"tokenizer_v600_pre{PRE_TOKENIZER_VERSION}"]
