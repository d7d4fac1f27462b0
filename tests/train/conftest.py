"""Fixtures shared by the training-infrastructure tests (config, checkpoints, metrics)."""
import jax
import pytest
from jax.sharding import AxisType


@pytest.fixture
def make_mesh():
    """A ("data", "fsdp", "tensor") mesh over the 8 simulated CPU devices (Auto axes)."""

    def build(data: int, fsdp: int, tensor: int) -> jax.sharding.Mesh:
        return jax.make_mesh((data, fsdp, tensor), ("data", "fsdp", "tensor"),
                             axis_types=(AxisType.Auto,) * 3)

    return build
