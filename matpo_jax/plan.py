"""Plan a run on a TPU slice from any machine: compile the real train step and one sampler decode
step for the topology ahead of time and print per-chip memory against HBM, FLOPs per step and
the step time at a stated MFU.

    pip install -e ".[tpu]"   # libtpu: compiling for TPU needs no TPU
    python -m matpo_jax.plan --config=configs/qwen3_14b_musique.py --topology=v5p-128
    python -m matpo_jax.plan --config=configs/qwen3_4b_musique.py --topology=v5e-64 \
        --out=benchmarks/results        # also writes plan_<config>_<topology>.json and plan.md

Shapes come from the config: model.arch and dtypes, mesh, rl.pack_rows x rl.pack_len (the
smallest packed batch a step sees; --rows for more), the RL loss and optimizer, rollout.decode_slots
x rollout.max_context for the KV cache, rollout.temperature for the log-probs.
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile for TPU, run nothing: before jax loads

import dataclasses  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from absl import app, flags  # noqa: E402

from matpo_jax import config as config_lib  # noqa: E402

# --config=FILE[:ARG] and --config.a.b=v overrides as train reads them (config/cli.py): a bad path
# or field is one line naming it.
_CONFIG, _ = config_lib.define_flags(with_workdir=False)
_VERBOSE = flags.DEFINE_bool("verbose", False, "Full tracebacks on errors.")
_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU slice: v5e-8, v5p-128, v5e:2x4, ...")
_ROWS = flags.DEFINE_integer("rows", None, "Packed rows per train step (default rl.pack_rows).")
_REMAT = flags.DEFINE_string("remat", None, "Rematerialisation policy (default train.remat, "
                             "else full).")
_SCAN = flags.DEFINE_bool("scan_layers", True, "Compile the decoder layers as one scan.")
_MICRO = flags.DEFINE_integer("micro_batches", None, "Micro-batches per optimizer step (default "
                              "rl.micro_batches).")
_SEARCH = flags.DEFINE_bool("search_micro_batches", True, "If the train step does not fit, "
                            "compile it again with 2x, 4x ... micro-batches until it does.")
_MFU = flags.DEFINE_float("mfu", 0.4, "Model FLOPs utilisation for the step-time estimate.")
_TRAIN = flags.DEFINE_bool("train", True, "Compile the train step.")
_DECODE = flags.DEFINE_bool("decode", True, "Compile one sampler decode step.")
_NOTE = flags.DEFINE_string("note", None, "A remark kept in the JSON and under plan.md's table.")
_TAG = flags.DEFINE_string("tag", None, "Suffix of the JSON's name (a variant of a config, e.g. "
                           "with --config.mesh.tensor=8).")
_OUT = flags.DEFINE_string("out", None, "Directory for plan_<config>_<topology>.json + plan.md.")


def _train_fit_check(inputs, topology) -> dict:
    """What `train`'s check before any work (planning/fit.py) says of this config on the slice."""
    from matpo_jax import parallel
    from matpo_jax.config import ConfigError
    from matpo_jax.planning import fit

    mesh = parallel.make_mesh(inputs.mesh_shape, devices=topology.devices())
    try:
        estimate, refused = fit.check_fits(inputs, mesh, topology.chip.hbm_bytes), None
    except ConfigError as error:
        estimate, refused = fit.estimate(inputs, mesh, topology.chip.hbm_bytes), error.problems
    return dict(dataclasses.asdict(estimate), passes=refused is None, refused=refused)


def _check_libtpu() -> None:
    """Compiling for a TPU slice needs libtpu (jax's TPU support), also on a machine without one."""
    if importlib.util.find_spec("libtpu") is None:
        raise config_lib.ConfigError(
            f"--topology={_TOPOLOGY.value}: compiling for a TPU slice needs libtpu, which this "
            "environment lacks (pip install 'jax[tpu]')")


@config_lib.one_line_errors
def main(argv):
    del argv
    if _TOPOLOGY.value is None:
        raise config_lib.ConfigError("--topology is required (e.g. --topology=v5p-128)")
    cfg = config_lib.config_from_flags(_CONFIG, check_files=False)
    from matpo_jax.planning import report, step_plan
    from matpo_jax.planning.topology import TopologyError, parse_topology
    from matpo_jax.run.plan_inputs import plan_inputs

    started = time.perf_counter()
    try:
        topology = parse_topology(_TOPOLOGY.value)
    except TopologyError as error:
        raise config_lib.ConfigError(f"--topology: {error}") from None
    _check_libtpu()
    inputs = plan_inputs(cfg, rows=_ROWS.value, remat=_REMAT.value,
                         scan_layers=_SCAN.value, micro_batches=_MICRO.value, mfu=_MFU.value)
    plan = step_plan.make_plan(inputs, topology, decode=_DECODE.value, train=_TRAIN.value,
                               search_micro_batches=_SEARCH.value)
    plan["train_fit_check"] = _train_fit_check(inputs, topology)
    config_path = flags.FLAGS["config"].value
    kept = [a for a in sys.argv[1:] if not a.startswith(("--out", "--note", "--tag"))]
    overrides = [a.removeprefix("--config.") for a in kept if a.startswith("--config.")]
    plan.update(config=config_path.rsplit("/", 1)[-1] + "".join(f" {o}" for o in overrides),
                command="python -m matpo_jax.plan " + " ".join(shlex.quote(a) for a in kept),
                machine=f"{platform.machine()}, {os.cpu_count()} CPUs")
    plan["wall_s"] = round(time.perf_counter() - started, 1)
    if _NOTE.value:
        plan["note"] = _NOTE.value
    print("\n".join(step_plan.summary_lines(plan)))
    if _OUT.value:
        out = Path(_OUT.value)
        out.mkdir(parents=True, exist_ok=True)
        name = step_plan.plan_name(config_path, topology.name)
        path = out / (f"{name}_{_TAG.value}.json" if _TAG.value else f"{name}.json")
        path.write_text(json.dumps(step_plan.as_json_ready(plan), indent=1) + "\n")
        print(f"wrote {path} and {report.write_markdown(out)}")


if __name__ == "__main__":
    app.run(main, flags_parser=config_lib.flags_parser)
