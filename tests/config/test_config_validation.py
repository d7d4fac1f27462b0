"""Config files, validation messages that name the field, and the --config flag glue."""
import re
from pathlib import Path

import ml_collections
import pytest
from absl import flags

from matpo_jax.config import (CHOICES, ConfigError, apply_overrides, base_config,
                              define_flags, load_config_file, parse_arg, parse_flags,
                              save_config, to_typed, validate_config)
from matpo_jax.parallel.mesh import resolve_mesh_shape

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def problems_of(cfg, **kwargs):
    with pytest.raises(ConfigError) as error:
        validate_config(cfg, **kwargs)
    return error.value.problems


def loose(**changes):
    """A plain (unlocked, untyped) copy of the base config with dotted fields replaced, as a
    config file built from scratch could produce."""
    d = base_config().to_dict()
    for path, value in changes.items():
        *parents, name = path.split(".")
        group = d
        for parent in parents:
            group = group[parent]
        group[name] = value
    return ml_collections.ConfigDict(d)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.py")), ids=lambda p: p.name)
def test_every_config_file_validates(path):
    cfg = load_config_file(path)
    validate_config(cfg, check_files=False)  # pod configs name checkpoints on their own disks
    assert set(cfg.keys()) == set(base_config().keys())


def test_base_runs_on_the_test_mesh():
    cfg = validate_config(load_config_file(CONFIGS / "base.py"), num_devices=8)
    assert resolve_mesh_shape(cfg.mesh, 8) == {"data": 1, "fsdp": 8, "tensor": 1}


def test_pod_config_carries_the_paper_settings():
    cfg = load_config_file(CONFIGS / "qwen3_4b_musique.py")
    validate_config(cfg, num_devices=64, check_files=False)
    assert (cfg.rollout.mode, cfg.data.name, cfg.data.batch_size, cfg.rollout.group_size) == (
        "matpo", "musique", 256, 8)
    assert (cfg.rl.lr, cfg.rl.weight_decay, cfg.rl.grad_clip, cfg.rl.schedule) == (
        1e-5, 0.01, 1.0, "constant")
    assert (cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_turns_planner,
            cfg.rollout.max_turns_worker) == (1.0, 1.0, 20, 20)
    assert (cfg.rollout.max_context, cfg.rollout.final_summary_max_tokens,
            cfg.rollout.report_max_chars) == (40960, 4096, 20000)
    assert (cfg.train.steps, cfg.rl.kl_coef, cfg.rl.entropy_coef) == (180, 0.0, 0.0)
    assert cfg.model.arch.hidden_size == 2560 and cfg.model.arch.num_hidden_layers == 36
    baseline = load_config_file(CONFIGS / "qwen3_4b_musique.py", "mode=single")
    assert baseline.rollout.mode == "single" and baseline.rl.lr == cfg.rl.lr
    # Its checkpoint lives on the pod's disk, so here the file check names the field.
    assert any("model.hf_checkpoint" in p for p in problems_of(cfg, num_devices=64))


def test_unknown_field_suggests_the_nearest():
    cfg = base_config()
    cfg.rl.lrr = 3e-4
    assert problems_of(cfg) == ["unknown field rl.lrr (did you mean rl.lr?)"]
    cfg = base_config()
    cfg.rollout.groupsize = 8
    assert problems_of(cfg) == [
        "unknown field rollout.groupsize (did you mean rollout.group_size?)"]
    cfg = base_config()
    del cfg.train["seed"]
    assert problems_of(cfg) == ["missing field train.seed"]


def test_wrong_types_name_field_and_types():
    msgs = problems_of(loose(**{"rl.lr": "fast", "rollout.group_size": 2.5,
                                "rollout.final_summary": 1, "model.hf_checkpoint": 3}))
    assert "rl.lr = 'fast': expected float, got str" in msgs
    assert "rollout.group_size = 2.5: expected int, got float" in msgs
    assert "rollout.final_summary = 1: expected bool, got int" in msgs
    assert "model.hf_checkpoint = 3: expected str, got int" in msgs
    assert len(msgs) == 4
    validate_config(loose(**{"rl.lr": 1}))  # an int where a float is expected is fine
    assert problems_of(loose(**{"train.steps": None})) == ["train.steps is None: expected int"]


