"""What crosses between the device and the host in a round of the slot loop, and how much.

Device -> host: the stopped slots' turns, packed into one flat array (row after row, each row's
first turn_len entries) whose length is the smallest of `flat_widths` that holds them, so a round
moves about as many turn tokens as the slots sampled, not slots x max_turn.
Host -> device: the injected tokens, read by each extend at its own static [rows, width] (see
`writes.inject`), so a round moves the positions its extends compute, not slots x max_len.
`HostTraffic` counts the bytes of every array that crosses, per round.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax.numpy as jnp
import numpy as np


def flat_widths(limit: int, smallest: int = 256, factor: int = 4) -> tuple[int, ...]:
    """Static lengths of a packed transfer of at most `limit` entries: smallest, x factor, ...,
    then `limit`. A transfer of n entries takes the first width >= n: at most `factor` times n
    (or `smallest`), and one compiled branch per width."""
    widths, width = [], smallest
    while width < limit:
        widths.append(width)
        width *= factor
    return tuple(widths) + (limit,)


def pack_rows(values, counts, width: int):
    """The first counts[b] entries of every row b of values [B, C], concatenated in row order
    into a flat [width] array (zeros past the total). One gather of `width` entries."""
    slots, columns = values.shape
    ends = jnp.cumsum(counts)
    position = jnp.arange(width)
    row = jnp.minimum(jnp.searchsorted(ends, position, side="right"), slots - 1)
    column = jnp.clip(position - (ends[row] - counts[row]), 0, columns - 1)
    return jnp.where(position < ends[-1], values[row, column], jnp.zeros((), values.dtype))


def unpack_rows(flat: np.ndarray, counts: np.ndarray, columns: int) -> np.ndarray:
    """pack_rows' inverse on the host: [B, columns], row b's first counts[b] entries from `flat`,
    zeros elsewhere."""
    out = np.zeros((len(counts), columns), flat.dtype)
    offset = 0
    for row in np.flatnonzero(counts):
        n = int(counts[row])
        out[row, :n] = flat[offset:offset + n]
        offset += n
    return out


def nbytes(*arrays) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays))


@dataclass
class HostTraffic:
    """Bytes that crossed per host round: [to_host, from_host] for each round, the token reads
    of a round's injection counted with that round."""

    rounds: list[list[int]] = field(default_factory=list)

    def start_round(self, to_host: int) -> None:
        self.rounds.append([to_host, 0])

    def add(self, to_host: int, from_host: int) -> None:
        if not self.rounds:
            self.rounds.append([0, 0])
        self.rounds[-1][0] += to_host
        self.rounds[-1][1] += from_host
