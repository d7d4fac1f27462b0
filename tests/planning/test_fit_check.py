"""`train` refuses a config that cannot fit the chips before any work: the analytic fit check
(planning/fit.py) on a tiny config laid out over the 8 simulated CPU devices against small
pretend per-chip budgets, and the one-line refusal through the train entry point."""
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from matpo_jax import parallel
from matpo_jax.config import ConfigError, load_config_file, to_typed
from matpo_jax.planning import fit, step_plan
from matpo_jax.run.fit_check import check_config_fits
from matpo_jax.run.plan_inputs import plan_inputs
from matpo_jax.run.runtime import make_mesh, model_config
from fixtures.xla import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "synthetic_tiny.py")
GIB = 2 ** 30


def tiny(decode_slots=32, **mesh):
    c = load_config_file(TINY)
    c.rollout.decode_slots = decode_slots
    c.mesh.update(**mesh)
    return to_typed(c, check_files=False)


def test_the_figures_are_the_sharded_layout_of_parameters_moments_and_kv_cache():
    cfg = tiny(decode_slots=32, data=1, fsdp=4, tensor=2)
    estimate = check_config_fits(cfg, GIB)
    assert estimate is not None
    _, params, _ = step_plan.abstract_model(model_config(cfg.model))
    # Every parameter, its own float32 bytes, cut by the shards the partition rules give it.
    whole = sum(math.prod(p.shape) * np.dtype(p.dtype).itemsize for p in jax.tree.leaves(params))
    assert whole / 8 <= estimate.parameters < whole  # split (FSDP x tensor), norms whole
    assert estimate.gradients == estimate.parameters
    assert 2 * estimate.parameters <= estimate.optimizer_state <= 2 * estimate.parameters + 64
    arch = cfg.model.arch
    # 32 slots over data x fsdp = 4: 8 per chip; kv heads over tensor = 2; K and V in bfloat16.
    per_slot = (arch.num_hidden_layers * arch.num_key_value_heads // 2 * arch.head_dim
                * cfg.rollout.max_context * 2 * np.dtype(cfg.model.dtype).itemsize)
    assert estimate.kv_cache == 8 * per_slot
    assert estimate.slots_that_fit >= 32


def test_too_many_decode_slots_are_refused_in_one_line_naming_the_fields():
    cfg = tiny(decode_slots=32)  # fsdp over all 8 devices
    roomy = check_config_fits(cfg, GIB)
    per_slot = (roomy.kv_cache + roomy.slot_buffers) // 4  # 4 slots per chip
    budget = roomy.parameters + roomy.optimizer_state + roomy.gradients + 2 * per_slot
    with pytest.raises(ConfigError) as refused:
        check_config_fits(cfg, budget)
    message = str(refused.value)
    assert "\n" not in message and len(refused.value.problems) == 1
    assert message.startswith("rollout.decode_slots=32 cannot fit")
    assert "rollout.max_context=1024" in message and "mesh data=1, fsdp=8, tensor=1" in message
    assert "16 slots fit" in message  # 2 per chip x 8 shards: the count the check then accepts
    assert check_config_fits(tiny(decode_slots=16), budget).slots_that_fit == 16


def test_a_paged_cache_counts_its_pool_of_pages_not_slots_times_context():
    c = load_config_file(TINY)
    c.rollout.decode_slots, c.rollout.kv_cache, c.rollout.kv_page_size = 32, "paged", 64
    c.rollout.kv_pages = 64  # 4,096 tokens in flight: a mean 128 a slot of 1,024
    c.mesh.update(data=1, fsdp=1, tensor=2)
    cfg = to_typed(c, check_files=False)
    mesh = make_mesh_over(2, tensor=2)
    estimate = check_config_fits(cfg, GIB, mesh)
    arch = cfg.model.arch
    page = (arch.num_hidden_layers * arch.num_key_value_heads // 2 * arch.head_dim * 64 * 2
            * np.dtype(cfg.model.dtype).itemsize)
    assert estimate.kv_cache == 64 * page  # a dense cache: 32 x 16 pages' worth
    room = estimate.parameters + estimate.optimizer_state + estimate.slot_buffers + 40 * page
    with pytest.raises(ConfigError) as refused:
        check_config_fits(cfg, room, mesh)
    message = str(refused.value)
    assert message.startswith("rollout.kv_pages=64 does not fit: a pool of 64 pages")
    assert "40 pages fit a chip (2,560 tokens in flight, a mean 80 a slot)" in message
    c.rollout.kv_pages = 40
    assert check_config_fits(to_typed(c, check_files=False), room, mesh) is not None
    # Over fsdp=2 each chip holds its batch shard's pool: half the pages, every kv head.
    c.mesh.update(data=1, fsdp=2, tensor=1)
    split = check_config_fits(to_typed(c, check_files=False), GIB, make_mesh_over(2, fsdp=2))
    assert split.kv_cache == 40 // 2 * 2 * page
    assert split.slot_buffers == estimate.slot_buffers // 2
    c.rollout.kv_pages = 41
    with pytest.raises(ConfigError, match=r"rollout\.kv_pages=41 does not split over data x "
                       r"fsdp = 2 pools"):
        check_config_fits(to_typed(c, check_files=False), GIB, make_mesh_over(2, fsdp=2))


