"""The plan command's library: a tiny train step and decode step compiled by libtpu for a v5e 2x2
slice on this CPU machine, per-chip memory accounted from the shardings, a decode batch that does
not fit detected (XLA's out-of-memory answer) and the slots that do fit compiled; configs translate
into plan inputs; the markdown table reads the JSON."""
import dataclasses
import json
import math

import jax
import numpy as np
import pytest

from matpo_jax.config import load_config_file, to_typed
from matpo_jax.model import DecoderConfig
from matpo_jax.planning import report, step_plan
from matpo_jax.planning.topology import CHIPS, TopologyError, parse_topology
from matpo_jax.run.plan_inputs import plan_inputs
from matpo_jax.trainer import step as ts
from fixtures.losses import default_loss

LOSS = default_loss()  # the default experiment's loss

CONFIG = DecoderConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, dtype="bfloat16")


def test_topology_names():
    v5p = parse_topology("v5p-128")  # TensorCores: 64 chips
    assert (v5p.chips, v5p.libtpu_name, v5p.chip) == (64, "v5p:4x4x4", CHIPS["v5p"])
    assert parse_topology("v5e-64").libtpu_name == "v5e:8x8"
    assert parse_topology("v5litepod-8").libtpu_name == "v5e:2x4"
    assert parse_topology("v5e:2x2").chips == 4
    with pytest.raises(TopologyError, match="v5e-3"):
        parse_topology("v5e-3")
    with pytest.raises(TopologyError, match="'h100-8'"):
        parse_topology("h100-8")


def test_configs_translate_into_plan_inputs():
    inputs = plan_inputs(to_typed(load_config_file("configs/qwen3_14b_musique.py"), check_files=False))
    assert (inputs.model.hidden_size, inputs.model.num_hidden_layers) == (5120, 40)
    assert not inputs.model.tie_word_embeddings and inputs.model.dtype == "bfloat16"
    assert (inputs.rows, inputs.row_length, inputs.max_context) == (16, 40960, 40960)
    assert inputs.step.remat == "full" and inputs.step.scan_layers
    small = plan_inputs(to_typed(load_config_file("configs/qwen3_0_6b_musique.py"), check_files=False), remat="dots",
                        micro_batches=4)
    assert small.model.tie_word_embeddings and small.model.hidden_size == 1024
    assert (small.step.remat, small.step.micro_batches) == ("dots", 4)
    # Training packs shared prompts by default (rl.share_prompts): the planned batch then
    # carries prefix_ids, as every training batch does.
    assert inputs.share_prompts
    config = load_config_file("configs/qwen3_14b_musique.py")
    config.rl.share_prompts = False
    assert not plan_inputs(to_typed(config, check_files=False)).share_prompts


def test_a_train_step_with_shared_prompts_compiles_the_prefix_rule_with_splash():
    """rl.share_prompts: the batch has prefix_ids and splash runs the shared-prompt rule (two
    kernel calls merged) per chip; compiled for a v5e 2x2 slice."""
    pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu: pip install -e .[tpu]")
    inputs = step_plan.PlanInputs(
        model=CONFIG, mesh_shape=dict(data=1, fsdp=-1, tensor=1), rows=4, row_length=256,
        step=ts.TrainStepConfig(remat="full", scan_layers=True, loss=LOSS),
        optimizer=ts.OptimizerConfig(), decode_slots=4, max_context=256, share_prompts=True)
    train = step_plan.make_plan(inputs, parse_topology("v5e:2x2"), decode=False)["train_step"]
    assert train["attention"] == {"train": "splash"} and train["shared_prompts"]
    assert train["memory_per_chip"]["compiled"] and train["fits"]
    # The batch holds the prefix ids: one more [rows, length] int32 array, a quarter per chip.
    plain = step_plan.make_plan(dataclasses.replace(inputs, share_prompts=False),
                                parse_topology("v5e:2x2"), decode=False)["train_step"]
    assert not plain["shared_prompts"]
    assert train["memory_per_chip"]["batch"] - plain["memory_per_chip"]["batch"] == 4 * 256 * 4 // 4


@pytest.fixture(scope="module")
def tiny_plan():
    pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu: pip install -e .[tpu]")
    inputs = step_plan.PlanInputs(
        model=CONFIG, mesh_shape=dict(data=1, fsdp=-1, tensor=1), rows=4, row_length=128,
        step=ts.TrainStepConfig(remat="full", scan_layers=True, temperature=0.7, loss=LOSS),
        optimizer=ts.OptimizerConfig(), decode_slots=128, max_context=2 ** 23)
    return step_plan.make_plan(inputs, parse_topology("v5e:2x2"))


