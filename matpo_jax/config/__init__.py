"""Experiment configuration: the schema with every field's default, validation that names the bad
field, config files and command-line overrides."""
from matpo_jax.config.schema import (CHOICES, RANGES, ConfigError, Interval, apply_overrides,
                                     base_config, config_from_flags, define_flags, flags_parser,
                                     load_config_file, parse_arg, parse_flags, save_config,
                                     sft_modes, validate_config)
from matpo_jax.parallel.mesh import resolve_mesh_shape
