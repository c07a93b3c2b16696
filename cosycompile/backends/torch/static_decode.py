"""Decoding over a KV cache of fixed size that stays on the device, and on CUDA replayed as a CUDA graph.

At batch 1 a decode step of the 0.5B LM is hundreds of small kernels: on an H100 launching them costs
more than reading its weights (docs/bench-log/2026-11-25-h100-first-lease.md). A CUDA graph launches
the whole step at once, but
it replays fixed shapes and fixed addresses, which a cache that grows by one position a step (the
``llm_step`` program) does not have. The ``llm_step_static`` program reads a cache of ``M`` slots
and returns the new token's keys and values; this module owns that cache and writes them into slot
``position`` inside the same replay, so the host only copies the next embedding in and the logits
out.

A CPU has no graph to replay, but the growing cache costs it too: ``llm_step`` returns a new present
cache every token, a larger allocation each time, which the C allocator maps afresh and the kernel
zeroes page by page (docs/bench-log/2026-12-04-llm-step-allocator-zen4.md). Without a capture the
decoder's cache therefore grows in small blocks, copied once a block, and the step only writes the
new token's slot.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import torch

# The cache is allocated in whole blocks of slots, so utterances of similar length share a capture.
SLOT_BLOCK = 256
# Without a capture (a CPU) the cache instead grows by this many slots whenever it is full: the step
# reads every slot, masked or not, so the fewer spare slots the less it reads, and copying the cache
# once every this many tokens costs next to nothing.
GROWTH_BLOCK = 32


def slots_for(positions: int, max_slots: int | None = None) -> int:
    """Cache slots allocated for ``positions``: rounded up to a whole block, within ``max_slots``."""
    slots = max(SLOT_BLOCK, -(-positions // SLOT_BLOCK) * SLOT_BLOCK)
    return slots if max_slots is None else min(slots, max_slots)


class StaticCacheDecoder:
    """One-token decode steps of a static-cache step program over a cache kept on ``device``.

    ``step_fn(inputs_embeds, key_values, position) -> (logits, new_key_values)`` is the compiled
    ``llm_step_static`` package or the PyTorch module it came from. ``start`` takes the prefill's
    present cache; each ``step`` then runs one token. On CUDA (unless ``cuda_graph=False``) the
    first step is captured, the cache write and the position increment included, and later steps
    replay it. Numpy arrays in give numpy arrays out, as the pipeline's runners do.
    """

    def __init__(self, step_fn: Callable[..., Any], device: str, cuda_graph: bool | None = None,
                 max_slots: int | None = None) -> None:
        self.step_fn = step_fn
        self.max_slots = max_slots
        self.device = torch.device(device)
        self.cuda_graph = self.device.type == "cuda" if cuda_graph is None else cuda_graph
        if self.cuda_graph and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.key_values: torch.Tensor | None = None
        self.position = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._next = 0  # the position on the host: reading the device's would synchronise every step
        self._embeds: torch.Tensor | None = None
        self._logits: torch.Tensor | None = None
        self._graph: Any = None

    @property
    def capacity(self) -> int:
        """Slots in the cache (0 before ``start``)."""
        return 0 if self.key_values is None else int(self.key_values.shape[4])

    def fits(self, positions: int) -> bool:
        """Whether a cache for ``positions`` fits what the program was compiled for."""
        return self.max_slots is None or positions <= self.max_slots

    @torch.inference_mode()
    def start(self, present: torch.Tensor | np.ndarray, max_new: int) -> None:
        """Take a prefill's present cache [L, 2, B, KVH, P, D] and room for ``max_new`` more tokens."""
        if isinstance(present, np.ndarray):
            present = torch.from_numpy(np.ascontiguousarray(present))
        present = present.to(self.device)
        L, two, B, KVH, P, D = present.shape
        if not self.fits(P + max_new):
            raise ValueError(f"{P} + {max_new} positions exceed the {self.max_slots} slots the step was compiled for")
        if self.cuda_graph:
            slots = slots_for(P + max_new, self.max_slots)
        else:
            slots = self._grown(P + 1)
        shape = (L, two, B, KVH, slots, D)
        if self.key_values is None or tuple(self.key_values.shape) != shape or self.key_values.dtype != present.dtype:
            # New shapes mean new buffers, and a capture over the old addresses is no longer valid.
            self.key_values = torch.zeros(shape, dtype=present.dtype, device=self.device)
            self._graph = self._embeds = self._logits = None
        else:
            self.key_values[..., P:, :].zero_()
        self.key_values[..., :P, :].copy_(present)
        self.position.fill_(P)
        self._next = P

    def _grown(self, positions: int) -> int:
        """Slots for ``positions`` without a capture: whole growth blocks, within ``max_slots``."""
        slots = -(-positions // GROWTH_BLOCK) * GROWTH_BLOCK
        return slots if self.max_slots is None else min(slots, self.max_slots)

    def _grow(self) -> bool:
        """Room for one more position in a larger cache (no capture holds the old one's address);
        False when the cache is already as large as the program allows."""
        assert self.key_values is not None
        slots = self._grown(self.capacity + 1)
        if slots <= self.capacity:
            return False
        grown = self.key_values.new_zeros((*self.key_values.shape[:4], slots, self.key_values.shape[5]))
        grown[..., :self.capacity, :].copy_(self.key_values)
        self.key_values = grown
        return True

    def _run(self, embeds: torch.Tensor) -> torch.Tensor:
        assert self.key_values is not None
        logits, new = self.step_fn(embeds, self.key_values, self.position)
        self.key_values.index_copy_(4, self.position, new.to(self.key_values.dtype))
        self.position.add_(1)
        return logits

    def _capture(self, embeds: torch.Tensor) -> None:
        self._embeds = embeds.clone()
        saved = self.key_values.clone(), self.position.clone()
        # Warm-up on a side stream first: lazy initialisation must not happen during the capture.
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._run(self._embeds)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.key_values.copy_(saved[0])
        self.position.copy_(saved[1])
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._logits = self._run(self._embeds)
        # Capturing records the work without doing it: restore the state the replay starts from.
        self.key_values.copy_(saved[0])
        self.position.copy_(saved[1])

    def step(self, embeds: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
        """Logits [B, 1, V] of one token whose input embedding is ``embeds`` [B, 1, H]. On CUDA the
        tensor returned is the graph's output buffer, which the next step overwrites."""
        if isinstance(embeds, np.ndarray):
            return self.step(torch.from_numpy(np.ascontiguousarray(embeds))).float().cpu().numpy()
        if self.key_values is None:
            raise RuntimeError("start() the decoder with a prefill cache first")
        if self._next >= self.capacity and (self.cuda_graph or not self._grow()):
            raise RuntimeError(f"the static KV cache is full ({self.capacity} slots)")
        self._next += 1
        with torch.inference_mode():
            embeds = embeds.to(self.device, self.key_values.dtype)
            if not self.cuda_graph:
                return self._run(embeds)
            if self._graph is None or self._embeds is None or self._embeds.shape != embeds.shape:
                self._capture(embeds)
            self._embeds.copy_(embeds)
            self._graph.replay()
            return self._logits


class DecoderPerThread:
    """The decoders one compiled step hands out: one per thread, kept from utterance to utterance.

    A decoder made afresh for each utterance captures its CUDA graph afresh (a warm-up step and a
    capture, every time); a kept one replays its capture whenever the cache size matches. One per
    thread, because a decoder owns its cache: concurrent requests on a shared one would overwrite it.
    """

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._local = threading.local()

    def get(self) -> Any:
        """This thread's decoder, made on first use."""
        dec = getattr(self._local, "decoder", None)
        if dec is None:
            dec = self._local.decoder = self._make()
        return dec
