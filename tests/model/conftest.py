"""Tiny random Hugging Face Qwen3 checkpoints, built once per session, shared by the model tests."""
import dataclasses

import numpy as np
import pytest

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16)
ROPE_THETA = 5000.0  # not the default, so a config-reading bug shows up in the logits


@dataclasses.dataclass
class HFCheckpoint:
    path: str
    torch_model: object  # transformers.Qwen3ForCausalLM, eval mode

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        import torch
        with torch.no_grad():
            return self.torch_model(torch.tensor(np.asarray(tokens))).logits.numpy()


def build_hf_checkpoint(path, tie_word_embeddings: bool, seed: int = 0) -> HFCheckpoint:
    """A random transformers Qwen3ForCausalLM saved to `path`. Weights are drawn much larger than
    HF's 0.02 init (and norm scales away from 1) so that every component moves the logits."""
    import torch
    import transformers

    config = transformers.Qwen3Config(
        **TINY, tie_word_embeddings=tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
            else:
                param.copy_(0.15 * torch.randn_like(param))
    model.save_pretrained(str(path))
    return HFCheckpoint(str(path), model)


@pytest.fixture(scope="session", params=[False, True], ids=["untied", "tied"])
def hf_checkpoint(request, tmp_path_factory):
    return build_hf_checkpoint(tmp_path_factory.mktemp(f"hf_{request.param}"), request.param)


@pytest.fixture(scope="session")
def untied_checkpoint(tmp_path_factory):
    return build_hf_checkpoint(tmp_path_factory.mktemp("hf_untied"), False, seed=1)


@pytest.fixture(scope="session")
def untied_model(untied_checkpoint):
    from matpo_jax.model import load_pretrained
    return load_pretrained(untied_checkpoint.path)



@pytest.fixture(scope="session")
def jit_apply():
    """apply(model, "method", *args): the model method compiled once per (model structure, method,
    argument shapes), through nnx.split/merge; much faster than eager op-by-op dispatch."""
    import functools

    import jax
    from flax import nnx

    @functools.lru_cache(maxsize=None)
    def compiled(graphdef, method):
        return jax.jit(lambda state, *args: getattr(nnx.merge(graphdef, state), method)(*args))

    def apply(model, method, *args):
        graphdef, state = nnx.split(model)
        return compiled(graphdef, method)(state, *args)

    return apply
