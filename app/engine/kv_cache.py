"""Per-request self-attention K/V cache strategies for the decoder loop.

One small interface, three strategies:

- `ConcatCache` (default): past self K/V grow on the host along axis 2, in buffers that add
  `GROWTH_CHUNK` positions when full (the unfilled slots are masked); a prefix of T > 1 tokens
  is prefilled in one decoder call, with logits only at the positions asked for.
- `StaticCache` (the NPU path): preallocated [B, H, N, Dh] buffers with N = n_text_ctx, T = 1 on
  every step (a prompt in chunks of `STATIC_PREFILL` tokens, the last padded), `attention_mask`
  [B, N + T] marks the filled slots plus the new tokens, the host writes `new_*` into their
  slots. The decoder's input shapes never change (for a given batch size), so a static-shape
  device compiles the graph once for steps and once for prompts.
- `NoCache`: the reference; re-runs the whole sequence every step with an empty past (P = 0).

`ConcatCache` and `StaticCache` share one mechanism (`_SlotCache`) and differ only in how many
positions they hold and how many tokens they feed per call.

All of them take the *whole* token sequences [B, L] and feed the decoder only what it has not seen
yet, so the decode loop does not care which strategy it runs. Cross-attention K/V come from
`WhisperSessions.encode()` once per 30 s window and are passed by reference on every call (batch 1;
the graph broadcasts them over beams); they are never copied here.

A cache belongs to one request (one decode of one window); nothing is global.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from app.runtime.contract import STATIC_PREFILL
from app.runtime.steps import DecoderInputs, DecoderOutputs, Steps

if TYPE_CHECKING:
    from app.engine.backend import WhisperBackend

CacheMode = Literal["concat", "static", "none"]
CACHE_MODES: tuple[str, ...] = ("concat", "static", "none")
GROWTH_CHUNK = 64  # positions a full concat cache's buffers grow by


class ContextFullError(RuntimeError):
    """A sequence would grow past the model's text context (n_text_ctx positions)."""


