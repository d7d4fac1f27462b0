"""Test-session setup shared by every test file.

Eight simulated CPU devices so sharding tests see a real mesh; must be set before jax is imported.
Fixtures used by several test folders live in tests/fixtures/ and are loaded as plugins here.
"""
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
pytest_plugins = ["fixtures.servers_and_chat", "fixtures.hf_models", "fixtures.rl_batches",
                  "fixtures.mesh", "fixtures.compile_cache"]
