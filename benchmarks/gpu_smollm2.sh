#!/usr/bin/env bash
# The GPU benchmark of the real-model MATPO config (benchmarks/gpu_smollm2.py: a few RL steps,
# tokens/s, memory, one validation point, in under 10 minutes on one GPU), prepared here and run
# on a lent GPU machine that reaches no package registry and takes a few tens of MB of files.
#
#   bash benchmarks/gpu_smollm2.sh prepare     # here, once: fills .gpu/ (ignored by git):
#       .gpu/smollm2-tokenizer/   SmolLM2's tokenizer.json, tokenizer_config.json,
#                                 chat_template.jinja (from models/smollm2-135m-instruct,
#                                 `make smollm2`), for the random-init model of its shape
#       .gpu/whl/                 wheels (cp312, manylinux x86_64, --no-deps) of the Python
#                                 packages matpo_jax imports that the GPU image lacks
#   bash benchmarks/gpu_smollm2.sh run [ARGS]  # there (carry .gpu): installs .gpu/whl into
#                                 /tmp/site, then python3 benchmarks/gpu_smollm2.py ARGS
#                                 (e.g. --out=$OUT/gpu_smollm2.json); see that file's header
#   bash benchmarks/gpu_smollm2.sh check      # here: --dry_run of both weight choices
#
# The GPU image's Python (python3) has jax with its CUDA plugin, flax, optax, orbax, transformers,
# tokenizers, safetensors, matplotlib, ...: IMAGE below is its package list as the device tool's
# KINDS.md gave it (read 2026-11-17); only the others travel. Its jax (0.11) is newer than setup.py's pin (<0.11): if the
# run fails on an API change, that is the first suspect.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=" absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
 botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
 coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
 diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
 frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
 hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
 jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
 linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
 meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
 narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
 nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
 nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
 nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
 onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
 orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
 prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
 pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
 pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
 sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn
 sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
 statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
 tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
 torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
 typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp "

case "${1:-}" in
prepare)
  PY=${PY:-.venv/bin/python}
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
  mkdir -p .gpu/smollm2-tokenizer .gpu/whl
  for f in tokenizer.json tokenizer_config.json chat_template.jinja; do
    cp models/smollm2-135m-instruct/$f .gpu/smollm2-tokenizer/
  done
  # Every distribution a matpo_jax module imports (all submodules imported), as NAME==VERSION.
  "$PY" - "$IMAGE" > .gpu/requirements.txt <<'EOF'
import importlib, importlib.metadata as md, pkgutil, sys, warnings
warnings.simplefilter("ignore")
import matpo_jax
import diskcache, tensorboardX  # imported inside functions a training run calls
for m in pkgutil.walk_packages(matpo_jax.__path__, "matpo_jax."):
    try:
        importlib.import_module(m.name)
    except Exception as e:  # a module needing an optional extra
        print(f"# skipped {m.name}: {e}", file=sys.stderr)
image = {n.lower().replace("_", "-") for n in sys.argv[1].split()}
by_module = md.packages_distributions()
needed = set()
for name in list(sys.modules):
    for dist in by_module.get(name.split(".")[0], []):
        needed.add(dist)
for dist in sorted(needed):
    key = dist.lower().replace("_", "-")
    # ipython / traitlets: imported here only because installed (optional for tfds)
    if key in image or key.startswith(("nvidia-", "jax-")) or key in (
            "matpo-jax", "ipython", "traitlets"):
        continue
    print(f"{dist}=={md.version(dist)}")
EOF
  echo "wheels to carry: $(tr '\n' ' ' < .gpu/requirements.txt)"
  # One at a time: a package published only as a source archive (promise) is built into a
  # wheel here instead (pure Python, so it installs there too).
  while read -r req; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux1_x86_64 --platform any -d .gpu/whl "$req" 2>/dev/null \
    || "$PY" -m pip wheel -q --no-deps -w .gpu/whl "$req" \
    || echo "could not fetch $req: the run may fail importing it" >&2
  done < .gpu/requirements.txt
  du -sh .gpu
  ;;
run)
  shift
  if compgen -G ".gpu/whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .gpu/whl/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
  fi
  export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 benchmarks/gpu_smollm2.py "$@" 2>&1 | tee "${OUT:-/tmp}/gpu_smollm2.log"
  ;;
check)
  PY=${PY:-.venv/bin/python}
  "$PY" benchmarks/gpu_smollm2.py --dry_run --weights=real
  "$PY" benchmarks/gpu_smollm2.py --dry_run --weights=random
  ;;
*)
  sed -n '2,20p' "$0"
  exit 2
  ;;
esac