class KVCache(ABC):
    """Self-attention K/V state of one decode, plus the window's cross-attention K/V.

    `length` is the number of positions the decoder has already processed (the same for every row).
    `decoder_s` / `calls` accumulate the wall time and count of decoder calls made through it;
    `handed_nbytes` the bytes of the inputs given to the runtime by those calls (cross and past
    K/V included: on a CPU the runtime reads them in place, a device would copy them).
    """

    mode: str

    def __init__(self, sessions: WhisperBackend, cross: list[np.ndarray], batch: int) -> None:
        dims = sessions.manifest.dims
        self.sessions = sessions
        self.cross = cross  # [1 or B, H, n_audio_ctx, Dh] per layer; shared, never copied
        self.cross_nbytes = int(sum(a.nbytes for a in cross))  # handed over on every call
        self.batch = batch
        self.n_layers = dims.n_text_layer
        self.n_heads = dims.n_heads
        self.head_dim = dims.head_dim
        self.n_vocab = dims.n_vocab
        self.capacity = dims.n_text_ctx  # positions 0 .. capacity-1 exist
        self.length = 0
        self.decoder_s = 0.0
        self.calls = 0
        self.handed_nbytes = 0

    # -- the interface used by the decode loop ---------------------------------------------------

    def forward(self, tokens: np.ndarray, positions: Sequence[int] = (-1,)) -> np.ndarray:
        """Feed the positions of `tokens` not yet processed; return logits at `positions`.

        tokens: i64 [B, L], the whole sequences (L > length, L <= capacity).
        positions: absolute indices into L (negative counts from the end); each must be a new
            position (>= length) except for `NoCache`, which recomputes everything.
        Returns f32 [B, len(positions), V]. Its decoder calls are served by the backend.
        """
        return self.sessions.run_steps(self.forward_steps(tokens, positions))

    @abstractmethod
    def forward_steps(
        self, tokens: np.ndarray, positions: Sequence[int] = (-1,)
    ) -> Steps[np.ndarray]:
        """`forward` as a resumable task: yields its decoder calls (a decode loop's steps)."""

    @abstractmethod
    def reorder(self, beam_indices: Sequence[int] | np.ndarray) -> None:
        """Row i of the state becomes old row beam_indices[i] (beam search); len == batch."""

    @abstractmethod
    def fork(self, batch: int) -> KVCache:
        """A new cache holding this one's positions repeated for `batch` rows (this one must have
        batch 1). Self K/V are copied; cross K/V are shared. `self` is left untouched, so a
        prefilled prefix can be reused by every temperature-fallback attempt."""

    @property
    @abstractmethod
    def self_nbytes(self) -> int:
        """Bytes held for self-attention K/V (all rows)."""

    @property
    def nbytes(self) -> int:
        """Cross + self K/V bytes held for this decode."""
        return self.cross_nbytes + self.self_nbytes

    # -- helpers ---------------------------------------------------------------------------------

    def _check(self, tokens: np.ndarray, positions: Sequence[int]) -> tuple[int, list[int]]:
        if tokens.ndim != 2 or tokens.shape[0] != self.batch:
            raise ValueError(f"tokens must be [B={self.batch}, L], got {tokens.shape}")
        n = tokens.shape[1]
        if n > self.capacity:
            raise ContextFullError(
                f"sequence of {n} tokens exceeds the text context of {self.capacity}"
            )
        if n <= self.length and self.mode != "none":
            raise ValueError(f"no new tokens: length {n}, already processed {self.length}")
        absolute = [p if p >= 0 else n + p for p in positions]
        for p in absolute:
            if not 0 <= p < n:
                raise IndexError(f"position {p} outside the sequence of {n}")
        return n, absolute

    def _start_forward(
        self, tokens: np.ndarray, positions: Sequence[int]
    ) -> tuple[int, list[int], np.ndarray]:
        """For caches that feed only new positions: (L, absolute positions, f32 [B, len, V] to
        fill per call, `_picked`); every requested position must be new."""
        n, absolute = self._check(tokens, positions)
        for p in absolute:
            if p < self.length:
                raise IndexError(f"logits at position {p} were computed by an earlier call")
        return n, absolute, np.empty((self.batch, len(absolute), self.n_vocab), np.float32)

    @staticmethod
    def _picked(
        absolute: list[int], first: int, new_tokens: int, least: int = 1
    ) -> tuple[list[tuple[int, int]], np.ndarray]:
        """For a call feeding positions first..first+T-1: the requested positions it covers, as
        (index into `absolute`, index into its logits), and its `logits_at` (each covered
        offset once, ascending: a position asked for twice, the sot that is also the last
        token, is computed once and a step keeps one shape; the last position when it covers
        none: the graph computes logits at one position at least), the last offset repeated up
        to `least` entries (a call of a fixed shape)."""
        offsets = sorted({p - first for p in absolute if first <= p < first + new_tokens})
        row = {offset: j for j, offset in enumerate(offsets)}
        covered = [(i, row[p - first]) for i, p in enumerate(absolute) if p - first in row]
        offsets = offsets or [new_tokens - 1]
        offsets += offsets[-1:] * (least - len(offsets))
        return covered, np.asarray(offsets, dtype=np.int64)

    def _decode_steps(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        attention_mask: np.ndarray,
        past: list[np.ndarray],
        logits_at: np.ndarray | None = None,
    ) -> Steps[DecoderOutputs]:
        start = time.perf_counter()
        logits, new = yield DecoderInputs(
            input_ids, position_ids, attention_mask, past, self.cross, logits_at
        )
        self.decoder_s += time.perf_counter() - start
        self.calls += 1
        inputs = (input_ids, position_ids, attention_mask, *past)
        self.handed_nbytes += sum(a.nbytes for a in inputs) + self.cross_nbytes
        return logits, new

    def _zeros(self, positions: int) -> list[np.ndarray]:
        """Zeroed self K/V [B, H, positions, Dh] per layer (k, v, k, v, ...), in the runtime's
        K/V dtype."""
        shape = (self.batch, self.n_heads, positions, self.head_dim)
        return [np.zeros(shape, self.sessions.kv_dtype) for _ in range(2 * self.n_layers)]