@pytest.mark.parametrize("path, value, message", [
    ("rl.eps_low", -0.1, "rl.eps_low = -0.1: must be >= 0"),
    ("rl.eps_high", -1.0, "rl.eps_high = -1.0: must be >= 0"),
    ("rollout.group_size", 0, "rollout.group_size = 0: must be >= 1"),
    ("rl.lr", 0.0, "rl.lr = 0.0: must be > 0"),
    ("rollout.top_p", 1.5, "rollout.top_p = 1.5: must be <= 1"),
    ("reward.f1_threshold", float("nan"), "reward.f1_threshold = nan: must be a number, got nan"),
    ("rl.dual_clip_c", 1.0, "rl.dual_clip_c = 1.0: must be > 1"),
    # seeds numpy / grain / jax cannot take died after SFT (issue 23, item 6)
    ("train.seed", -1, "train.seed = -1: must be >= 0"),
    ("data.shuffle_seed", -1, "data.shuffle_seed = -1: must be >= 0"),
    ("data.world_seed", -7, "data.world_seed = -7: must be >= 0"),
    ("train.seed", 10**23, "train.seed = 100000000000000000000000: must be <= 2.14748e+09"),
])
def test_out_of_range_values(path, value, message):
    cfg = base_config()
    apply_overrides(cfg, {path: value})
    assert problems_of(cfg) == [message]


@pytest.mark.parametrize("overrides, message", [
    ("rl.lr=inf", "rl.lr = inf: must be finite"),
    ("data.noise=nan", "data.noise = nan: must be a number, got nan"),
    ("sft.copy_weight=-inf", "sft.copy_weight = -inf: must be finite"),
    ("sft.num_demos=0", "sft.num_demos = 0: SFT (sft.steps = 200) needs demonstrations; set "
                        "sft.steps = 0 to skip it"),
    ("model.arch.head_dim=15", "model.arch.head_dim = 15: must be even (rotary embeddings rotate "
                               "pairs)"),
    ("rollout.max_new_tokens_per_turn=2048", "rollout.max_new_tokens_per_turn = 2048: must be < "
                                             "rollout.max_context = 2048"),
    # the packer rounded the rows up to 10**12: "Unable to allocate 3.64 PiB" after SFT
    ("rl.micro_batches=1000000000000", "rl.micro_batches = 1000000000000: rl.micro_batches x "
     "rl.ppo_mini_batches = 1000000000000 must be <= rl.pack_rows = 8 (each micro-batch is a "
     "share of the packed rows)"),
    ("rl.micro_batches=4,rl.ppo_mini_batches=4", "rl.micro_batches = 4: rl.micro_batches x "
     "rl.ppo_mini_batches = 16 must be <= rl.pack_rows = 8 (each micro-batch is a share of the "
     "packed rows)"),
])
def test_what_would_fail_later_fails_at_start(overrides, message):
    assert problems_of(apply_overrides(base_config(), overrides)) == [message]


def test_typed_config_is_valid_by_construction():
    from matpo_jax.config import ExperimentConfig, RLSection, RolloutSection
    cfg = to_typed(base_config())
    assert cfg == ExperimentConfig() and isinstance(cfg.rl.lr, float)
    assert to_typed(apply_overrides(base_config(), {"rl.lr": 1})).rl.lr == 1.0  # int widened
    with pytest.raises(ConfigError, match="rl.lr = inf: must be finite"):
        RLSection(lr=float("inf"))
    with pytest.raises(ConfigError, match="rl.pack_len = 2048: must be >= rollout.max_context"):
        ExperimentConfig(rollout=RolloutSection(max_context=4096))
    with pytest.raises(ConfigError, match="rl.kl_coef = -0.5: must be >= 0"):
        cfg.replace(rl=RLSection(kl_coef=-0.5))


def test_invalid_choices_list_the_allowed_values():
    cfg = base_config()
    cfg.rollout.mode = "multi"
    cfg.rl.loss_agg = "sum"
    cfg.eval.datasets = ("frames", "nq")
    msgs = problems_of(cfg)
    assert "rollout.mode = 'multi': must be one of matpo, single" in msgs
    assert ("rl.loss_agg = 'sum': must be one of token-mean, seq-mean-token-mean, "
            "seq-mean-token-sum, seq-mean-token-sum-norm, matpo") in msgs
    assert any(m.startswith("eval.datasets = 'nq': must be one of") for m in msgs)
    assert len(msgs) == 3


