"""Small worlds and a prepared dataset shared by the data tests (built once per session)."""
import pytest

from matpo_jax.data import synthetic_multihop
from matpo_jax.data.oracle import LocalCorpusTools
from matpo_jax.data.synthetic_world import build_world

SMALL = dict(num_entities=80, num_questions=400)


@pytest.fixture(scope="session")
def small_world_kwargs():
    return dict(SMALL)


@pytest.fixture(scope="session")
def world():
    return build_world(seed=7, noise=0.0, **SMALL)


@pytest.fixture(scope="session")
def noisy_world():
    return build_world(seed=7, noise=1.0, **SMALL)


@pytest.fixture(scope="session")
def noisy_tools(noisy_world):
    return LocalCorpusTools(noisy_world.documents)


@pytest.fixture(scope="session")
def small_config():
    return synthetic_multihop.make_config(seed=5, num_entities=60, num_questions=200, noise=0.3)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, small_config):
    """(data_dir, builder) of a synthetic_multihop dataset built with tfds, without TensorFlow."""
    data_dir = tmp_path_factory.mktemp("tfds")
    return data_dir, synthetic_multihop.prepare_dataset(small_config, data_dir)
