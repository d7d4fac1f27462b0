"""Experiment configuration, declared once (sections.py) and derived from there: the ConfigDict
config files edit, command-line overrides, validation that names the bad field, the typed config
the stages consume, and the run's record (config.json) with its resume check.

    cfg = to_typed(load_config_file("configs/synthetic_tiny.py", "rl.lr=3e-4"))  # ExperimentConfig
    cfg.rollout  # RolloutSection: what the rollout engine consumes
"""
from matpo_jax.config.cli import (ConfigFlag, RunFlags, check_workdir, config_from_flags,
                                  define_flags, define_run_flags, flags_parser, one_line_errors,
                                  parse_flags)
from matpo_jax.config.configdict import (CHOICES, RANGES, apply_overrides, base_config, flatten,
                                         parse_arg, schema)
from matpo_jax.config.errors import ConfigError
from matpo_jax.config.fields import FieldSpec, Interval
from matpo_jax.config.files import load_config_file, read_saved_config, save_config
from matpo_jax.config.resume import RESUME_SAFE_FIELDS, check_resume, config_changes
from matpo_jax.config.sections import (ArchSection, ChatSection, DataSection, EvalSection,
                                       ExperimentConfig, MeshSection, ModelSection, RewardSection,
                                       RLSection, PretrainSection, RolloutSection, SFTSection,
                                       ToolsSection, TrainSection,
                                       PUBLISHED_SPLITS, sft_modes)
from matpo_jax.config.validation import to_typed, validate_config