def test_choices_match_the_modules_that_consume_them():
    loss = pytest.importorskip("matpo_jax.trainer.loss")
    rewards = pytest.importorskip("matpo_jax.rl.rewards")
    advantages = pytest.importorskip("matpo_jax.rl.advantages")
    assert CHOICES["rl.loss_agg"] == loss.AGGREGATION_MODES
    assert CHOICES["rl.ratio"] == loss.RATIOS
    assert CHOICES["rl.rollout_correction"] == loss.ROLLOUT_CORRECTIONS
    assert CHOICES["rl.seq_mean_denominator"] == loss.SEQ_DENOMINATORS
    assert CHOICES["rl.kl_type"] == loss.KL_TYPES
    assert CHOICES["reward.method"] == rewards.ACCURACY_METHODS
    assert CHOICES["rollout.mode"] == rewards.REWARD_MODES
    assert CHOICES["rl.group_by"] == advantages.GROUP_BY


def test_split_names_match_the_synthetic_world():
    from matpo_jax.config.sections import SYNTHETIC_SFT_SPLIT, SYNTHETIC_SPLITS
    from matpo_jax.data import synthetic_world
    assert (SYNTHETIC_SPLITS, SYNTHETIC_SFT_SPLIT) == (synthetic_world.SPLITS,
                                                       synthetic_world.SFT_SPLIT)
    assert problems_of(apply_overrides(base_config(), "eval.split=valid")) == [
        "eval.split = 'valid': the synthetic world's splits are train, validation, test"]


def test_mesh_must_match_the_devices():
    cfg = base_config()
    cfg.mesh.update(data=3, fsdp=2, tensor=1)
    assert problems_of(cfg, num_devices=8) == ["mesh.data*mesh.fsdp*mesh.tensor = 6 but 8 devices"]
    cfg.rl.pack_rows = 12
    validate_config(cfg, num_devices=6)
    validate_config(cfg)  # device count unknown (validating a pod config elsewhere): no check
    cfg.mesh.update(data=-1, fsdp=-1)
    assert "at most one axis may be -1" in problems_of(cfg, num_devices=8)[0]
    cfg.mesh.update(data=3, fsdp=-1, tensor=1)
    assert problems_of(cfg, num_devices=8) == [
        "mesh.fsdp = -1 but 8 devices do not divide by the other axes (3)"]
    cfg.mesh.update(data=0, fsdp=-1)
    assert problems_of(cfg) == ["mesh.data = 0: must be >= 1 or -1 (the rest)"]
    cfg.mesh.update(data=2, fsdp=-1, tensor=2)
    cfg.rl.pack_rows = 8
    validate_config(cfg, num_devices=8)
    assert resolve_mesh_shape(cfg.mesh, 8) == {"data": 2, "fsdp": 2, "tensor": 2}
    cfg.rl.pack_rows = 6  # rows are split over data*fsdp = 4
    assert problems_of(cfg, num_devices=8) == ["rl.pack_rows = 6: must be a multiple of "
                                               "mesh.data*mesh.fsdp = 4 (rows are split over them)"]
    cfg.rl.pack_rows, cfg.rl.micro_batches = 8, 2  # 2 micro-batches x 4 shards: a row each
    validate_config(cfg, num_devices=8)
    cfg.rl.micro_batches = 4
    assert problems_of(cfg, num_devices=8) == [
        "rl.micro_batches = 4: rl.micro_batches x rl.ppo_mini_batches x mesh.data*mesh.fsdp = 16 "
        "must be <= rl.pack_rows = 8"]


def test_cross_field_consistency():
    cfg = base_config()
    cfg.reward.method = "judge"
    cfg.tools.search_backend = "serper"
    cfg.rl.pack_len = 1024
    cfg.model.arch.num_key_value_heads = 3
    msgs = problems_of(cfg)
    assert "reward.judge_url must be set when reward.method = 'judge'" in msgs
    assert "tools.search_url must be set when tools.search_backend = 'serper'" in msgs
    assert any(m.startswith("rl.pack_len = 1024: must be >= rollout.max_context = 2048")
               for m in msgs)
    assert any(m.startswith("model.arch.num_attention_heads = 4: must be a multiple") for m in msgs)
    assert len(msgs) == 4


