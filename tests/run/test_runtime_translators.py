"""The typed config reaches the stages as they need it: tool settings in the HTTP requests the
search clients send, every offered rl.schedule as a working optimizer, sft.steps=0 accepted."""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from matpo_jax.config import (ExperimentConfig, ModelSection, RLSection, SFTSection, ToolsSection,
                              TrainSection)
from matpo_jax.config.sections import LoRASection
from matpo_jax.model import lora as lora_lib
from matpo_jax.parallel import make_mesh
from matpo_jax.run import runtime
from matpo_jax.trainer import step as step_lib


def test_search_requests_carry_num_results_and_the_configured_key(scripted_server, respond,
                                                                  monkeypatch):
    hits = {"organic": [{"title": f"T{i}", "link": f"d{i}", "snippet": "s" * 50}
                        for i in range(3)]}
    server = scripted_server(respond(200, hits))
    monkeypatch.setenv("MATPO_TEST_SEARCH_KEY", "secret-1")
    tools = ToolsSection(search_backend="serper", search_url=server.url, num_results=3,
                         api_key_env="MATPO_TEST_SEARCH_KEY", max_response_chars=60, retries=0)
    box = runtime.make_toolbox(tools, "http://127.0.0.1:9")
    result = box.call("search", {"query": "who"})
    _, path, headers, body = server.requests[-1]
    assert path == "/search" and json.loads(body) == {"q": "who", "num": 3}
    assert headers["X-API-KEY"] == "secret-1"
    # Cut at tools.max_response_chars: what rollouts and SFT demonstrations both put in context.
    assert result.ok and len(result.text) == 60 and result.text.startswith("1. T0")
    box.call("search", {"query": "who", "num": 2})  # the model's own number wins
    assert json.loads(server.requests[-1][3])["num"] == 2


def test_local_search_returns_num_results_hits(search_server):
    box = runtime.make_toolbox(ToolsSection(num_results=1), search_server.url)
    text = box.call("search", {"query": "Northwind Company founder"}).text
    assert text.count('(id: "') == 1
    box = runtime.make_toolbox(ToolsSection(num_results=3), search_server.url)
    assert box.call("search", {"query": "Northwind Company founder"}).text.count('(id: "') == 3


def learning_rates(cfg: ExperimentConfig) -> np.ndarray:
    schedule = step_lib.learning_rate_schedule(runtime.optimizer_config(cfg, "rl"))
    updates = cfg.train.steps * cfg.rl.ppo_mini_batches
    return np.array([float(schedule(k)) for k in range(updates)])


@pytest.mark.parametrize("schedule", ["constant", "cosine", "linear"])
def test_every_offered_schedule_builds_a_working_optimizer(schedule):
    cfg = ExperimentConfig(rl=RLSection(lr=1e-3, schedule=schedule, warmup_steps=4,
                                        ppo_mini_batches=2), train=TrainSection(steps=20))
    lrs = learning_rates(cfg)
    np.testing.assert_allclose(lrs[:4], 1e-3 * np.arange(1, 5) / 4, rtol=1e-6)  # warmup
    after = lrs[4:]
    if schedule == "constant":
        np.testing.assert_allclose(after, 1e-3, rtol=1e-6)
    else:  # decays over the run's 40 optimizer updates, to 0 at the last
        assert np.all(np.diff(after) < 0) and after[-1] < 1e-4
        np.testing.assert_allclose(float(step_lib.learning_rate_schedule(
            runtime.optimizer_config(cfg, "rl"))(39)), 0.0, atol=1e-9)
    tx = step_lib.make_optimizer(runtime.optimizer_config(cfg, "rl"))
    params = {"w": np.ones((2, 2), np.float32)}
    updates, _ = tx.update({"w": np.ones((2, 2), np.float32)}, tx.init(params), params)
    assert np.all(np.isfinite(np.asarray(updates["w"])))


def test_constant_without_warmup_is_the_plain_constant_schedule():
    cfg = ExperimentConfig(rl=RLSection(lr=2e-5))
    assert runtime.optimizer_config(cfg, "rl").schedule == "constant"
    np.testing.assert_allclose(learning_rates(cfg), 2e-5, rtol=1e-6)


