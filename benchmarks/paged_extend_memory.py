"""Multi-token extends over a paged KV cache on a TPU, compiled (not run) with libtpu: our Pallas
extend kernel (model/paged_extend_kernel.py) beside XLA's reference (paged_cache's gather of
every table entry into dense rows), per chip, side by side in one run (issue 51).

The shape is an injection of the slot loop at the paper's scale: 16 lanes writing a 512-token
chunk (a prompt, a tool response, a re-prefilled context) into rows whose page tables cover
40,960 tokens in 64-token pages, Qwen3-4B's heads (32 query, 8 kv, 128 wide), bfloat16, a pool
for a mean 4,096 tokens a lane. XLA's answer is what its compiler reports: temporaries, or the
out-of-memory error with the bytes it wanted. Needs libtpu (`make test-tpu` builds .venv-tpu):

    ALLOW_MULTIPLE_LIBTPU_LOAD=1 .venv-tpu/bin/python benchmarks/paged_extend_memory.py
Writes benchmarks/results/paged_extend_memory.md.
"""
from __future__ import annotations

import datetime
import pathlib
import platform
import re
import subprocess

import jax
import jax.numpy as jnp

from matpo_jax.model.paged_cache import paged_attention_reference
from matpo_jax.model.paged_extend_kernel import tpu_paged_extend_attention
from matpo_jax.planning.topology import parse_topology

LANES, CHUNK, HEADS, KV_HEADS, HEAD_DIM = 16, 512, 32, 8, 128
MAX_LEN, PAGE = 40960, 64
PAGES = LANES * 4096 // PAGE
TOPOLOGIES = ("v5e:1x1", "v5p:1x1x1")


def inputs(topology: str):
    sharding = jax.sharding.SingleDeviceSharding(parse_topology(topology).devices()[0])

    def shape(dims, dtype=jnp.int32):
        return jax.ShapeDtypeStruct(dims, dtype, sharding=sharding)
    return (shape((LANES, CHUNK, HEADS, HEAD_DIM), jnp.bfloat16),
            *[shape((KV_HEADS, PAGES, PAGE, HEAD_DIM), jnp.bfloat16)] * 2,
            shape((LANES, MAX_LEN // PAGE)), shape((LANES,)), shape((LANES, CHUNK)))


def temporaries(function, args) -> str:
    """GiB of compiled temporaries, or what the compiler said it would need."""
    try:
        compiled = jax.jit(function).lower(*args).compile()
    except Exception as error:  # libtpu's out-of-memory answer names the bytes it wanted
        wanted = re.search(r"HLO temporaries \(([\d.]+)G\)", str(error))
        return f"does not compile: needs {wanted.group(1)} GiB" if wanted else str(error)[:120]
    return f"{compiled.memory_analysis().temp_size_in_bytes / 2**30:.3f} GiB"


def main() -> None:
    rows = []
    for topology in TOPOLOGIES:
        args = inputs(topology)
        rows.append(f"| {topology} | {temporaries(tpu_paged_extend_attention, args)} | "
                    f"{temporaries(paged_attention_reference, args)} |")
        print(rows[-1], flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    text = "\n".join([
        "# A multi-token extend over pages, compiled for one TPU chip",
        "",
        f"{LANES} lanes x a {CHUNK}-token chunk, tables of {MAX_LEN:,} tokens in {PAGE}-token "
        f"pages, {HEADS} / {KV_HEADS} heads of {HEAD_DIM}, bfloat16, a pool of {PAGES:,} pages. "
        "Temporaries per chip:",
        "",
        "| chip | Pallas extend kernel (`paged_tpu`) | XLA reference (`xla`) |",
        "|---|---|---|", *rows, "",
        f"compiled with libtpu on {platform.machine()} ({platform.processor() or 'cpu'}) · "
        f"{commit} · {datetime.date.today()} · "
        "`ALLOW_MULTIPLE_LIBTPU_LOAD=1 .venv-tpu/bin/python benchmarks/paged_extend_memory.py`",
        ""])
    out = pathlib.Path(__file__).parent / "results" / "paged_extend_memory.md"
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
