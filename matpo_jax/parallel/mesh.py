"""The device mesh and multi-host start-up.

The mesh has three axes: "data" (pure data parallelism), "fsdp" (data parallelism whose parameters
and optimizer state are sharded too) and "tensor" (attention heads / MLP hidden units split across
chips). The batch axis is sharded over ("data", "fsdp").
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
from typing import Mapping, Sequence

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from matpo_jax.parallel.join_watchdog import JAX_MARGIN_S, JoinWatchdog

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


class MeshShapeError(ValueError):
    """Mesh axis sizes that do not fit the devices (the message names the mesh.<axis> field)."""


def resolve_mesh_shape(shape: Mapping[str, int], num_devices: int) -> dict[str, int]:
    """The (data, fsdp, tensor) sizes with the one -1 axis (if any) filled in from `num_devices`;
    missing axes are 1. The only place the -1 is resolved."""
    unknown = set(shape) - set(MESH_AXES)
    if unknown:
        raise MeshShapeError(f"unknown mesh axes {sorted(unknown)}; expected {MESH_AXES}")
    sizes = {axis: int(shape.get(axis, 1)) for axis in MESH_AXES}
    free = [axis for axis, size in sizes.items() if size == -1]
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if len(free) > 1:
        raise MeshShapeError(f"mesh: at most one axis may be -1, got {sizes}")
    if free:
        if num_devices % fixed:
            raise MeshShapeError(f"mesh.{free[0]} = -1 but {num_devices} devices do not divide "
                                 f"by the other axes ({fixed})")
        sizes[free[0]] = num_devices // fixed
    elif fixed != num_devices:
        expression = "*".join(f"mesh.{axis}" for axis in MESH_AXES)
        raise MeshShapeError(f"{expression} = {fixed} but {num_devices} devices")
    return sizes


def make_mesh(shape: Mapping[str, int] | None = None, *, data: int = 1, fsdp: int = 1,
              tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh, from a dict or keywords. One axis may be -1 to take
    the remaining devices. Axes are Auto so the compiler propagates shardings through the model."""
    devices = list(devices if devices is not None else jax.devices())
    sizes = resolve_mesh_shape(dict(shape) if shape is not None else
                               dict(data=data, fsdp=fsdp, tensor=tensor), len(devices))
    shape = tuple(sizes[a] for a in MESH_AXES)
    axis_types = (AxisType.Auto,) * len(MESH_AXES)
    try:
        return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
    except NotImplementedError:
        # An axis that is no product of whole torus axes (tensor 8 on a v5p-128's 4x4x4): split
        # a physical axis (its collectives are slower) rather than refuse the mesh.
        from jax.experimental import mesh_utils
        grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
        return Mesh(grid, MESH_AXES, axis_types=axis_types)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over data and fsdp; the rest replicated."""
    return NamedSharding(mesh, P(BATCH_AXES))


# Environment variables whose presence means this process is one of several hosts.
_MULTI_HOST_ENV = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS")


def is_multi_host_env(env: Mapping[str, str] | None = None) -> bool:
    """True on a multi-host launch: an explicit coordinator address, MATPO_DISTRIBUTED=1, a TPU
    pod slice (several TPU_WORKER_HOSTNAMES), or SLURM with more than one task."""
    env = os.environ if env is None else env
    if env.get("MATPO_DISTRIBUTED", "").lower() in ("1", "true", "yes"):
        return True
    if any(env.get(name) for name in _MULTI_HOST_ENV):
        return True
    if len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]) > 1:
        return True
    return int(env.get("SLURM_NTASKS", "1") or 1) > 1


def maybe_initialize_distributed(force: bool | None = None, *, coordinator: str | None = None,
                                 num_processes: int | None = None, process_id: int | None = None,
                                 heartbeat_timeout_s: int | None = None,
                                 initialization_timeout_s: int | None = None) -> bool:
    """Calls jax.distributed.initialize() once, on a multi-host launch (or when `force`, or when
    `coordinator` is given). Must run before anything touches jax devices. Returns whether it
    initialised.

    coordinator ("HOST:PORT"), num_processes, process_id: an explicit launch (any platform, e.g.
    several CPU processes on one machine); without them jax auto-detects the cluster (TPU VMs,
    SLURM). CPU collectives go through gloo, so CPU processes really exchange data.
    heartbeat_timeout_s: how long the coordination service waits for a silent process before it
    declares it dead and fails the others (jax's default: 100 s).
    initialization_timeout_s: how long to wait for every process to join; past it the process
    prints one line naming the coordinator and the processes not seen and exits (join_watchdog)."""
    explicit = coordinator is not None
    wanted = explicit or (is_multi_host_env() if force is None else force)
    if not wanted or jax.distributed.is_initialized():
        return False
    if explicit and (num_processes is None or process_id is None):
        raise ValueError("--coordinator needs --num_processes and --process_id")
    if explicit and not 0 <= process_id < num_processes:
        raise ValueError(f"--process_id={process_id} is outside [0, --num_processes="
                         f"{num_processes})")
    # Only affects the CPU backend: without it CPU processes cannot run cross-process collectives.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeouts = {}
    if heartbeat_timeout_s is not None:
        timeouts["heartbeat_timeout_seconds"] = int(heartbeat_timeout_s)
    if initialization_timeout_s is not None:
        if not initialization_timeout_s > 0:
            raise ValueError(f"--initialization_timeout_s={initialization_timeout_s}: must be > 0")
        # jax's deadline falls later: the watchdog's line, not jax's abort, ends a missing peer.
        timeouts["initialization_timeout"] = int(initialization_timeout_s) + JAX_MARGIN_S
        watchdog = JoinWatchdog(initialization_timeout_s, coordinator=coordinator,
                                num_processes=num_processes, process_id=process_id)
    else:
        watchdog = contextlib.nullcontext()
    with watchdog:
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id, **timeouts)
    logging.info("jax.distributed initialised: process %d of %d",
                 jax.process_index(), jax.process_count())
    return True