def test_sft_steps_zero_builds_its_optimizer():
    """The pod config skips SFT (sft.steps=0): its optimizer is still built before the loop."""
    cfg = ExperimentConfig(sft=SFTSection(steps=0))
    step_lib.make_optimizer(runtime.optimizer_config(cfg, "sft"))


def test_sgd_updates_are_lr_times_the_clipped_gradient_plus_decay_on_matrices():
    """rl.optimizer=sgd: the update is proportional to the gradient, which is what lets the
    multi-process test compare topologies at float rounding (Adam's per-coordinate RMS division
    turns gradients of pure rounding noise into lr-sized steps)."""
    cfg = ExperimentConfig(rl=RLSection(optimizer="sgd", lr=0.5, weight_decay=0.1, grad_clip=0))
    tx = step_lib.make_optimizer(runtime.optimizer_config(cfg, "rl"))
    params = {"w": np.full((2, 2), 2.0, np.float32), "scale": np.full((3,), 2.0, np.float32)}
    grads = {"w": np.array([[1e-7, -3.0], [0.0, 1.0]], np.float32),
             "scale": np.array([1e-7, 1.0, -2.0], np.float32)}
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(np.asarray(updates["w"]), -0.5 * (grads["w"] + 0.1 * 2.0), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(updates["scale"]), -0.5 * grads["scale"], rtol=1e-6)


def test_the_config_offers_the_optimizers_the_trainer_builds():
    from matpo_jax.config import sections
    assert sections.OPTIMIZERS == step_lib.OPTIMIZERS
    for name in step_lib.OPTIMIZERS:
        step_lib.make_optimizer(step_lib.OptimizerConfig(optimizer=name))


def test_the_config_offers_the_attention_kernels_the_decoder_runs():
    from matpo_jax.config import sections
    from matpo_jax.model.config import ATTENTION_KERNELS
    assert (sections.ATTENTION_TRAIN, sections.ATTENTION_EXTEND, sections.ATTENTION_DECODE) == (
        ATTENTION_KERNELS["train"], ATTENTION_KERNELS["extend"], ATTENTION_KERNELS["decode"])
    section = sections.AttentionSection(train="splash", extend="xla", decode="auto")
    config = runtime.model_config(sections.ModelSection(attention=section))
    assert (config.attention_train, config.attention_extend, config.attention_decode) == (
        "splash", "xla", "auto")


def test_the_config_offers_the_model_families_the_decoder_builds():
    from matpo_jax.config import sections
    from matpo_jax.model.config import FAMILIES
    assert sections.MODEL_FAMILIES == tuple(FAMILIES)


def test_lora_is_off_by_default_and_built_over_the_model_when_on():
    assert runtime.lora_config(ExperimentConfig().model) is None  # default: full fine-tuning
    cfg = ExperimentConfig(model=ModelSection(lora=LoRASection(rank=2, alpha=4.0,
                                                               roles="per_role")))
    lora = runtime.lora_config(cfg.model)
    assert (lora.rank, lora.alpha, lora.roles, lora.num_adapters) == (2, 4.0, "per_role", 2)
    model = runtime.build_model(cfg, make_mesh(devices=jax.devices()[:1]))
    assert lora_lib.lora_of(model) == lora
    _, adapters, _ = lora_lib.split_trainable(model)
    # every targeted projection of every layer, A and B
    layers = cfg.model.arch.num_hidden_layers
    assert len(jax.tree.leaves(adapters)) == 2 * len(lora.targets) * layers
    # model.lora.base_dtype reaches the model: a bfloat16 base under float32 adapters.
    cfg = ExperimentConfig(model=ModelSection(lora=LoRASection(rank=2, base_dtype="bfloat16")))
    model = runtime.build_model(cfg, make_mesh(devices=jax.devices()[:1]))
    _, adapters, base = lora_lib.split_trainable(model)
    assert {x.dtype.name for x in jax.tree.leaves(base)} == {"bfloat16"}
    assert {x.dtype.name for x in jax.tree.leaves(adapters)} == {"float32"}
