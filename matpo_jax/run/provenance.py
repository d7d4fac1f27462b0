"""What produced an artifact: the identity a checkpoint carries, and the checks its readers make.

Every training checkpoint's meta item records, under "identity" (`checkpoint_identity`):
    config            the run's config, as its config.json holds it
    config_sha256     sha256 of that config less the fields a resumed run may change
    tokenizer_sha256  sha256 of the tokenizer's ids: its vocabulary (added tokens included) and
                      its special tokens (what a token id means, whatever files hold it)
    base_model        with LoRA only (model.lora.rank > 0; the checkpoint holds the adapters
                      alone): the frozen base they belong to, `base_identity`
Readers check what they pair with the parameters against it: export the run config it found
above the checkpoint and the tokenizer it ships (`check_run_config`, `check_tokenizer`),
evaluate the tokenizer it reads prompts and answers with. An evaluation's results record the
checkpoint they were sampled from (`source_identity`: path, step, the identity's hashes), which a
resume compares. Checkpoints written before identities were recorded have none: readers warn
once and go on as before.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any, Mapping

from matpo_jax.config.configdict import flatten
from matpo_jax.config.errors import ConfigError
from matpo_jax.config.files import config_as_json
from matpo_jax.config.resume import RESUME_SAFE_FIELDS
from matpo_jax.report import files

log = logging.getLogger(__name__)
IDENTITY_KEY = "identity"  # the key of the checkpoint meta's caller metadata
BASE_KEY = "base_model"  # the identity's record of a LoRA run's frozen base
META_ITEM, META_FILE = "meta", "metadata"  # trainer/checkpoint.py's JSON item, as Orbax lays it
SHOWN_CHANGES = 3  # fields a mismatch message names


class ArtifactMismatch(ConfigError):
    """An artifact paired with something other than what produced it (one line naming both)."""


def _sha256(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tokenizer_sha256(tokenizer) -> str:
    """The identity of a Hugging Face tokenizer's ids: every (token, id) and the special tokens.
    Two directories that map ids to the same text have the same hash, whatever their files."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0]))
    special = {name: str(token) for name, token in tokenizer.special_tokens_map.items()}
    return _sha256({"vocab": vocab, "special": special})


def _as_json(config) -> dict:
    """A typed config or ConfigDict as config.json holds it (a JSON dict stays as it is)."""
    return config_as_json(config) if hasattr(config, "to_dict") else dict(config)


def comparable_config(config) -> dict:
    """A config's flat fields (JSON values), less those a resumed run may change
    (config/resume.py)."""
    return {path: value for path, value in flatten(_as_json(config)).items()
            if path not in RESUME_SAFE_FIELDS}


def config_sha256(config: Mapping) -> str:
    return _sha256(comparable_config(config))


def checkpoint_identity(cfg, chat) -> dict:
    """What a run's checkpoints record: its config (typed or as config.json holds it), the
    tokenizer of its chat format and, with LoRA adapters, the base they adapt."""
    as_json = _as_json(cfg)
    identity = {"config": as_json, "config_sha256": config_sha256(as_json),
                "tokenizer_sha256": tokenizer_sha256(chat.tokenizer)}
    base = base_identity(cfg)
    if base is not None:
        identity[BASE_KEY] = base
    return identity


def base_identity(cfg) -> dict | None:
    """The frozen base of a LoRA run (None without adapters): `path` (model.hf_checkpoint,
    absolute; None for a base built from model.arch) and `sha256`: the pinned
    model.hf_checkpoint_sha256 (validation checked the file), else the sha256 of the
    checkpoint's safetensors files in name order; a base built from model.arch is named by the
    hash of its architecture and train.seed, which determine it."""
    flat = flatten(_as_json(cfg))
    if not flat.get("model.lora.rank"):
        return None
    path = flat.get("model.hf_checkpoint")
    if not path:
        built = {k: v for k, v in flat.items() if k.startswith("model.arch.")
                 or k in ("model.param_dtype", "train.seed")}
        return {"path": None, "sha256": _sha256(built)}
    pinned = flat.get("model.hf_checkpoint_sha256")
    return {"path": files.absolute(path),
            "sha256": pinned.lower() if pinned else weights_sha256(path)}


