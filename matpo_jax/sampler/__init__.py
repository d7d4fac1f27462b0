"""The jitted sampler: a `lax.while_loop` decoding one token per active slot per step, calling the
host (tools, scheduling) through `io_callback` whenever slots stop, and writing what it answers
back into the KV cache inside the loop. `loop.py` holds the loop, `host_protocol.py` what a host
receives and answers (and the callbacks' Python side), `host_transfer.py` what crosses to and from
the host each round, `ops.py` the token sampling, `writes.py` the in-loop injection extends and
shared-prefix copies, `capacity.py` how many decode slots fit a chip."""
from matpo_jax.sampler.capacity import (DecodeSlotsError, SlotBudget, check_decode_slots,
                                        decode_slot_budget, kv_bytes_per_slot)
from matpo_jax.sampler.host_protocol import (STOP_CACHE_FULL, STOP_EOS, STOP_IM_END, STOP_NONE,
                                             STOP_REASON_NAMES, STOP_TOOL_CALL, STOP_TURN_CAP,
                                             SlotEvents, SlotHost, SlotInjection, SlotLoopStats,
                                             SlotProtocolError, chat_stop_ids)
from matpo_jax.sampler.loop import (PagedCache, default_buckets, default_lanes, generate,
                                    mesh_of, normalize_buckets, run_slots)
from matpo_jax.sampler.ops import Sampling, SamplingConfigError