def test_checkpoint_directory_must_exist_with_config_json(tmp_path):
    cfg = base_config()
    cfg.model.hf_checkpoint = str(tmp_path / "Qwen3-0.6B")
    assert problems_of(cfg) == [f"model.hf_checkpoint = '{tmp_path}/Qwen3-0.6B': "
                                f"directory does not exist"]
    (tmp_path / "Qwen3-0.6B").mkdir()
    assert problems_of(cfg) == [f"model.hf_checkpoint = '{tmp_path}/Qwen3-0.6B': "
                                f"no config.json in that directory"]
    (tmp_path / "Qwen3-0.6B" / "config.json").write_text("{}")
    validate_config(cfg)
    cfg.model.hf_checkpoint = "gs://bucket/Qwen3-4B"  # remote: not checked from here
    validate_config(cfg)


def test_parse_arg_and_overrides():
    arg = parse_arg("mode=single, noise=0.5,recap", mode="matpo", noise=0.0, recap=False, seeds=1)
    assert (arg.mode, arg.noise, arg.recap, arg.seeds) == ("single", 0.5, True, 1)
    with pytest.raises(ConfigError, match="unknown config argument 'nosie'; known: mode, noise"):
        parse_arg("nosie=1", mode="matpo", noise=0.0)
    with pytest.raises(ConfigError, match=re.escape("noise = 'high': expected float")):
        parse_arg("noise=high", noise=0.0)

    cfg = load_config_file(CONFIGS / "base.py",
                           "rollout.mode=single,rl.lr=3e-4,rollout.final_summary=false,"
                           "model.tokenizer=/tmp/tok,eval.datasets=frames+musique")
    assert (cfg.rollout.mode, cfg.rl.lr, cfg.rollout.final_summary) == ("single", 3e-4, False)
    assert cfg.model.tokenizer == "/tmp/tok" and cfg.eval.datasets == ("frames", "musique")
    with pytest.raises(ConfigError, match=re.escape("unknown field rl.lrr (did you mean rl.lr?)")):
        load_config_file(CONFIGS / "base.py", "rl.lrr=1")


def test_save_config_writes_the_resolved_config(tmp_path):
    path = save_config(base_config(), tmp_path / "run")
    assert '"group_size": 4' in path.read_text()


def parse_command_line(argv):
    """Defines the flags on a fresh FlagValues and parses argv as train.py's app.run would."""
    values = flags.FlagValues()
    config, workdir = define_flags(flag_values=values)
    rest = parse_flags(argv, values)
    return config.value, workdir.value, rest


def test_flags_load_override_and_validate():
    cfg, workdir, rest = parse_command_line([
        "train", f"--config={CONFIGS / 'base.py'}:rollout.mode=single", "--config.rl.lr=3e-4",
        "--config.model.hf_checkpoint=/nowhere", "--workdir=/tmp/run", "extra"])
    assert rest == ["train", "extra"] and workdir == "/tmp/run"
    assert cfg.rollout.mode == "single" and cfg.rl.lr == 3e-4
    with pytest.raises(ConfigError, match="model.hf_checkpoint = '/nowhere': directory"):
        validate_config(cfg, num_devices=8)


def test_flags_unknown_override_names_the_field():
    with pytest.raises(ConfigError) as error:
        parse_command_line(["train", f"--config={CONFIGS / 'base.py'}", "--config.rl.lrr=1"])
    assert str(error.value) == "unknown field rl.lrr (did you mean rl.lr?)"


def test_flags_bad_value_names_the_field():
    with pytest.raises(ConfigError, match=re.escape("rollout.group_size = '2.5': expected int")):
        parse_command_line(["train", f"--config={CONFIGS / 'base.py'}",
                            "--config.rollout.group_size=2.5"])


ENTRY_POINT = """
from absl import app
from matpo_jax import config as matpo_config

CONFIG, WORKDIR = matpo_config.define_flags()

def main(argv):
    cfg = matpo_config.config_from_flags(CONFIG, num_devices=8)
    print("ok", cfg.rollout.mode, cfg.rl.lr, WORKDIR.value)

app.run(main, flags_parser=matpo_config.flags_parser)
"""


