"""LoRA adapters (model/lora.py) in Hugging Face PEFT's format, and merged into the base.

PEFT's LoRA layout, per adapter directory: `adapter_config.json` (peft_type LORA, r,
lora_alpha, target_modules, ...) and `adapter_model.safetensors` with, for every adapted
projection, `base_model.model.<module>.lora_A.weight` [r, in] and `...lora_B.weight` [out, r]
(torch's Linear layout: [out_features, in_features]), <module> being the base's own tensor name
less `.weight` (e.g. `model.layers.0.self_attn.q_proj`). PEFT applies y = W x + (alpha / r) B A x,
the update ours computes (A = our lora_a[n].T, B = our lora_b[n].T). Per-role adapters are
written as one such directory per role: two PEFT adapters of one base, which PEFT loads side by
side (`PeftModel.from_pretrained(base, dir/planner, adapter_name="planner")`, then
`load_adapter(dir/worker, adapter_name="worker")`).
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from matpo_jax import parallel
from matpo_jax.model import lora as lora_lib
from matpo_jax.model.hf_io import hf_name

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


def _adapted_projections(model):
    """(hf module name, lora_a [n, in, r], lora_b [n, r, out]) of every adapted projection."""
    out = []
    for path, linear in nnx.iter_graph(model):
        if isinstance(linear, nnx.Module) and hasattr(linear, "lora_a"):
            kernel_path = "/".join(str(p) for p in path) + "/kernel"
            module = hf_name(kernel_path)[:-len(".weight")]
            out.append((module, np.asarray(jax.device_get(linear.lora_a[...]), np.float32),
                        np.asarray(jax.device_get(linear.lora_b[...]), np.float32)))
    return out


def adapter_config(lora: lora_lib.LoRAConfig, base_model: str | None) -> dict:
    """adapter_config.json of one adapter (PEFT's LoraConfig fields that matter for loading)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank,
            "lora_alpha": lora.alpha, "target_modules": sorted(lora.targets),
            "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
            "use_dora": False, "init_lora_weights": True, "modules_to_save": None,
            "inference_mode": True, "base_model_name_or_path": base_model}


def save_peft_adapters(model, path: str, base_model: str | None = None) -> dict[str, str]:
    """Writes the model's adapters in PEFT's format under `path`: the shared adapter in `path`
    itself, per-role adapters in `path/<role>` (planner, worker). Returns {adapter: directory}.
    base_model: the base's directory or hub name (adapter_config's base_model_name_or_path)."""
    lora = lora_lib.lora_of(model)
    if lora is None:
        raise ValueError("save_peft_adapters: the model has no LoRA adapters (model.lora.rank=0)")
    projections = _adapted_projections(model)
    names = lora.adapter_names()
    written = {}
    for index, name in enumerate(names):
        directory = path if len(names) == 1 else os.path.join(path, name)
        tensors = {}
        for module, a, b in projections:
            tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = np.ascontiguousarray(a[index].T)
            tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = np.ascontiguousarray(b[index].T)
        written[name] = directory
        if jax.process_index() != 0:
            continue
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, ADAPTER_CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(adapter_config(lora, base_model), f, indent=2)
        save_file(tensors, os.path.join(directory, ADAPTER_WEIGHTS_FILE),
                  metadata={"format": "pt"})
    return written


def merged_params(model, role: int = 0):
    """The nnx.Param state of `model` with role `role`'s adapter folded into each adapted kernel
    (W + (alpha / r) A B): what `hf_io.save_params` writes as a plain Hugging Face model."""
    lora = lora_lib.lora_of(model)
    params = nnx.state(model, nnx.Param)
    if lora is None:
        return params
    adapter = lora.role_adapters[role]
    merged = {}
    for path, linear in nnx.iter_graph(model):
        if isinstance(linear, nnx.Module) and hasattr(linear, "lora_a"):
            a, b = linear.lora_a[...][adapter], linear.lora_b[...][adapter]
            kernel = linear.kernel[...]
            update = (a.astype(np.float32) @ b.astype(np.float32)) * lora.scale
            merged["/".join(str(p) for p in path) + "/kernel"] = (
                kernel.astype(np.float32) + update).astype(kernel.dtype)

    def fold(key_path, leaf):
        return merged.get(parallel.path_to_str(key_path), leaf)

    return jax.tree_util.tree_map_with_path(fold, params)