class _SlotCache(KVCache):
    """Past self K/V in host buffers [B, H, C, Dh] per layer (C = `held` positions, filled or
    not); the mechanism shared by `ConcatCache` and `StaticCache`, which choose C.

    A call passes the whole buffers as past, with `attention_mask` [B, C + T] marking the
    `length` filled slots and the T new tokens; the call's new K/V are then written into slots
    length..length+T-1. A beam reorder is applied lazily, to the rows that moved, before the next
    call.
    """

    tokens_per_call: int  # most new tokens fed per decoder call

    def __init__(self, sessions: WhisperBackend, cross: list[np.ndarray], batch: int = 1) -> None:
        super().__init__(sessions, cross, batch)
        self.buffers = self._zeros(self._positions_for(0))  # [past_k_0, past_v_0, ...]
        self._order: np.ndarray | None = None  # pending beam reorder of the filled slots
        self._step_inputs: tuple[np.ndarray, ...] = ()  # `_step`'s arrays, for these buffers

    @abstractmethod
    def _positions_for(self, needed: int) -> int:
        """C to hold when `needed` positions must fit (needed <= capacity)."""

    @property
    def held(self) -> int:
        """Positions the buffers hold (filled or not)."""
        return self.buffers[0].shape[2]

    def _make_room(self, new_tokens: int) -> None:
        """Apply a pending beam reorder; grow the buffers so `new_tokens` more positions fit."""
        filled, order = self.length, self._order
        self._order = None
        if filled + new_tokens > self.held:
            grown = self._zeros(self._positions_for(filled + new_tokens))
            rows = slice(None) if order is None else order
            for dst, src in zip(grown, self.buffers, strict=True):
                dst[:, :, :filled] = src[rows, :, :filled]
            self.buffers = grown
        elif order is not None:
            moved = np.flatnonzero(order != np.arange(self.batch))
            for buf in self.buffers:
                buf[moved, :, :filled] = buf[order[moved], :, :filled]

    def forward_steps(
        self, tokens: np.ndarray, positions: Sequence[int] = (-1,)
    ) -> Steps[np.ndarray]:
        if (
            tokens.ndim == 2
            and tokens.shape[0] == self.batch
            and tokens.shape[1] == self.length + 1 <= self.capacity
            and tuple(positions) == (-1,)
        ):
            return (yield from self._step(tokens[:, -1]))
        n, absolute, out = self._start_forward(tokens, positions)
        # in calls of at most tokens_per_call new positions (a concat cache: one call)
        for chunk_start in range(self.length, n, self.tokens_per_call):
            chunk_end = min(n, chunk_start + self.tokens_per_call)
            t = chunk_end - chunk_start
            width, least = self._call_width(t)
            self._make_room(t)
            new_ids = np.empty((self.batch, width), np.int64)
            new_ids[:, :t] = tokens[:, chunk_start:chunk_end]
            new_ids[:, t:] = new_ids[:, t - 1 : t]  # padding: the last token again
            at = np.minimum(np.arange(chunk_start, chunk_start + width), self.capacity - 1)
            position_ids = np.broadcast_to(at.astype(np.int64), (self.batch, width))
            mask = np.zeros((self.batch, self.held + width), np.int64)  # [B, C + T]
            mask[:, :chunk_start] = 1
            mask[:, self.held : self.held + t] = 1
            covered, logits_at = self._picked(absolute, chunk_start, t, least)
            logits, new = yield from self._decode_steps(
                new_ids, np.ascontiguousarray(position_ids), mask, self.buffers, logits_at
            )
            for buf, k in zip(self.buffers, new, strict=True):
                buf[:, :, chunk_start:chunk_end] = k[:, :, :t]
            self.length = chunk_end
            if covered == list(enumerate(range(len(absolute)))):  # all of them, in order
                out = logits[:, : len(absolute)]
                continue
            for i, j in covered:
                out[:, i] = logits[:, j]
        return out

    def _step(self, new_ids: np.ndarray) -> Steps[np.ndarray]:
        """One new token per row, logits at it (a decode loop's steady state): the call the
        general path makes, its input arrays kept from step to step and written in place, so
        the runtime's binding of them holds (no new tensors per step). new_ids i64 [B]."""
        self._make_room(1)
        at, held = self.length, self.held
        if not self._step_inputs or self._step_inputs[2].shape[1] != held + 1:
            rows = self.batch
            self._step_inputs = (
                np.zeros((rows, 1), np.int64),  # input_ids
                np.zeros((rows, 1), np.int64),  # position_ids
                np.zeros((rows, held + 1), np.int64),  # attention_mask: filled slots + new
                np.zeros(1, np.int64),  # logits_at: the new position
            )
        input_ids, position_ids, mask, logits_at = self._step_inputs
        input_ids[:, 0] = new_ids
        position_ids.fill(min(at, self.capacity - 1))
        mask[:, :at] = 1
        mask[:, at:held] = 0
        mask[:, held] = 1
        logits, new = yield from self._decode_steps(
            input_ids, position_ids, mask, self.buffers, logits_at
        )
        for buf, k in zip(self.buffers, new, strict=True):
            buf[:, :, at] = k[:, :, 0]
        self.length = at + 1
        return logits

    def _call_width(self, tokens: int) -> tuple[int, int]:
        """(T, K) of a call feeding `tokens` new tokens: the new positions it feeds (the real
        ones first, then padding) and the fewest logits positions it computes."""
        return tokens, 1

    def reorder(self, beam_indices: Sequence[int] | np.ndarray) -> None:
        idx = np.asarray(beam_indices, dtype=np.intp)
        if idx.shape != (self.batch,):
            raise ValueError(f"need {self.batch} beam indices, got {idx.shape}")
        if np.array_equal(idx, np.arange(self.batch)):
            return
        # row i becomes old row idx[i]; composed with a reorder not yet applied
        self._order = idx if self._order is None else self._order[idx]

    def fork(self, batch: int) -> _SlotCache:
        if self.batch != 1:
            raise ValueError("only a batch-1 cache can be forked")
        other = type(self)(self.sessions, self.cross, batch)
        other.buffers = [np.repeat(b, batch, axis=0) for b in self.buffers]
        other.length = self.length
        return other

    @property
    def self_nbytes(self) -> int:
        return int(sum(b.nbytes for b in self.buffers))


