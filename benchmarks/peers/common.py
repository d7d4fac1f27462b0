"""What both sides of a peer comparison share: the model shapes, one random-init Hugging Face
checkpoint directory per shape, the prompts, and interleaved timing.

The checkpoint is written once by our `save_pretrained` (config.json + model.safetensors, the
layout transformers reads) and then loaded by each side's own loader: matpo_jax's
`load_pretrained` and tunix's `qwen3.params.create_model_from_safe_tensors`. Neither side sees the
other's in-memory weights, so a cross-check that passes also checks both loaders.
"""
from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np
from flax import nnx

from matpo_jax.model import DecoderConfig, CausalLM, save_pretrained

# The shapes of benchmarks/sampler.py (GQA, untied head, like the Qwen3 family).
SIZES = {
    "4M": dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "30M": dict(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=4, head_dim=64),
}


def write_checkpoint(size: str, path: str, seed: int = 0) -> str:
    """A random-init Qwen3 of `size` saved as a HF directory at `path` (reused if present)."""
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        model = CausalLM(DecoderConfig(**SIZES[size]), rngs=nnx.Rngs(seed))
        save_pretrained(model, path)
    return path


def prompts(batch: int, length: int, vocab: int, seed: int = 0) -> np.ndarray:
    """[batch, length] int32 token ids in [1, vocab): random ids, the same on both sides."""
    return np.random.default_rng(seed).integers(1, vocab, (batch, length)).astype(np.int32)


def interleaved_medians(runs: dict, repeats: int) -> dict:
    """Median wall seconds of each named zero-argument run, after one warm-up call each, the runs
    alternating in every repeat so that load from other processes on a shared machine hits all
    sides alike. Returns name -> dict(median, min, all)."""
    for run in runs.values():
        run()
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: dict(median=statistics.median(t), min=min(t), all=t) for name, t in times.items()}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def write_results(out: str, name: str, result: dict, markdown: str) -> None:
    """<out>/<name>.json (everything) and <out>/<name>.md (the table), as every peer script
    leaves its results."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(markdown)
