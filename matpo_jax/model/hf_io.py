"""Hugging Face checkpoints (config.json + safetensors) of the Qwen3, Llama and Qwen2 families <->
our nnx model.

Loading never materialises random weights: the model is built abstractly (nnx.eval_shape) and each
tensor is read from its safetensors file and placed directly on its target sharding, so a model
larger than one device loads onto a mesh.
"""
from __future__ import annotations

import json
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from safetensors import safe_open
from safetensors.numpy import save_file

from matpo_jax import parallel
from matpo_jax.model.config import ModelConfigError, DecoderConfig
from matpo_jax.model.decoder import CausalLM

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# Checkpoint tensors that carry no information for us (recomputed or tied).
_IGNORED_TENSOR_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointFormatError(ValueError):
    """A checkpoint directory we cannot load; the message names the file, field or tensor."""


def hf_name(path: str) -> str:
    """Our parameter path -> the HF tensor name, e.g. 'layers/0/mlp/up_proj/kernel' ->
    'model.layers.0.mlp.up_proj.weight' (a bias keeps its name; kernels, scales and the
    embedding are torch's 'weight')."""
    *module, leaf = path.split("/")
    prefix = "" if module[0] == "lm_head" else "model."
    return prefix + ".".join(module) + (".bias" if leaf == "bias" else ".weight")


def _is_kernel(path: str) -> bool:
    """Linear kernels are stored [in, out] here and [out, in] in torch."""
    return path.endswith("/kernel")


# ----------------------------------------------------------------------------- loading


def load_config(path: str, **overrides) -> DecoderConfig:
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isdir(path):
        raise CheckpointFormatError(f"checkpoint directory {path!r} does not exist")
    if not os.path.isfile(config_path):
        raise CheckpointFormatError(f"{config_path}: missing; a checkpoint needs config.json")
    try:
        with open(config_path) as f:
            hf_config = json.load(f)
    except json.JSONDecodeError as err:
        raise CheckpointFormatError(f"{config_path}: not valid JSON ({err})") from err
    try:
        return DecoderConfig.from_hf_dict(hf_config, **overrides)
    except ModelConfigError as err:
        raise CheckpointFormatError(f"{config_path}: {err}") from err


def _tensor_files(path: str) -> dict[str, str]:
    """Tensor name -> safetensors file, from the index when there is one, else by listing files."""
    index_path = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index_path):
        with open(index_path) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointFormatError(f"{index_path}: missing 'weight_map'")
        files = {name: os.path.join(path, file) for name, file in weight_map.items()}
        for file in sorted(set(files.values())):
            if not os.path.isfile(file):
                raise CheckpointFormatError(f"{index_path}: lists {file!r}, which does not exist")
        return files
    shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not shards:
        raise CheckpointFormatError(f"{path}: no *.safetensors files")
    files = {}
    for shard in shards:
        with safe_open(os.path.join(path, shard), framework="numpy") as f:
            files.update({name: os.path.join(path, shard) for name in f.keys()})
    return files


class _TensorReader:
    """Keeps each safetensors file open once while tensors are read from it."""

    def __init__(self, files: dict[str, str]):
        self.files = files
        self._open = {}

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name).get_slice(name).get_shape())

    def read(self, name: str) -> np.ndarray:
        return self._handle(name).get_tensor(name)

    def _handle(self, name):
        file = self.files[name]
        if file not in self._open:
            self._open[file] = safe_open(file, framework="numpy")
        return self._open[file]


def load_pretrained(path: str, dtype: str = "float32", mesh: jax.sharding.Mesh | None = None,
                    rules: Sequence | None = None,
                    param_dtype: str = "float32",
                    attention: dict[str, str] | None = None) -> CausalLM:
    """Loads a HF checkpoint directory (Qwen3, Llama or Qwen2). `param_dtype` is the dtype the
    parameters are stored in (each tensor is cast to it whatever its dtype in the file: a bfloat16 release loads as
    float32 master weights, or stays bfloat16); `dtype` is the compute dtype of activations (and
    of the KV cache). With a mesh, each tensor goes straight to its partition-rule sharding.
    `attention`: the DecoderConfig's attention_<path> fields (default: "auto" for each)."""
    config = load_config(path, dtype=dtype, param_dtype=param_dtype, **(attention or {}))
    files = _tensor_files(path)
    reader = _TensorReader(files)
    graphdef, abstract_state = nnx.split(
        nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0))))

    expected_names = set()

    def load_leaf(key_path, abstract):
        param_path = parallel.path_to_str(key_path)
        name = hf_name(param_path)
        expected_names.add(name)
        if name not in files:
            raise CheckpointFormatError(f"{path}: missing tensor '{name}' (parameter {param_path})")
        hf_shape = tuple(abstract.shape[::-1]) if _is_kernel(param_path) else tuple(abstract.shape)
        found = reader.shape(name)
        if found != hf_shape:
            raise CheckpointFormatError(
                f"{files[name]}: tensor '{name}' has shape {found}, expected {hf_shape}")
        array = reader.read(name).astype(abstract.dtype, copy=False)
        if _is_kernel(param_path):
            array = array.T
        if mesh is None:
            return jnp.asarray(array)
        sharding = parallel.sharding_for(param_path, array.shape, mesh,
                                         parallel.PARTITION_RULES if rules is None else rules)
        # Each device (on every host) receives only its own slice of the host array.
        return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

    state = jax.tree_util.tree_map_with_path(load_leaf, abstract_state)
    unexpected = sorted(
        name for name in files
        if name not in expected_names and not name.endswith(_IGNORED_TENSOR_SUFFIXES)
        and not (config.tie_word_embeddings and name == "lm_head.weight"))
    if unexpected:
        raise CheckpointFormatError(
            f"{path}: unexpected tensors for this config: {', '.join(unexpected[:5])}"
            + (f" (+{len(unexpected) - 5} more)" if len(unexpected) > 5 else ""))
    return nnx.merge(graphdef, state)


# ----------------------------------------------------------------------------- saving


def _to_host(array: jax.Array) -> np.ndarray:
    if isinstance(array, jax.Array) and not array.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(array, tiled=True))
    return np.asarray(jax.device_get(array))


def save_pretrained(model: CausalLM, path: str, dtype: str | None = None) -> None:
    """Writes config.json + model.safetensors that transformers loads as the same family.
    Every process gathers the weights; only process 0 writes. `dtype`: the tensors' dtype on
    disk (default: the parameters')."""
    save_params(model.config, nnx.state(model, nnx.Param), path, dtype)


def save_params(config: DecoderConfig, params, path: str, dtype: str | None = None) -> None:
    """save_pretrained from a config and its parameter tree (nnx.State of the nnx.Param
    variables), e.g. parameters restored from a training checkpoint without building the model."""
    if dtype is not None:
        config = config.replace(param_dtype=dtype)
    tensors = {}
    for key_path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        param_path = parallel.path_to_str(key_path)
        array = _to_host(leaf).astype(config.param_dtype, copy=False)
        tensors[hf_name(param_path)] = np.ascontiguousarray(
            array.T if _is_kernel(param_path) else array)
    if jax.process_index() != 0:
        return
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(config.to_hf_dict(), f, indent=2)
    # transformers refuses safetensors files without a framework tag.
    save_file(tensors, os.path.join(path, WEIGHTS_FILE), metadata={"format": "pt"})
