"""Decode throughput of the jitted slot sampler vs Hugging Face transformers `generate`, one run.

Both sides run the SAME weights (a random transformers Qwen3ForCausalLM saved with save_pretrained
and loaded here with matpo_jax.model.load_pretrained), the same prompts, greedy, KV cache, every row
forced to the full length (transformers: min_new_tokens; ours: no stop ids). Time covers the whole
generate call (prefill + decode) after a warm-up call, so compilation is excluded on our side and
first-call allocations on theirs. torch uses as many threads as XLA's CPU client (the cores here).

Also measures the host-callback round trip: the same generation with a host called after every
token (turn cap 1, the host re-activates every slot) vs once per prompt.

And the bytes each host round moves (device -> host, host -> device), measured by the loop on the
arrays that cross (SlotLoopStats.round_bytes), for a tool-using workload at a few shapes up to the
paper's (512 slots x 40,960 positions x 8,192-token turns; a 1-layer model stands in, since the
bytes depend on the shapes and the tokens exchanged, not on the model), next to what the previous
protocol's fixed [slots, max_turn] events and [slots, max_len] injections moved per round.
Bytes are deterministic: --bytes_only runs just that part (a few minutes) and writes
sampler_host_bytes.{json,md}.

    python benchmarks/sampler.py [--quick] [--bytes_only] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

from matpo_jax.model import DecoderConfig, CausalLM, init_cache, load_pretrained
from matpo_jax.sampler.host_protocol import SlotInjection
from matpo_jax.sampler.loop import Sampling, generate, run_slots
from matpo_jax.sampler.ops import first_index_of_max

SIZES = {  # name -> DecoderConfig fields (GQA, untied head, like the Qwen3 family)
    "4M": dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "30M": dict(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=4, head_dim=64),
}
GREEDY = Sampling(greedy=True)


def best_times_interleaved(runs, repeats):
    """Best wall time of each named run, alternating them so that load from other processes on a
    shared machine hits every side alike. runs: name -> (run, warm_up)."""
    for run, warm_up in runs.values():
        warm_up()
    best = {name: float("inf") for name in runs}
    for _ in range(repeats):
        for name, (run, _) in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def build_pair(fields, seed=0):
    """A random HF model and the same weights in our model (through a safetensors checkpoint)."""
    config = DecoderConfig(**fields)
    torch.manual_seed(seed)
    hf_config = transformers.Qwen3Config(**config.to_hf_dict())
    hf_model = transformers.Qwen3ForCausalLM(hf_config).eval()
    with tempfile.TemporaryDirectory() as path:
        hf_model.save_pretrained(path)
        ours = load_pretrained(path)
    return hf_model, ours


def same_weights_check(hf_model, ours, prompts):
    """Max |logit difference| of the two forwards on the prompts (proves the weights match)."""
    with torch.no_grad():
        theirs = hf_model(torch.as_tensor(prompts)).logits.numpy()
    mine = np.asarray(jax.jit(lambda t: ours(t))(jnp.asarray(prompts)))
    return float(np.abs(theirs - mine).max())


def ours_generate(ours, prompts, new_tokens):
    graphdef, state = nnx.split(ours)
    batch, prompt_len = prompts.shape
    rows = [row.tolist() for row in prompts]

    def run():
        tokens, _ = generate(state, graphdef, rows, new_tokens, GREEDY, stop_ids=(), slots=batch,
                             max_len=prompt_len + new_tokens)
        assert all(len(t) == new_tokens for t in tokens)
        return tokens
    return run


def hf_generate(hf_model, prompts, new_tokens, threads):
    input_ids = torch.as_tensor(prompts)
    attention_mask = torch.ones_like(input_ids)

    def run(new_tokens=new_tokens):
        torch.set_num_threads(threads)
        with torch.no_grad():
            out = hf_model.generate(input_ids, attention_mask=attention_mask, do_sample=False,
                                    max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                    eos_token_id=None, pad_token_id=0, use_cache=True)
        assert out.shape[1] == prompts.shape[1] + new_tokens
        return out
    return run


class _EveryStepHost:
    """Loads the prompts, then re-activates every slot after each 1-token turn: one io_callback
    round trip per decoded token (what a host called every step costs)."""

    def __init__(self, prompts, new_tokens):
        self.prompts, self.remaining = prompts, new_tokens
        self.loaded = False

    def __call__(self, events):
        batch, width = self.prompts.shape
        injection = SlotInjection.nothing(batch, width)
        if not self.loaded:
            injection.tokens[:], injection.num[:], injection.reset[:] = self.prompts, width, True
            self.loaded = True
        else:
            self.remaining -= 1
        injection.active[:] = self.remaining > 0
        injection.done = self.remaining == 0
        return injection


def callback_overhead(ours, prompts, new_tokens, repeats):
    """Seconds per host round trip: (every-step run - one-call run) / extra host calls."""
    graphdef, state = nnx.split(ours)
    batch, prompt_len = prompts.shape
    max_len = prompt_len + new_tokens
    every_step_stats = []

    def every_step():
        every_step_stats.append(run_slots(state, graphdef, _EveryStepHost(prompts, new_tokens),
                                          slots=batch, max_len=max_len, max_turn=1,
                                          sampling=GREEDY))

    once = ours_generate(ours, prompts, new_tokens)
    best = best_times_interleaved(dict(once=(once, once), every=(every_step, every_step)), repeats)
    rare, frequent = best["once"], best["every"]
    extra_calls = every_step_stats[-1].host_calls - 2  # generate calls the host twice
    return dict(batch=batch, new_tokens=new_tokens, seconds_rare=rare, seconds_every_step=frequent,
                host_calls_every_step=every_step_stats[-1].host_calls,
                us_per_round_trip=1e6 * (frequent - rare) / extra_calls)


class _ToolLoopHost:
    """A rollout-shaped host: every slot holds one sequence that runs `turns` turns; the first
    starts from a prompt, each later one after a tool response. Turn caps and response lengths
    differ per slot, so slots stop at different steps and a round sees a few stops, as in a
    rollout. Records the tokens that crossed each round (sampled turns in, injected tokens out)."""

    def __init__(self, slots, prompt_len, turn_caps, response_lens, turns):
        self.slots, self.prompt_len, self.turns = slots, prompt_len, turns
        self.turn_caps, self.response_lens = turn_caps, response_lens
        self.turns_done = np.zeros(slots, int)
        self.started = False
        self.rounds = []  # (sampled tokens received, tokens injected) per host call

    def __call__(self, events):
        received = int(np.where(events.stopped, events.turn_len, 0).sum())
        writes = {}
        if not self.started:
            writes = {slot: self.prompt_len for slot in range(self.slots)}
            self.started = True
        for slot in np.flatnonzero(events.stopped):
            self.turns_done[slot] += 1
            if self.turns_done[slot] < self.turns:
                writes[slot] = int(self.response_lens[slot])
        width = max([1] + list(writes.values()))
        injection = SlotInjection.nothing(self.slots, width)
        for slot, n in writes.items():
            injection.tokens[slot, :n] = (np.arange(n) + slot) % 97 + 3
            injection.num[slot] = n
            injection.reset[slot] = not self.turns_done[slot]
            injection.turn_cap[slot] = int(self.turn_caps[slot])
        injection.active[:] = self.turns_done < self.turns
        injection.done = not injection.active.any()
        self.rounds.append((received, sum(writes.values())))
        return injection


def previous_protocol_bytes(slots, max_len, max_turn):
    """Bytes per round of the protocol before this change (fixed shapes, whatever was sent):
    device -> host session id, stopped (bool), stop_reason, turn_tokens [slots, max_turn] int32,
    turn_logprobs [slots, max_turn] float32, turn_len, cache_len; host -> device tokens
    [slots, max_len] int32, num, reset (bool), active (bool), prefix, turn_cap, done (bool)."""
    to_host = 4 + slots * (1 + 4 + 4 + 4) + slots * max_turn * (4 + 4)
    from_host = slots * max_len * 4 + slots * (4 + 1 + 1 + 4 + 4) + 1
    return to_host, from_host


def host_traffic(slots, max_len, max_turn, turns=3, prompt_len=48, vocab=256):
    """Bytes per host round of a tool-using workload on a 1-layer bfloat16 model."""
    config = DecoderConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                         head_dim=2, dtype="bfloat16")
    graphdef, state = nnx.split(CausalLM(config, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(slots)
    turn_caps = rng.integers(4, 24, slots)  # short turns keep the CPU run short; bytes scale
    response_lens = rng.integers(20, 400, slots)  # with tokens, which the table reports
    host = _ToolLoopHost(slots, prompt_len, turn_caps, response_lens, turns)
    stats = run_slots(state, graphdef, host, slots=slots, max_len=max_len, max_turn=max_turn,
                      sampling=GREEDY)
    rounds = np.asarray(stats.round_bytes, np.int64)
    tokens = np.asarray(host.rounds, np.int64)
    old_to, old_from = previous_protocol_bytes(slots, max_len, max_turn)
    return dict(slots=slots, max_len=max_len, max_turn=max_turn, host_rounds=len(rounds),
                lanes=slots // 8 or 1, sampled_tokens_per_round=float(tokens[:, 0].mean()),
                injected_tokens_per_round=float(tokens[:, 1].mean()),
                to_host_mean=float(rounds[:, 0].mean()), to_host_max=int(rounds[:, 0].max()),
                from_host_mean=float(rounds[:, 1].mean()), from_host_max=int(rounds[:, 1].max()),
                previous_to_host=old_to, previous_from_host=old_from)


def host_traffic_markdown(rows, command):
    def size(n):
        for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
            if n >= scale:
                return f"{n / scale:,.1f} {unit}"
        return f"{n:,.0f} B"

    lines = [
        "# Sampler host traffic per round: device -> host and host -> device",
        "",
        f"`{command}`. Measured by the slot loop on the arrays that cross each host round "
        "(`SlotLoopStats.round_bytes`: the round's callback operands and answer, and every "
        "injected-token read of its extends), for a tool-using workload: every slot runs 3 turns "
        "(caps 4-23 tokens), the first after a 48-token prompt, the others after a 20-399-token "
        "tool response; a 1-layer bfloat16 model (the bytes depend on the shapes and the tokens "
        "exchanged, not the model). 'previous' is what the protocol before this change moved "
        "every round whatever happened: [slots, max_turn] turn tokens and log-probs to the host, "
        "[slots, max_len] int32 injection tokens back (plus the [slots] control arrays); "
        "computed from those shapes (`previous_protocol_bytes`) and checked once against the "
        "protocol itself: commit 9566fa9's loop, its callback wrapped to count the bytes of its "
        "operands and answer, ran the 32-slot workload in the same 42 rounds at 65,956 / 262,593 "
        "bytes each, the formula's numbers.",
        "",
        "| slots | max_len | max_turn | rounds | sampled tok / round | injected tok / round | "
        "to host / round (mean, max) | previous | from host / round (mean, max) | previous |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['slots']} | {r['max_len']:,} | {r['max_turn']:,} | {r['host_rounds']} | "
            f"{r['sampled_tokens_per_round']:.1f} | {r['injected_tokens_per_round']:.1f} | "
            f"{size(r['to_host_mean'])}, {size(r['to_host_max'])} | {size(r['previous_to_host'])} | "
            f"{size(r['from_host_mean'])}, {size(r['from_host_max'])} | "
            f"{size(r['previous_from_host'])} |")
    lines += ["", "Now: to host = [slots] control arrays + the stopped turns packed flat (tokens and "
              "log-probs) at the smallest of 256, 1,024, 4,096... entries that holds them; from host "
              "= [slots] control arrays + per extend of the injection [lanes, width] int32 tokens "
              "(lanes = slots / 8, width = the extend's bucket), i.e. 4 bytes per position the "
              "extends compute."]
    return "\n".join(lines) + "\n"


def matmul_peak_gflop_s(size=2048, repeats=5):
    """Best float32 matmul rate of XLA on this machine (a square product, all cores), GFLOP/s:
    a decode step cannot do its 2 x matmul-params x batch FLOPs faster than this."""
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
    product = jax.jit(lambda a: a @ a)
    jax.block_until_ready(product(a))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(product(a))
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best / 1e9


def decode_step_profile(model, batch, cache_lengths, steps=32, repeats=3):
    """ms per decode step of the bare model: `model.decode` over caches of several max_len, and a
    cache-free one-token forward (the same matmuls, no attention over a cache). The gap is the
    cost of the cache handling inside model.extend, which the sampler inherits."""
    graphdef, state = nnx.split(model)
    tokens = jnp.zeros((batch,), jnp.int32)

    @jax.jit
    def cached(state, cache):
        decoder = nnx.merge(graphdef, state)

        def step(_, carry):
            cache, tokens = carry
            logits, cache = decoder.decode(tokens, cache, jnp.ones((batch,), bool))
            return cache, first_index_of_max(logits)  # the sampler's greedy pick
        return jax.lax.fori_loop(0, steps, step, (cache, tokens))

    @jax.jit
    def cache_free(state):
        decoder = nnx.merge(graphdef, state)
        step = lambda _, tokens: first_index_of_max(decoder(tokens[:, None])[:, 0])
        return jax.lax.fori_loop(0, steps, step, tokens)

    runs = {"no_cache": lambda: jax.block_until_ready(cache_free(state))}
    for max_len in cache_lengths:
        cache = init_cache(model.config, batch, max_len)._replace(
            lengths=jnp.full((batch,), 16, jnp.int32))
        runs[f"cache_{max_len}"] = functools.partial(
            lambda cache: jax.block_until_ready(cached(state, cache)), cache)
    best = best_times_interleaved({name: (run, run) for name, run in runs.items()}, repeats)
    return {name: 1e3 * seconds / steps for name, seconds in best.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny lengths: a smoke run")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--bytes_only", action="store_true",
                        help="only the bytes per host round (sampler_host_bytes.{json,md})")
    args = parser.parse_args()
    if args.bytes_only:
        shapes = ((32, 2048, 256), (64, 8192, 1024)) if args.quick else (
            (32, 2048, 256), (128, 8192, 1024), (512, 40960, 8192))
        rows = []
        for slots, max_len, max_turn in shapes:
            rows.append(host_traffic(slots, max_len, max_turn))
            print(json.dumps(rows[-1]), flush=True)
        if not args.quick:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "sampler_host_bytes.json"), "w") as f:
                json.dump(dict(jax=jax.__version__, rows=rows), f, indent=2)
            with open(os.path.join(args.out, "sampler_host_bytes.md"), "w") as f:
                f.write(host_traffic_markdown(rows, "python benchmarks/sampler.py --bytes_only"))
        return
    prompt_len, new_tokens, repeats = (8, 8, 1) if args.quick else (64, 128, 2)
    batches = (1, 32)
    threads = os.cpu_count()  # XLA's CPU client uses every core; torch gets the same
    rng = np.random.default_rng(0)

    load_before = os.getloadavg()
    rows, profiles = [], []
    for size, fields in SIZES.items():
        hf_model, ours = build_pair(fields)
        params = sum(p.numel() for p in hf_model.parameters())
        for batch in batches:
            prompts = rng.integers(0, fields["vocab_size"], (batch, prompt_len)).astype(np.int32)
            logit_diff = same_weights_check(hf_model, ours, prompts[:1])
            runs = dict(ours=(ours_generate(ours, prompts, new_tokens),) * 2)
            for torch_threads in (threads, 1):
                hf_run = hf_generate(hf_model, prompts, new_tokens, torch_threads)
                runs[f"hf_{torch_threads}t"] = (hf_run, functools.partial(hf_run, new_tokens=2))
            best = best_times_interleaved(runs, repeats)
            ours_s, hf_s, hf_1t_s = best["ours"], best[f"hf_{threads}t"], best["hf_1t"]
            row = dict(size=size, params=params, batch=batch, prompt_len=prompt_len,
                       new_tokens=new_tokens, ours_s=ours_s, hf_s=hf_s, hf_1thread_s=hf_1t_s,
                       ours_tok_s=batch * new_tokens / ours_s, hf_tok_s=batch * new_tokens / hf_s,
                       hf_1thread_tok_s=batch * new_tokens / hf_1t_s,
                       speedup=hf_s / ours_s, speedup_vs_best_hf=min(hf_s, hf_1t_s) / ours_s,
                       max_logit_diff=logit_diff)
            if batch == batches[-1]:  # where the time of a batched run goes (see `floors`)
                prefill = ours_generate(ours, prompts, 1)
                row["ours_prefill_s"] = best_times_interleaved(dict(p=(prefill, prefill)),
                                                               repeats)["p"]
            rows.append(row)
            print(json.dumps(row), os.getloadavg(), flush=True)
        profiles.append(dict(size=size, batch=batches[-1], ms_per_step=decode_step_profile(
            ours, batches[-1], (prompt_len + new_tokens, 512)),
            # the input embedding is a gather; every other weight is a matmul operand
            matmul_params=params - fields["vocab_size"] * fields["hidden_size"]))
        print(json.dumps(profiles[-1]), flush=True)
    peak = matmul_peak_gflop_s()

    _, small = build_pair(SIZES["4M"])
    overhead = [callback_overhead(small, rng.integers(0, 4096, (b, prompt_len)).astype(np.int32),
                                  new_tokens, repeats) for b in batches]
    print(json.dumps(overhead), flush=True)

    result = dict(
        environment=dict(jax=jax.__version__, torch=torch.__version__,
                         transformers=transformers.__version__, cpu=platform.processor() or
                         platform.machine(), cores=os.cpu_count(), torch_threads=threads,
                         jax_backend=jax.default_backend(),
                         load_average_before=load_before, load_average_after=os.getloadavg()),
        settings=dict(prompt_len=prompt_len, new_tokens=new_tokens, repeats=repeats,
                      greedy=True, dtype="float32", timing="best of repeats, sides interleaved, after a warm-up"),
        throughput=rows, decode_step_profile=profiles, callback_overhead=overhead,
        matmul_peak_gflop_s=peak, floors=floors(rows, profiles, peak, target=3.0))
    if args.quick:
        return
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sampler.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, "sampler.md"), "w") as f:
        f.write(markdown(result))


def floors(rows, profiles, peak_gflop_s, target):
    """What a `target`x speed-up over transformers' best batched time would take: the time left
    per decode step after our own prefill, next to two floors: the same matmuls without any
    attention (cache-free one-token forward, measured: what XLA achieves at this shape) and
    the matmul FLOPs at the machine's best square-matmul rate (what no shape beats)."""
    out = []
    for row in rows:
        if "ours_prefill_s" not in row:
            continue
        profile = next(p for p in profiles if p["size"] == row["size"])
        hf_best = min(row["hf_s"], row["hf_1thread_s"])
        budget = hf_best / target
        out.append(dict(
            size=row["size"], batch=row["batch"], hf_best_s=hf_best, target=target,
            budget_s=budget, ours_prefill_s=row["ours_prefill_s"],
            ours_decode_ms_per_step=1e3 * (row["ours_s"] - row["ours_prefill_s"]) / row["new_tokens"],
            budget_ms_per_step=1e3 * (budget - row["ours_prefill_s"]) / row["new_tokens"],
            cache_free_forward_ms=profile["ms_per_step"]["no_cache"],
            flop_floor_ms=1e3 * 2 * profile["matmul_params"] * row["batch"] / (peak_gflop_s * 1e9)))
    return out