def weights_sha256(directory: str) -> str:
    """sha256 over a Hugging Face directory's *.safetensors files (one file: its own sha256,
    what model.hf_checkpoint_sha256 pins)."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
    digests = []
    for name in names:
        digest = hashlib.sha256()
        with open(os.path.join(directory, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        digests.append(digest.hexdigest())
    return digests[0] if len(digests) == 1 else _sha256(dict(zip(names, digests)))


def check_base(identity: Mapping | None, expected: Mapping | None, *, checkpoint: str) -> None:
    """Adapters restored from `checkpoint` go with the base this run builds: ArtifactMismatch
    naming both when the recorded base differs (a checkpoint without a record is not checked)."""
    if expected is None or identity is None or BASE_KEY not in identity:
        return
    recorded = identity[BASE_KEY]
    if recorded.get("sha256") != expected.get("sha256"):
        raise ArtifactMismatch(
            f"{checkpoint} holds LoRA adapters of another base (path {recorded.get('path')}, "
            f"sha256 {str(recorded.get('sha256'))[:12]}) than this run's model.hf_checkpoint "
            f"(path {expected.get('path')}, sha256 {str(expected.get('sha256'))[:12]})")


def read_identity(directory: str, step: int) -> dict | None:
    """The identity recorded in checkpoint `step` of the Orbax manager `directory`; None when
    the checkpoint predates identities (or its meta is unreadable: restoring will say so)."""
    path = files.run_path(os.path.join(str(directory), str(step), META_ITEM, META_FILE))
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    identity = (meta.get("metadata") or {}).get(IDENTITY_KEY) if isinstance(meta, dict) else None
    return identity if isinstance(identity, dict) else None


def source_identity(checkpoint: str | None, step: int | None,
                    identity: Mapping | None) -> dict:
    """What an evaluation records about the parameters it sampled: the checkpoint's absolute path
    and step, and the hashes its identity holds (None where it has none)."""
    identity = identity or {}
    return {"checkpoint": files.absolute(checkpoint) if checkpoint else None,
            "step": step, "config_sha256": identity.get("config_sha256"),
            "tokenizer_sha256": identity.get("tokenizer_sha256")}


_WARNED: set[str] = set()  # checkpoints already named in a warning (once per process)


def warn_unrecorded(checkpoint: str) -> None:
    if checkpoint in _WARNED:
        return
    _WARNED.add(checkpoint)
    log.warning("%s records no identity (written before checkpoints recorded their run's config "
                "and tokenizer): the pairing is not checked", checkpoint)


def config_differences(recorded: Mapping, other: Mapping, prefixes: tuple[str, ...] = ()
                       ) -> list[str]:
    """'field = recorded vs other' for each comparable field both hold with different values
    (fields only one side has are schema drift between code versions, not another run);
    `prefixes`: only fields under these."""
    a, b = comparable_config(recorded), comparable_config(other)
    return [f"{path} = {a[path]!r} vs {b[path]!r}" for path in sorted(set(a) & set(b))
            if a[path] != b[path] and (not prefixes or path.startswith(prefixes))]


def _named(differences: list[str]) -> str:
    more = len(differences) - SHOWN_CHANGES
    return "; ".join(differences[:SHOWN_CHANGES]) + (f"; and {more} more" if more > 0 else "")


def check_run_config(identity: Mapping | None, saved: Mapping, *, checkpoint: str,
                     config_path: str) -> None:
    """The run config found for a checkpoint is the one that wrote it (ArtifactMismatch naming
    the differing fields otherwise)."""
    if identity is None or "config" not in identity:
        warn_unrecorded(checkpoint)
        return
    differences = config_differences(identity["config"], saved)
    if differences:
        raise ArtifactMismatch(
            f"{checkpoint} was written by another run than the one {config_path} records "
            f"(checkpoint vs config.json: {_named(differences)}); a checkpoint belongs with the "
            "config.json of the workdir it was trained in")


def check_tokenizer(identity: Mapping | None, tokenizer, *, checkpoint: str, source: str,
                    config: Mapping | None = None) -> None:
    """`tokenizer` (from `source`) is the one the checkpoint was trained with; ArtifactMismatch
    otherwise, naming the data and model fields where `config` (the reader's) differs from the
    run's, which is where a tokenizer comes from."""
    if identity is None or not identity.get("tokenizer_sha256"):
        warn_unrecorded(checkpoint)
        return
    ours = tokenizer_sha256(tokenizer)
    if ours == identity["tokenizer_sha256"]:
        return
    where = ""
    if config is not None and "config" in identity:
        differences = config_differences(identity["config"], config, ("data.", "model."))
        if differences:
            where = f"; the run's config vs this one: {_named(differences)}"
    raise ArtifactMismatch(
        f"{checkpoint} was trained with another tokenizer (sha256 "
        f"{identity['tokenizer_sha256'][:12]}) than {source} (sha256 {ours[:12]}): its token ids "
        f"would be read as other text{where}; use the run's own config (its config.json)")
