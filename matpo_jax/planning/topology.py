"""TPU chips and slice topologies by their Cloud names (v5e-8, v5p-128, or v5e:2x4 shapes).

Accelerator-type names count TensorCores: a v5e chip has one, v4 and v5p chips two (v5p-128 is
64 chips). Figures are Google's published per-chip specifications.
"""
from __future__ import annotations

import dataclasses
import os
import re

GiB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
    generation: str  # as libtpu names topologies: v4, v5e, v5p, v6e
    hbm_bytes: int
    peak_bf16_flops: float  # dense matmul FLOP/s per chip
    hbm_bandwidth: float  # bytes/s per chip
    cores_per_chip: int  # TensorCores counted by the accelerator-type name


CHIPS = {
    "v4": Chip("v4", 32 * GiB, 275e12, 1228e9, 2),
    "v5e": Chip("v5e", 16 * GiB, 197e12, 819e9, 1),
    "v5p": Chip("v5p", 95 * GiB, 459e12, 2765e9, 2),
    "v6e": Chip("v6e", 32 * GiB, 918e12, 1640e9, 1),
}
_ALIASES = {"v5litepod": "v5e", "v6litepod": "v6e"}
# Physical shapes of the usual single slices, by chip count.
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
              256: "16x16"}
_HOST_CHIPS = (2, 2, 1)  # libtpu's default chips_per_host_bounds
_SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
              256: "4x8x8", 512: "8x8x8", 1024: "8x8x16"}


# jax's device_kind of each chip (a TPU VM's own devices).
_DEVICE_KINDS = {"tpu v4": "v4", "tpu v5 lite": "v5e", "tpu v5e": "v5e", "tpu v5": "v5p",
                 "tpu v5p": "v5p", "tpu v6 lite": "v6e", "tpu v6e": "v6e"}


def chip_for_device_kind(device_kind: str) -> Chip | None:
    generation = _DEVICE_KINDS.get(device_kind.strip().lower())
    return CHIPS[generation] if generation else None


class TopologyError(ValueError):
    """A topology name this module cannot place (the message names it and the known forms)."""


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str  # as given
    chip: Chip
    shape: str  # e.g. "4x4x4"

    @property
    def chips(self) -> int:
        count = 1
        for side in self.shape.split("x"):
            count *= int(side)
        return count

    @property
    def libtpu_name(self) -> str:
        return f"{self.chip.generation}:{self.shape}"

    def devices(self):
        """The slice's TPU devices as libtpu describes them (no TPU needed: compile-only)."""
        # Off a TPU VM, libtpu would otherwise query the GCE metadata server for the slice.
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
        from jax.experimental import topologies
        return topologies.get_topology_desc(platform="tpu", topology_name=self.libtpu_name,
                                            **self._host_bounds()).devices

    def _host_bounds(self) -> dict:
        """libtpu lays a slice out in hosts of 2x2x1 chips and refuses a slice that is not a
        whole number of them (v5e:1x1: a Colab TPU v5e-1 runtime); a slice smaller than a host
        is one host of its own size."""
        sides = [int(side) for side in self.shape.split("x")] + [1]
        bounds = tuple(min(side, host) for side, host in zip(sides, _HOST_CHIPS))
        return {} if bounds == _HOST_CHIPS else {"chips_per_host_bounds": bounds}


def parse_topology(name: str) -> Topology:
    """'v5p-128' (TensorCores), 'v5litepod-8', or an explicit 'v5e:2x4' / 'v5p:4x4x4' shape."""
    text = name.strip().lower()
    explicit = re.fullmatch(r"(v[0-9a-z]+):(\d+(?:x\d+)+)", text)
    counted = re.fullmatch(r"(v[0-9a-z]+)-(\d+)", text)
    generation = (explicit or counted).group(1) if (explicit or counted) else None
    generation = _ALIASES.get(generation, generation)
    if generation not in CHIPS:
        raise TopologyError(f"topology {name!r}: expected e.g. v5e-8, v5p-128 or v5e:2x4 with a "
                            f"chip among {sorted(CHIPS)}")
    chip = CHIPS[generation]
    if explicit:
        return Topology(name, chip, explicit.group(2))
    cores = int(counted.group(2))
    chips = cores // chip.cores_per_chip
    shapes = _SHAPES_3D if chip.cores_per_chip == 2 else _SHAPES_2D
    if cores % chip.cores_per_chip or chips not in shapes:
        raise TopologyError(f"topology {name!r}: no known {generation} slice of {cores} "
                            f"TensorCores; known chip counts {sorted(shapes)} "
                            f"(or give the shape, e.g. {generation}:2x2)")
    return Topology(name, chip, shapes[chips])
