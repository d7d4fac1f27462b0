"""Rematerialisation policies for the training forward, applied per decoder layer.

A policy says which of a layer's intermediates the backward may keep; everything else it recomputes
from the layer's input. "none" keeps everything (fastest, most memory); "full" keeps only each
layer's input (one [rows, T, hidden] array per layer; the forward runs twice); the "dots" policies
keep matmul outputs and recompute the elementwise work around them.
"""
from __future__ import annotations

import jax

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def remat_policy(name: str):
    """The jax.checkpoint policy of a REMAT_POLICIES name (a clear error for any other)."""
    if name not in REMAT_POLICIES:
        raise ValueError(f"remat policy {name!r}, expected one of {tuple(REMAT_POLICIES)}")
    return REMAT_POLICIES[name]
