"""A whole clip through a recurrent VAD as parallel lanes.

Silero VAD is recurrent: chunk t needs the state after chunk t-1, so a clip is, naively, one
model call per 32 ms chunk (~0.17 ms each here: 0.3-0.5 s for a minute of audio). Calls are
cheaper per chunk in batches (0.08 ms at 16 rows), and the machine has more than one core, so
the clip is cut into lanes of `LANE_CHUNKS` chunks that run side by side as the rows of one
batch, in `GROUPS` threads. A lane starts `WARMUP_CHUNKS` before its first chunk so that its
recurrent state has settled on the audio by then (the warm-up's outputs are dropped); the first
lane starts from the zero state, as a sequential pass does. The result is a VAD pass of its own,
not bit-equal to the sequential one: Silero's state keeps a long memory, and probabilities still
differ by up to 0.2-0.3 on some chunks after 3-5 s of warm-up (speech spans equal on the clean
test clips, a boundary or two apart on noisy ones). About 2x faster on 2 cores (60 s: 0.19
against 0.49 s). A batch runs only the steps where one of its lanes has audio: the first lane
has no warm-up (nothing precedes it) and nothing runs past a lane's end, so a clip shorter
than a lane costs one call per chunk, as a sequential pass does (not WARMUP + LANE calls).

    chunks [n, 512]  ->  lanes [L, WARMUP + LANE, 512] (zero-padded)  ->  probs [n]
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import numpy as np

LANE_CHUNKS = 313  # 10 s of 32 ms chunks
WARMUP_CHUNKS = 94  # 3 s
GROUPS = 2  # threads, each running a batch of lanes

# step(x [B, context + chunk], state [2, B, H]) -> (probs [B], next state [2, B, H])
Step = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def lane_probs(
    step: Step, chunks: np.ndarray, *, context: int, state_width: int, groups: int = GROUPS
) -> np.ndarray:
    """Probabilities f32 [n] of chunks f32 [n, C] (already gained), lanes run in parallel."""
    n, size = chunks.shape
    if n == 0:
        return np.zeros(0, np.float32)
    span = WARMUP_CHUNKS + LANE_CHUNKS
    n_lanes = -(-n // LANE_CHUNKS)
    lanes = np.zeros((n_lanes, span, size), np.float32)  # [L, W + LANE, C]
    steps = np.zeros((n_lanes, 2), int)  # [L, (first, end)]: the time steps holding audio
    for k in range(n_lanes):
        first = k * LANE_CHUNKS - WARMUP_CHUNKS  # the lane's first chunk (warm-up included)
        lo, hi = max(first, 0), min(first + span, n)
        lanes[k, lo - first : hi - first] = chunks[lo:hi]
        steps[k] = lo - first, hi - first
    out = np.zeros((n_lanes, span), np.float32)
    bounds = np.linspace(0, n_lanes, min(groups, n_lanes) + 1).astype(int)
    workers = []
    for a, b in itertools.pairwise(bounds):
        times = range(steps[a:b, 0].min(), steps[a:b, 1].max())
        args = (step, lanes[a:b], out[a:b], a == 0, context, state_width, times)
        workers.append(threading.Thread(target=_run_group, args=args, daemon=True))
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return out[:, WARMUP_CHUNKS:].reshape(-1)[:n]


def _run_group(
    step: Step,
    lanes: np.ndarray,
    out: np.ndarray,
    has_first_lane: bool,
    context: int,
    state_width: int,
    times: range,
) -> None:
    """Run lanes f32 [B, T, C] chunk by chunk as one batch over the steps `times` (where they
    hold audio); probabilities into out [B, T]."""
    rows = lanes.shape[0]
    state = np.zeros((2, rows, state_width), np.float32)
    tail = np.zeros((rows, context), np.float32)
    for t in times:
        if has_first_lane and t == WARMUP_CHUNKS:
            # the clip's first lane has no audio before it: start it as a sequential pass does
            state[:, 0] = 0.0
            tail[0] = 0.0
        x = np.concatenate([tail, lanes[:, t]], axis=1)  # [B, context + C]
        out[:, t], state = step(x, state)
        tail = x[:, -context:]