class ConcatCache(_SlotCache):
    """Buffers that grow by `GROWTH_CHUNK` positions when full (C = `length` rounded up). A prefix
    goes in one call, whatever its length (the graph computes logits only at the positions asked
    for, so a 200-token prompt is one call of ~29 ms at tiny.en instead of seven 32-token calls
    of ~9 ms each). A step copies only its new positions (not the whole past), and the decoder
    sees a new input shape once every `GROWTH_CHUNK` steps: OpenVINO re-plans a graph for every
    new shape."""

    mode = "concat"

    @property
    def tokens_per_call(self) -> int:  # type: ignore[override]
        return self.capacity

    def _positions_for(self, needed: int) -> int:
        return min(-(-needed // GROWTH_CHUNK) * GROWTH_CHUNK, self.capacity)


class StaticCache(_SlotCache):
    """Fixed buffers of N = n_text_ctx positions from the start, one token per call: every call
    has past [B, H, N, Dh] and `attention_mask` [B, N + 1], so a static-shape device compiles the
    decoder once (for a given batch size)."""

    mode = "static"
    tokens_per_call = STATIC_PREFILL

    def _positions_for(self, needed: int) -> int:
        return self.capacity

    def _call_width(self, tokens: int) -> tuple[int, int]:
        """A step: one token, logits at it; a prompt: chunks of `STATIC_PREFILL` tokens (the
        last padded), logits at two positions (the sot's and the last one's; padded)."""
        return (1, 1) if tokens == 1 else (STATIC_PREFILL, 2)


class NoCache(KVCache):
    """Reference strategy: no self K/V kept; every call re-runs the whole sequence (P = 0)."""

    mode = "none"

    def forward_steps(
        self, tokens: np.ndarray, positions: Sequence[int] = (-1,)
    ) -> Steps[np.ndarray]:
        n, absolute = self._check(tokens, positions)
        input_ids = np.ascontiguousarray(tokens, dtype=np.int64)  # [B, L]
        position_ids = np.ascontiguousarray(
            np.broadcast_to(np.arange(n, dtype=np.int64), (self.batch, n))
        )
        mask = np.ones((self.batch, n), np.int64)
        logits, _ = yield from self._decode_steps(input_ids, position_ids, mask, self._zeros(0))
        self.length = n
        return logits[:, absolute]

    def reorder(self, beam_indices: Sequence[int] | np.ndarray) -> None:
        idx = np.asarray(beam_indices)
        if idx.shape != (self.batch,):
            raise ValueError(f"need {self.batch} beam indices, got {idx.shape}")

    def fork(self, batch: int) -> NoCache:
        if self.batch != 1:
            raise ValueError("only a batch-1 cache can be forked")
        other = NoCache(self.sessions, self.cross, batch)
        other.length = self.length
        return other

    @property
    def self_nbytes(self) -> int:
        return 0


def make_cache(
    mode: str, sessions: WhisperBackend, cross: list[np.ndarray], batch: int = 1
) -> KVCache:
    """A fresh cache of the given mode ("concat" | "static" | "none") for one decode; always the
    static one on a static-shape device (`sessions.static`: the shapes it compiled at load)."""
    classes: dict[str, type[KVCache]] = {
        "concat": ConcatCache,
        "static": StaticCache,
        "none": NoCache,
    }
    try:
        cls = classes[mode]
    except KeyError:
        raise ValueError(f"unknown kv_cache mode {mode!r}; expected one of {CACHE_MODES}") from None
    return (StaticCache if sessions.static else cls)(sessions, cross, batch)