def test_train_step_compiles_and_memory_adds_up(tiny_plan):
    plan = tiny_plan
    assert (plan["chips"], plan["hosts"], plan["mesh"]) == (4, 1, dict(data=1, fsdp=4, tensor=1))
    train = plan["train_step"]
    memory = train["memory_per_chip"]
    assert memory["compiled"] and train["fits"]
    _, params, _ = step_plan.abstract_model(CONFIG)
    # FSDP over 4 chips: every matrix in quarters, the norm scales whole (float32 master weights).
    expected = sum(4 * math.prod(p.shape) // (4 if p.ndim >= 2 else 1)
                   for p in jax.tree.leaves(params))
    assert memory["parameters"] == expected
    assert 2 * expected <= memory["optimizer_state"] <= 2 * expected + 64  # Adam's mu and nu
    assert memory["arguments"] >= expected + memory["optimizer_state"]
    assert memory["peak"] >= memory["arguments"] and memory["temporaries"] > 0
    assert train["tokens"] == 4 * 128 and train["hardware_flops"] > train["model_flops"] > 0
    assert train["step_time_s_at_mfu"] == pytest.approx(
        train["model_flops"] / (4 * CHIPS["v5e"].peak_bf16_flops * 0.4))


def test_auto_attention_resolves_for_the_tpu_and_the_plan_says_what_ran(tiny_plan):
    # Planned from a CPU host, but for TPU chips: model.attention.train=auto is splash (per
    # chip, under shard_map), decode has only xla; each step records what it traced.
    assert CONFIG.attention_train == "auto" and jax.default_backend() == "cpu"
    assert tiny_plan["train_step"]["attention"] == {"train": "splash"}
    assert tiny_plan["decode_step"]["attention"] == {"decode": "xla"}
    assert "attention splash" in "\n".join(step_plan.summary_lines(tiny_plan))
    # The decode step's estimate from XLA's cost analysis (its layers are unrolled).
    decode = tiny_plan["decode_step_fitting_slots"]
    cost = decode["cost_analysis_per_chip"]
    assert cost["bytes_accessed"] > 0 and cost["flops"] > 0
    assert decode["step_time_s_estimate_cost_analysis"] == pytest.approx(max(
        cost["flops"] / CHIPS["v5e"].peak_bf16_flops,
        cost["bytes_accessed"] / CHIPS["v5e"].hbm_bandwidth))


def test_decode_slots_that_do_not_fit_are_found_and_the_fitting_count_compiles(tiny_plan):
    decode = tiny_plan["decode_step"]
    # 128 slots x 2^23 tokens: K and V of 1 layer, 2 kv heads x 16, bfloat16, a quarter per chip.
    kv = decode["memory_per_chip"]["kv_cache"]
    assert kv == 128 // 4 * 2 * 2 * 16 * 2 ** 23 * 2 + 128 // 4 * 4  # + the lengths
    assert kv > CHIPS["v5e"].hbm_bytes and not decode["fits"]
    assert not decode["memory_per_chip"]["compiled"]
    assert "RESOURCE_EXHAUSTED" in decode["memory_per_chip"]["xla_message"]
    assert 0 < decode["slots_that_fit"] < 128
    tried = tiny_plan["decode_slots_tried"]
    assert tried[0]["slots"] == decode["slots_that_fit"] and len(tried) <= 3
    assert all(t["slots"] < 128 and t["slots"] % 4 == 0 for t in tried)
    fitting = tiny_plan["decode_step_fitting_slots"]  # the largest count that compiled and fits
    assert fitting["fits"] and fitting["memory_per_chip"]["compiled"]
    assert fitting["slots"] == max(t["slots"] for t in tried if t["fits"])
    assert fitting["peak_with_optimizer_state"] <= CHIPS["v5e"].hbm_bytes


