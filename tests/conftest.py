"""Test-session setup shared by every test file.

Eight simulated CPU devices so sharding tests see a real mesh, and XLA's fast compile
(tests/fixtures/xla.py); must be set before jax is imported.
One persistent compilation cache for the session, inherited by every subprocess (training runs,
killed and restarted runs, notebook kernels): the many tiny runs compile the same programs, and a
program loaded from the cache is the one compiled, so exactness tests stay bitwise. It starts
empty each session, so no result depends on an earlier run.
Fixtures used by several test folders live in tests/fixtures/ and are loaded as plugins here.
"""
import atexit
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixtures.xla import xla_flags  # noqa: E402  (plain module: imports no jax)

os.environ.setdefault("XLA_FLAGS", xla_flags(devices=8))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _CACHE = tempfile.mkdtemp(prefix="matpo_jax_test_cache_")
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
    os.environ.update(JAX_COMPILATION_CACHE_DIR=_CACHE,
                      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")

# Synchronous dispatch on the CPU client of this process (read when jax creates the client, so set
# before any test runs; the runs the tests start as subprocesses keep the default). The Pallas TPU
# interpreter runs a kernel through host callbacks that themselves run jax operations; dispatched
# asynchronously, such an operation can queue behind the computation that waits for the callback,
# and the process waits forever (seen once in `make test`: a `paged_tpu` decode, its callback
# thread stopped in a jnp multiply, the test worker idle). Synchronously, each runs in its caller.
# That test beside two busy loops (Dec 7): asynchronous, 3 of 6 runs hung; synchronous, 0 of 6.
import jax  # noqa: E402  (after XLA_FLAGS and JAX_PLATFORMS above)

jax.config.update("jax_cpu_enable_async_dispatch", False)

pytest_plugins = ["fixtures.servers_and_chat", "fixtures.hf_models", "fixtures.rl_batches",
                  "fixtures.mesh", "fixtures.compile_cache", "fixtures.qwen3_real_tokenizer",
                  "fixtures.smollm2"]

# The whole-run tests first (measured with --durations). `make test` runs the files on 2 workers
# (pytest -n 2 --dist loadfile --no-loadscope-reorder: by default xdist reorders files by their
# number of tests, which put these few-test files last), which take files in collection order,
# the first ones in turn: worker 1 the 1st and 3rd, worker 2 the 2nd and 4th, then whoever is
# free. So the two files that start training processes of their own, the multi-process test (3
# processes with gloo) and the end-to-end test (a run beside a busy loop), are 1st and 3rd: one
# after the other on one worker. Side by side (Dec 2, a fresh clone on an idle 2-core machine)
# they took 451 and 385 s and the whole suite 25.5 min, with 5 busy processes on the 2 cores.
LONGEST_FIRST = ("run/test_multiprocess.py", "notebooks/test_notebook_runs.py",
                 "run/test_end_to_end.py",
                 # then by time measured on Dec 7 (pytest --durations beside a training run):
                 "run/test_lora_run.py", "run/test_real_path.py",
                 "agents/test_rollout_smollm2_real.py",
                 "trainer/test_training_fault_injection.py",
                 "model/test_sharded_kernel_attention.py", "sampler/test_sampling_profiles.py",
                 "trainer/test_stability_metrics.py", "model/test_smollm2_real.py",
                 "model/test_lora_adapters.py", "trainer/test_loop.py",
                 "trainer/test_rollout_correction.py", "agents/test_rollout_limits.py",
                 "trainer/test_lora_train_step.py", "model/test_peft_export.py",
                 "run/test_evaluate_cli.py", "run/test_gcs_workdir.py",
                 "model/test_paged_decoding.py", "trainer/test_train_step_exactness.py",
                 "sampler/test_sampler_mesh.py", "run/test_pretrain.py",
                 "agents/test_rollout_e2e.py", "agents/test_rollout_qwen3_real.py")


def pytest_collection_modifyitems(config, items):
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    missing = [n for n in LONGEST_FIRST if not os.path.isfile(os.path.join(tests_dir, n))]
    if missing:  # a renamed file would silently lose its place
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names missing files: {missing}")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def position(item):
        name = os.path.relpath(str(item.path), tests_dir).replace(os.sep, "/")
        return rank.get(name, len(rank))

    items.sort(key=position)  # stable: every other file keeps its order