def make_mesh_over(devices, data=1, fsdp=1, tensor=1):
    return parallel.make_mesh(data=data, fsdp=fsdp, tensor=tensor,
                              devices=jax.devices()[:devices])


def test_a_model_too_large_for_its_chips_names_the_mesh():
    cfg = tiny(decode_slots=8, data=8, fsdp=1, tensor=1)  # parameters replicated on every chip
    roomy = check_config_fits(cfg, GIB)
    with pytest.raises(ConfigError) as refused:
        check_config_fits(cfg, roomy.train_step_minimum - 1)
    problems = refused.value.problems
    assert problems[0].startswith("the train step cannot fit") and "mesh.fsdp" in problems[0]
    assert "mesh data=8, fsdp=1, tensor=1" in problems[0]
    # Rollouts hold no gradients: one slot per chip fits where the gradients would be.
    assert len(problems) == 1
    # The same model spread over the 8 chips fits that budget.
    assert check_config_fits(tiny(decode_slots=8, data=1, fsdp=8),
                             roomy.train_step_minimum - 1) is not None


def test_off_tpu_without_a_budget_there_is_nothing_to_check():
    assert jax.devices()[0].platform == "cpu"
    assert check_config_fits(tiny()) is None


def test_train_stops_before_any_work_with_one_line(tmp_path):
    cfg = tiny()
    roomy = fit.estimate(plan_inputs(cfg), make_mesh(cfg), GIB)
    # Per chip of the one CPU device the subprocess sees: everything on one chip.
    budget_gib = (8 * roomy.train_step_minimum) / GIB  # >= the 1-device figures but no KV cache
    workdir = tmp_path / "run"
    env = dict(os.environ, XLA_FLAGS=xla_flags(), JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-m", "matpo_jax.train", f"--config={TINY}", f"--workdir={workdir}",
         f"--hbm_per_chip_gib={budget_gib}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if "rollout.decode_slots" in line]
    assert len(lines) == 1 and "cannot fit" in lines[0] and "slots fit" in lines[0], done.stderr
    assert not (workdir / "config.json").exists()  # refused before the run wrote anything


def test_with_lora_the_base_stays_resident_but_moments_and_gradients_are_the_adapters():
    full = check_config_fits(tiny(decode_slots=32, data=1, fsdp=4, tensor=2), GIB)
    c = load_config_file(TINY)
    c.rollout.decode_slots = 32
    c.mesh.update(data=1, fsdp=4, tensor=2)
    c.model.lora.rank = 4
    lora = check_config_fits(to_typed(c, check_files=False), GIB)
    inputs = plan_inputs(to_typed(c, check_files=False))
    _, adapters, base = step_plan.abstract_model(inputs.model, inputs.lora)
    adapter_bytes = sum(math.prod(p.shape) * np.dtype(p.dtype).itemsize
                        for p in jax.tree.leaves(adapters))
    # The adapters are replicated: each chip holds them whole, beside its share of the base.
    assert lora.parameters == full.parameters + adapter_bytes
    assert lora.gradients == adapter_bytes < full.gradients
    assert 2 * adapter_bytes <= lora.optimizer_state <= 2 * adapter_bytes + 64
    assert lora.optimizer_state < full.optimizer_state / 4
    # A bfloat16 base (model.lora.base_dtype) holds half a float32 base's bytes; the adapters
    # and everything they need stay as they were.
    c.model.lora.base_dtype = "bfloat16"
    narrow = check_config_fits(to_typed(c, check_files=False), GIB)
    assert narrow.parameters - adapter_bytes == full.parameters // 2
    assert (narrow.gradients, narrow.optimizer_state) == (lora.gradients, lora.optimizer_state)