def test_entry_point_reports_bad_overrides_in_one_line(tmp_path):
    """How train.py uses the helpers: app.run with our flags_parser, validation in main."""
    import subprocess
    import sys

    script = tmp_path / "entry.py"
    script.write_text(ENTRY_POINT)
    run = lambda *args: subprocess.run([sys.executable, str(script), *args],  # noqa: E731
                                       capture_output=True, text=True, timeout=60)
    good = run(f"--config={CONFIGS / 'base.py'}", "--config.rl.lr=0.5", "--workdir=/tmp/w")
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip() == "ok matpo 0.5 /tmp/w"
    bad = run(f"--config={CONFIGS / 'base.py'}", "--config.rl.lrr=0.5")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "FATAL config error: unknown field rl.lrr (did you mean rl.lr?)"


def test_shared_sft_start_fields_are_checked(tmp_path):
    cfg = base_config()
    cfg.sft.modes = "matpo+singel"
    cfg.sft.init_checkpoint = str(tmp_path / "sft")
    assert problems_of(cfg) == [
        "sft.modes = 'matpo+singel': 'singel' is not one of matpo, single",
        f"sft.init_checkpoint = '{tmp_path}/sft': directory does not exist"]
    cfg.sft.modes = "matpo + single"
    (tmp_path / "sft").mkdir()
    validate_config(cfg)


def test_sft_demonstrations_come_from_the_sft_split_only_when_the_world_has_one():
    from matpo_jax.run.sft import demonstration_split
    cfg = base_config()
    assert demonstration_split(cfg) == "train"
    cfg.data.sft_fraction = 0.35
    assert demonstration_split(cfg) == "sft"
    cfg.data.sft_fraction = 0.8
    with pytest.raises(ConfigError, match="data.sft_fraction"):
        validate_config(cfg)


def test_rollout_settings_reach_the_rollout_engine():
    from matpo_jax.agents.rollout import sampling
    from matpo_jax.run.runtime import rollout_config
    cfg = apply_overrides(base_config(), "rollout.top_k=3,rollout.top_p=0.5,rollout.temperature=0.7,"
                                         "rollout.reuse_prefixes=False,rollout.decode_slots=5")
    engine = rollout_config(to_typed(cfg))
    assert (sampling(engine).top_k, sampling(engine).top_p, sampling(engine).temperature) == (
        3, 0.5, 0.7)
    assert engine.reuse_prefixes is False and engine.decode_slots == 5
    assert rollout_config(to_typed(cfg), evaluation=True).group_size == 1
    assert engine.summary_tokens == 256  # base: the whole turn
    short = apply_overrides(cfg, "rollout.final_summary_max_tokens=40")
    assert rollout_config(to_typed(short)).summary_tokens == 40
    # Never more than the per-turn cap (the sampler's turn buffer).
    small_turns = apply_overrides(cfg, "rollout.max_new_tokens_per_turn=24")
    assert rollout_config(to_typed(small_turns)).summary_tokens == 24


def test_the_smollm2_comparison_gives_both_methods_one_budget():
    """configs/smollm2_repro.py: MATPO and the single agent differ only in their way of working
    (and the turns a single agent needs for every hop); the context, SFT, RL and question
    stream are one budget, and the seed moves the question stream with the run."""
    matpo, single = (load_config_file(CONFIGS / "smollm2_repro.py", f"mode={m},seed=2").to_dict()
                     for m in ("matpo", "single"))
    differing = {f"{section}.{key}" for section in matpo for key in matpo[section]
                 if matpo[section][key] != single[section][key]}
    assert differing == {"rollout.mode", "sft.modes", "rollout.max_turns_planner",
                         "sft.worker_fraction"}
    assert single["rollout"]["max_turns_planner"] == 2 * matpo["rollout"]["max_turns_worker"]
    assert (matpo["train"]["seed"], matpo["data"]["shuffle_seed"], matpo["data"]["noise"]) == (
        2, 2, 0.6)
    base = load_config_file(CONFIGS / "smollm2_synthetic.py").to_dict()
    assert matpo["model"] == base["model"] and matpo["rl"] == base["rl"]
