"""Export a run's checkpoint as a Hugging Face directory (weights, config, tokenizer, template).

  python -m matpo_jax.export --checkpoint=<workdir>/checkpoints/rl [--step=N] --out=DIR \\
      [--tokenizer=DIR] [--dtype=bfloat16]

The architecture and tokenizer are read from the run's <workdir>/config.json, which must be the
config the checkpoint records (and the tokenizer the one it was trained with). DIR must be new,
empty, or an earlier export (its export.json lists the files it wrote, the only ones replaced).
The result loads with transformers (`AutoModelForCausalLM.from_pretrained(DIR)`,
`AutoTokenizer.from_pretrained(DIR)`).
"""
from __future__ import annotations

import sys

from absl import flags


def _flags() -> flags.FlagValues:
    values = flags.FlagValues()
    flags.DEFINE_string("checkpoint", None, "A run's checkpoint directory, e.g. "
                        "<workdir>/checkpoints/rl (or checkpoints/sft).", flag_values=values)
    flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the newest).",
                         flag_values=values)
    flags.DEFINE_string("out", None, "Output directory (Hugging Face layout).", flag_values=values)
    flags.DEFINE_string("tokenizer", None, "Tokenizer directory to ship instead of the run's.",
                        flag_values=values)
    flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"],
                      "dtype of the saved weights (default: the run's model.param_dtype).",
                      flag_values=values)
    flags.mark_flags_as_required(["checkpoint", "out"], flag_values=values)
    return values


def main(argv: list[str] | None = None) -> int:
    values = _flags()
    try:
        values(list(sys.argv if argv is None else argv))
    except flags.Error as err:
        print(f"export: {err}\n\n{values.main_module_help()}", file=sys.stderr)
        return 2
    from matpo_jax.chat import ChatFormatError
    from matpo_jax.config import ConfigError
    from matpo_jax.model import CheckpointFormatError
    from matpo_jax.run.export import ExportError, export_checkpoint

    try:
        result = export_checkpoint(values.checkpoint, values.out, step=values.step,
                                   tokenizer=values.tokenizer, dtype=values.dtype)
    except (ExportError, CheckpointFormatError, ChatFormatError, ConfigError) as err:
        print(f"export: {err}", file=sys.stderr)
        return 1
    print(f"exported step {result.step} of {values.checkpoint} to {result.out} "
          f"(tokenizer from {result.tokenizer_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