def _round_trip(us):
    # The difference of two timed runs; below zero it is lost in run-to-run noise.
    return f"{us:.0f}" if us > 0 else f"below noise ({us:.0f})"


def _load(triple):
    return "/".join(f"{x:.1f}" for x in triple)


def markdown(result):
    env, settings = result["environment"], result["settings"]
    lines = [
        "# Sampler decode throughput: matpo_jax slot loop vs transformers `generate`",
        "",
        f"CPU, {env['cores']} cores; jax {env['jax']} (XLA CPU, all cores), torch {env['torch']} "
        f"with `torch.set_num_threads({env['torch_threads']})`, transformers "
        f"{env['transformers']}. Same weights (HF checkpoint loaded with `load_pretrained`), "
        f"float32, greedy, KV cache, prompt {settings['prompt_len']} tokens, "
        f"{settings['new_tokens']} new tokens per row (EOS ignored). Time = whole generate call "
        f"(prefill + decode), best of {settings['repeats']} interleaved with the other side, after "
        "a warm-up (compilation excluded). Load average (1/5/15 min) before the run: "
        f"{_load(env['load_average_before'])}, after: {_load(env['load_average_after'])} "
        "(the machine is shared; a load above the core count inflates both sides' times).",
        "",
        f"transformers is also timed with 1 torch thread: on a machine loaded by other processes, "
        f"{env['torch_threads']} OpenMP threads can be several times slower than 1; the "
        "'vs best' speed-up is against the faster of the two.",
        "",
        f"| model | params | batch | ours tok/s | transformers tok/s ({env['torch_threads']} "
        "threads) | transformers tok/s (1 thread) | speed-up (same threads) | speed-up (vs best) "
        "| max logit diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["throughput"]:
        lines.append(f"| {r['size']} | {r['params'] / 1e6:.1f}M | {r['batch']} | "
                     f"{r['ours_tok_s']:,.0f} | {r['hf_tok_s']:,.0f} | "
                     f"{r['hf_1thread_tok_s']:,.0f} | {r['speedup']:.1f}x | "
                     f"{r['speedup_vs_best_hf']:.1f}x | {r['max_logit_diff']:.1e} |")
    profiles = result["decode_step_profile"]
    names = list(profiles[0]["ms_per_step"])
    lines += ["", "Where a decode step goes (bare model, batch "
              f"{profiles[0]['batch']}, ms per step): a one-token forward without a cache vs "
              "`model.decode` over a cache of max_len tokens. The cache is heads-major per layer "
              "(keys [B, kv_heads, D, max_len], values [B, kv_heads, max_len, D]), scattered into "
              "in place; a decode step's attention is one fused elementwise pass over it (no dots, "
              "no transposes), so the gap is reading the whole cache once per step.", "",
              "| model | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for p in profiles:
        lines.append(f"| {p['size']} | " + " | ".join(f"{p['ms_per_step'][n]:.1f}" for n in names)
                     + " |")
    lines += ["", f"What {result['floors'][0]['target']:.0f}x transformers' best time would "
              "take at this batch: the time per decode step left after our own prefill, next to "
              "two floors: the same matmuls with no attention at all (cache-free one-token "
              "forward, measured above: what XLA's matmuls reach at this shape) and the matmul "
              "FLOPs at the machine's best float32 matmul rate "
              f"({result['matmul_peak_gflop_s']:.0f} GFLOP/s, 2048^2 square product, all cores). "
              "A budget near the first floor leaves nothing for attention over the cache, "
              "sampling and the loop.", "",
              "| model | batch | transformers best (s) | target time (s) | our prefill (s) | "
              "our decode ms/step | budget ms/step | cache-free forward ms | FLOP floor ms |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for f in result["floors"]:
        lines.append(f"| {f['size']} | {f['batch']} | {f['hf_best_s']:.2f} | {f['budget_s']:.2f} | "
                     f"{f['ours_prefill_s']:.2f} | {f['ours_decode_ms_per_step']:.1f} | "
                     f"{f['budget_ms_per_step']:.1f} | {f['cache_free_forward_ms']:.1f} | "
                     f"{f['flop_floor_ms']:.1f} |")
    lines += ["", "Host callback round trip (4M model; host called after every token vs once per "
              "prompt):", "",
              "| batch | one-call run (s) | every-token run (s) | host calls | us per round trip |",
              "|---:|---:|---:|---:|---:|"]
    for o in result["callback_overhead"]:
        lines.append(f"| {o['batch']} | {o['seconds_rare']:.3f} | {o['seconds_every_step']:.3f} | "
                     f"{o['host_calls_every_step']} | {_round_trip(o['us_per_round_trip'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