def test_markdown_table_reads_the_plan(tiny_plan, tmp_path):
    plan = dict(tiny_plan, config="tiny.py", command="python -m matpo_jax.plan ...")
    (tmp_path / "plan_tiny_v5e_2x2.json").write_text(json.dumps(step_plan.as_json_ready(plan)))
    text = report.write_markdown(tmp_path).read_text()
    # The short table (the README's) first: the train step fits, the configured decode batch
    # does not, and the slot count that compiled and fits is named.
    short = next(line for line in text.splitlines() if line.startswith("| tiny |")).split(" | ")
    assert short[1:3] == ["v5e:2x2 (4)", "1, 4, 1"] and short[7] == "yes"
    assert short[8].startswith("**no**")
    assert short[9] == f"{plan['decode_step_fitting_slots']['slots']} (compiled)"
    row = next(line for line in text.splitlines() if line.startswith("| tiny.py"))
    assert "| v5e:2x2 | 1, 4, 1 | 4 x 128, 1 micro (full) |" in row
    assert row.count("**no**") == 1  # the train step fits, the configured decode batch does not
    assert np.isfinite(float(row.split("|")[5]))
    assert row.split("|")[-2].strip() == short[-1].strip(" |") == "splash"  # attention (train)
    # The decode slots that do fit, compiled, on the row below.
    fitting = text.splitlines()[text.splitlines().index(row) + 1]
    assert fitting.startswith("| ... what fits") and "**no**" not in fitting
    assert f"| {plan['decode_step_fitting_slots']['slots']} x {2 ** 23} |" in fitting


def test_markdown_sets_a_kernel_plan_beside_the_xla_plan_of_the_same_config(tiny_plan, tmp_path):
    after = step_plan.as_json_ready(dict(tiny_plan, config="tiny.py"))
    before = json.loads(json.dumps(after))
    before["train_step"].pop("attention")  # a plan made before the plan recorded it: xla
    before["train_step"]["memory_per_chip"]["peak"] += 2 ** 30
    for name, plan in (("plan_tiny.json", before), ("plan_tiny_splash.json", after)):
        (tmp_path / name).write_text(json.dumps(plan))
    text = report.write_markdown(tmp_path).read_text()
    row = next(line for line in text.splitlines()
               if line.startswith("| tiny.py | v5e:2x2 | xla (not recorded) -> splash |"))
    peak = after["train_step"]["memory_per_chip"]["peak"]
    assert f"| {(peak + 2 ** 30) / 2 ** 30:.2f} -> {peak / 2 ** 30:.2f} |" in row
    assert "Decode step times estimated from XLA's cost analysis" in text


def test_a_mesh_axis_that_splits_a_torus_axis_is_laid_out():
    """The 14B config's fsdp 8 x tensor 8 on a v5p-128 (4x4x4 chips): 8 is no product of whole
    torus axes, which jax.make_mesh refuses; parallel.make_mesh splits one instead."""
    pytest.importorskip("libtpu", reason="TPU topologies need libtpu: pip install -e .[tpu]")
    from matpo_jax import parallel
    devices = parse_topology("v5p-128").devices()
    mesh = parallel.make_mesh(dict(data=1, fsdp=-1, tensor=8), devices=devices)
    assert dict(mesh.shape) == dict(data=1, fsdp=8, tensor=8)
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)


def test_a_one_chip_slice_is_laid_out():
    """v5e-1 (a Colab TPU v5e runtime's one chip): smaller than libtpu's 2x2 host, which it
    refuses unless told the host is that one chip."""
    pytest.importorskip("libtpu", reason="TPU topologies need libtpu: pip install -e .[tpu]")
    topology = parse_topology("v5e-1")
    assert (topology.chips, topology.libtpu_name) == (1, "v5e:1x1")
    devices = topology.devices()
    assert len(devices) == 1 and devices[0].device_kind == "TPU v5 lite"
    assert len(parse_topology("v5e-8").devices()) == 8  # whole hosts: laid out as before


