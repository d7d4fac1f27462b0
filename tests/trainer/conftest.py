"""Fixtures of the trainer tests."""
import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache


@pytest.fixture(scope="session")
def compilation_cache_dir(tmp_path_factory):
    """JAX's persistent compilation cache, on for the tests that build the same tiny training
    phase many times (new jit closures, in this process or in killed and restarted processes):
    each compiles once. Pass the directory to subprocesses as JAX_COMPILATION_CACHE_DIR."""
    directory = str(tmp_path_factory.mktemp("jax_cache"))
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = {name: getattr(jax.config, name) for name in names}
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()
    yield directory
    for name, value in before.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()
