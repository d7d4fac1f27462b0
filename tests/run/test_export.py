"""`python -m matpo_jax.export`: an RL checkpoint of a run started from a Qwen3 checkpoint becomes a
Hugging Face directory that transformers loads and generates from, greedily, as our model does."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from matpo_jax import export as export_cli
from matpo_jax.chat import ChatFormat
from matpo_jax.config import apply_overrides, base_config, save_config
from matpo_jax.model import DecoderConfig, load_pretrained
from matpo_jax.run.export import ExportError, abstract_params, restore_params
from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA
from matpo_jax.trainer.checkpoint import Checkpointer

NEW_TOKENS = 8
MESSAGES = [{"role": "system", "content": "You are a worker."},
            {"role": "user", "content": "Where was the founder of Northwind born?"}]


def greedy(model, prompt, jit_apply, steps=NEW_TOKENS):
    """Our model's greedy continuation: one compiled forward over a fixed length (causal, so the
    padding after position t never changes its logits)."""
    tokens = np.zeros((1, len(prompt) + steps), np.int32)
    tokens[0, :len(prompt)] = prompt
    for t in range(len(prompt), len(prompt) + steps):
        tokens[0, t] = int(jnp.argmax(jit_apply(model, "__call__", jnp.asarray(tokens))[0, t - 1]))
    return tokens[0, len(prompt):].tolist()


def test_exported_rl_checkpoint_generates_in_transformers_like_our_model(
        tmp_path, qwen3_checkpoint, jit_apply):
    import torch
    import transformers

    workdir = tmp_path / "run"
    save_config(apply_overrides(base_config(), {"model.hf_checkpoint": qwen3_checkpoint.path}),
                workdir)  # the run's record, as run_experiment writes it
    graphdef, start, rest = nnx.split(load_pretrained(qwen3_checkpoint.path), nnx.Param, ...)
    noise = np.random.RandomState(0)
    trained = jax.tree.map(
        lambda p: p + np.float32(0.05) * noise.standard_normal(p.shape).astype(np.float32), start)
    with Checkpointer(workdir / "checkpoints" / "rl", async_save=False) as checkpoints:
        for step, params in ((1, start), (2, trained)):
            checkpoints.save(step, params=params, opt_state=optax.adam(1e-3).init(params),
                             force=True)
    out = tmp_path / "hf"
    assert export_cli.main(["export", f"--checkpoint={workdir}/checkpoints/rl",
                            f"--out={out}"]) == 0
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= set(os.listdir(out))
    # config.json keeps the source's fields the export does not write (it used to drop them).
    with open(os.path.join(qwen3_checkpoint.path, "config.json")) as f:
        source = json.load(f)
    with open(out / "config.json") as f:
        exported = json.load(f)
    assert set(source) <= set(exported), sorted(set(source) - set(exported))
    for field in ("bos_token_id", "eos_token_id", "pad_token_id", "max_window_layers",
                  "use_cache"):
        assert field in source and exported[field] == source[field], field

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    model = transformers.Qwen3ForCausalLM.from_pretrained(str(out)).eval()
    tools = [SEARCH_SCHEMA, OPEN_SCHEMA]
    prompt = list(tokenizer.apply_chat_template(MESSAGES, tools=tools, add_generation_prompt=True,
                                                tokenize=True, return_dict=False))
    assert prompt == ChatFormat.from_pretrained(out).prompt_ids(MESSAGES, tools=tools)
    prompt = list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True,
                                                tokenize=True, return_dict=False))  # shorter
    with torch.no_grad():
        generated = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS,
                                   min_new_tokens=NEW_TOKENS, do_sample=False)
    theirs = generated[0, len(prompt):].tolist()
    ours = greedy(nnx.merge(graphdef, trained, rest), prompt, jit_apply)
    print(f"\ngreedy tokens: transformers {theirs} ours {ours}")
    assert theirs == ours
    # The newest step's weights were written (not the starting checkpoint's), and --step picks one.
    embed = model.model.embed_tokens.weight.detach().numpy()
    np.testing.assert_allclose(embed, np.asarray(trained["embed_tokens"]["embedding"][...]),
                               atol=1e-6)
    assert export_cli.main(["export", f"--checkpoint={workdir}/checkpoints/rl", "--step=1",
                            f"--out={tmp_path / 'step1'}", "--dtype=bfloat16"]) == 0
    with open(tmp_path / "step1" / "config.json") as f:
        assert json.load(f)["dtype"] == "bfloat16"


def test_restore_params_reads_params_alone_from_either_checkpoint_layout(tmp_path):
    config = DecoderConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    target = abstract_params(config)
    rng = np.random.RandomState(0)
    params = jax.tree.map(lambda a: jnp.asarray(rng.standard_normal(a.shape), a.dtype), target)
    # Layout 1: the trainer's Checkpointer (params / opt_state / meta items).
    with Checkpointer(tmp_path / "items", async_save=False) as checkpoints:
        checkpoints.save(3, params=params, opt_state=optax.adam(1e-3).init(params), force=True)
    # Layout 2: one item holding the whole train state, params a field of it.
    manager = ocp.CheckpointManager(tmp_path / "state")
    manager.save(5, args=ocp.args.Composite(state=ocp.args.StandardSave(
        {"params": params, "opt_state": optax.adam(1e-3).init(params), "step": jnp.int32(5)})))
    manager.wait_until_finished()
    for directory, expected_step in (("items", 3), ("state", 5)):
        step, restored = restore_params(str(tmp_path / directory), target)
        assert step == expected_step
        assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), restored, params))
    with pytest.raises(ExportError, match="no step 4 "):
        restore_params(str(tmp_path / "items"), target, step=4)
    with pytest.raises(ExportError, match="does not exist"):
        restore_params(str(tmp_path / "missing"), target)


def test_export_errors_are_one_line(tmp_path, capsys):
    assert export_cli.main(["export", f"--checkpoint={tmp_path}/checkpoints/rl",
                            f"--out={tmp_path / 'out'}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no config.json in it or its parents" in err
    assert export_cli.main(["export", f"--out={tmp_path / 'out'}"]) == 2  # --checkpoint missing


def test_a_runs_lora_settings_are_read_back_with_or_without_base_dtype(tmp_path):
    from matpo_jax.run import export as export_lib
    lora = {"rank": 4, "alpha": 8.0, "targets": ["q_proj"], "roles": "per_role"}
    for saved, expected in ((lora, None), ({**lora, "base_dtype": "bfloat16"}, "bfloat16")):
        (tmp_path / "config.json").write_text(json.dumps({"model": {"lora": saved}}))
        read = export_lib.lora_config(export_lib.load_run_config(str(tmp_path)))
        assert (read.rank, read.roles, read.targets, read.base_dtype) == (
            4, "per_role", ("q_proj",), expected)
