"""Issue 48 item 2 at the third reader of another run's checkpoint, `sft.init_checkpoint` (RL runs
sharing one SFT start): the start is refused when it was trained with another tokenizer than the
run's, and a damaged newest checkpoint there is skipped without moving anything in the other
run's directory (item 10). Real Orbax checkpoints, real trained tokenizers."""
from __future__ import annotations

import dataclasses
import os

import jax.numpy as jnp
import numpy as np
import pytest

from matpo_jax.chat import ChatFormat
from matpo_jax.chat.tokenizer_training import train_tokenizer
from matpo_jax.config import apply_overrides, base_config
from matpo_jax.run import provenance
from matpo_jax.run.sft import restore_shared_start
from matpo_jax.trainer.checkpoint import Checkpointer


@dataclasses.dataclass
class State:
    params: dict

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def params(value: float) -> dict:
    return {"embed": jnp.full((16, 8), value, jnp.float32)}


def test_a_shared_start_of_another_tokenizer_is_refused_and_damage_is_skipped(
        tmp_path, tokenizer_dir):
    start = tmp_path / "start" / "checkpoints" / "sft"
    cfg = apply_overrides(base_config(), {"sft.init_checkpoint": str(start),
                                          "model.tokenizer": str(tokenizer_dir)})
    ours = ChatFormat.from_pretrained(tokenizer_dir)
    identity = {provenance.IDENTITY_KEY: provenance.checkpoint_identity(cfg, ours)}
    with Checkpointer(start, async_save=False) as checkpoints:
        for step in (3, 4):
            checkpoints.save(step, params=params(step), opt_state={"n": jnp.zeros(())},
                             metadata=identity, force=True)
    for f in (start / "4" / "params").rglob("*"):  # the newest one's arrays cut in half
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    restored = restore_shared_start(cfg, State(params(0.0)), ours)
    np.testing.assert_array_equal(np.asarray(restored.params["embed"]), 3.0)
    assert sorted(os.listdir(start)) == ["3", "4"]  # the other run's directory as it was

    other_dir = tmp_path / "other_tokenizer"
    train_tokenizer(["Zebra quartz vexes jumpy foxes near the old mill."] * 40,
                    vocab_size=512, out_dir=other_dir)
    theirs = apply_overrides(cfg, {"model.tokenizer": str(other_dir)})
    with pytest.raises(provenance.ArtifactMismatch) as refused:
        restore_shared_start(theirs, State(params(0.0)), ChatFormat.from_pretrained(other_dir))
    message = str(refused.value)
    assert "\n" not in message and f"sft.init_checkpoint={start} (step 3)" in message
    assert f"model.tokenizer = '{tokenizer_dir}' vs '{other_dir}'" in message