def test_a_lora_train_step_compiles_with_the_base_frozen():
    """Per-role LoRA: the train step compiles; the base is resident but only the adapters have
    optimizer moments and a gradient accumulator."""
    pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu: pip install -e .[tpu]")
    from matpo_jax.model import lora as lora_lib
    lora = lora_lib.LoRAConfig(rank=4, alpha=8.0, roles="per_role")
    inputs = step_plan.PlanInputs(
        model=CONFIG, mesh_shape=dict(data=1, fsdp=4, tensor=1), rows=4, row_length=128,
        step=ts.TrainStepConfig(remat="full", scan_layers=True, loss=LOSS),
        optimizer=ts.OptimizerConfig(), decode_slots=8, max_context=256, lora=lora)
    plan = step_plan.make_plan(inputs, parse_topology("v5e:2x2"), decode=False)
    memory = plan["train_step"]["memory_per_chip"]
    _, adapters, base = step_plan.abstract_model(CONFIG, lora)
    adapter_bytes = sum(4 * math.prod(p.shape) for p in jax.tree.leaves(adapters))  # replicated
    base_bytes = sum(4 * math.prod(p.shape) // (4 if p.ndim >= 2 else 1)
                     for p in jax.tree.leaves(base))
    assert memory["compiled"] and plan["train_step"]["fits"]
    assert memory["parameters"] == base_bytes + adapter_bytes
    assert memory["gradients"] == adapter_bytes
    assert 2 * adapter_bytes <= memory["optimizer_state"] <= 2 * adapter_bytes + 64
    assert plan["model"]["trained_parameters"] * 4 == adapter_bytes


def test_a_paged_decode_step_compiles_per_tensor_shard_with_the_pool_sized_by_its_pages():
    """rollout.kv_cache=paged in the plan: the decode step runs the TPU paged kernel per tensor
    shard, each chip holds its kv heads of a pool of kv_pages pages (not slots x max_context);
    on a mesh that splits the slots, its batch shard's pool; a pool that does not split over the
    batch shards is refused as the sampler refuses it."""
    pytest.importorskip("libtpu", reason="compiling for TPU needs libtpu: pip install -e .[tpu]")
    model = DecoderConfig(vocab_size=512, hidden_size=256, intermediate_size=256,
                          num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                          head_dim=128, dtype="bfloat16")
    inputs = step_plan.PlanInputs(
        model=model, mesh_shape=dict(data=1, fsdp=1, tensor=4), rows=4, row_length=128,
        step=ts.TrainStepConfig(remat="full", scan_layers=True, loss=LOSS),
        optimizer=ts.OptimizerConfig(), decode_slots=8, max_context=8192, kv_cache="paged",
        kv_page_size=64, kv_pages=8 * 1024 // 64)  # a mean 1,024 tokens a slot
    plan = step_plan.make_plan(inputs, parse_topology("v5e:2x2"), train=False)
    decode = plan["decode_step"]
    assert decode["attention"] == {"decode": "paged_tpu"}
    assert decode["memory_per_chip"]["compiled"] and decode["fits"]
    assert (decode["kv_pages"], decode["kv_mean_tokens_per_slot"]) == (128, 1024)
    # K and V pools of 2 layers, 1 of 4 kv heads a chip, 128 pages x 64 x 128, bfloat16; the
    # replicated page tables [8, 128], lengths [8], reference counts and free stack [128].
    pool = 2 * 2 * 1 * 128 * 64 * 128 * 2
    assert decode["memory_per_chip"]["kv_cache"] == pool + 4 * (8 * 128 + 8 + 128 + 128 + 1) + 1
    dense = step_plan.make_plan(dataclasses.replace(inputs, kv_cache="dense"),
                                parse_topology("v5e:2x2"), train=False)["decode_step"]
    assert dense["memory_per_chip"]["kv_cache"] >= 8 * pool
    assert "paged: 128 pages of 64 tokens" in "\n".join(step_plan.summary_lines(plan))
    # Over fsdp=2 x tensor=2: a pool per batch shard, each chip its shard's 64 pages of 2 kv
    # heads and the allocation state of its 4 slots: tables [4, 64], lengths [4], reference
    # counts and free stack [64], its free count and overflow flag.
    split = step_plan.make_plan(dataclasses.replace(inputs, mesh_shape=dict(data=1, fsdp=2,
                                                                            tensor=2)),
                                parse_topology("v5e:2x2"), train=False)["decode_step"]
    assert split["attention"] == {"decode": "paged_tpu"} and split["kv_pools"] == 2
    assert split["memory_per_chip"]["compiled"] and split["fits"]
    assert split["memory_per_chip"]["kv_cache"] == pool + 4 * (4 * 128 + 4 + 64 + 64 + 1) + 1
    with pytest.raises(ValueError, match=r"rollout\.kv_pages=129 does not split over data x "
                                         r"fsdp = 4"):
        step_plan.make_plan(dataclasses.replace(inputs, kv_pages=129,
                                                mesh_shape=dict(data=1, fsdp=4, tensor=1)),
                            parse_topology("v5e:2x2"), train=False)
