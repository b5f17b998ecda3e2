"""Word timing's inputs from one decoder call over a whole token row.

The decoder graph gives, beside its logits, the alignment heads' cross-attention queries
(`alignment_queries` [B, A, T, Dh]); with the window's cross keys they make those heads' attention
weights. So word timing runs the decoder itself (a prefill over the row) instead of a second graph
holding a second copy of the decoder's weights.
"""

from __future__ import annotations

import numpy as np


def alignment_weights(
    queries: np.ndarray, cross: list[np.ndarray], heads: tuple[tuple[int, int], ...]
) -> np.ndarray:
    """softmax(q k^T / sqrt(Dh)) of each alignment head: queries f32 [B, A, T, Dh], cross K/V
    ([cross_k_0, cross_v_0, ...], each [B, H, 1500, Dh], f32 or bf16), heads (layer, head)
    pairs in the queries' order -> f32 [B, A, T, 1500]."""
    head_dim = queries.shape[-1]
    keys = np.stack([cross[2 * layer][:, head] for layer, head in heads], axis=1)  # [B,A,S,Dh]
    keys = keys.astype(np.float32, copy=False)  # bf16 cross K/V (`graphs.BF16`) read as f32
    scores = (queries * np.float32(head_dim**-0.5)) @ keys.swapaxes(-1, -2)
    return _softmax(scores)


def token_logprobs(logits: np.ndarray, target_ids: np.ndarray, eot: int) -> np.ndarray:
    """log p(target_ids[:, t]) over the text tokens (ids < eot), as openai/whisper's word
    probabilities take it: logits f32 [B, T, V], target_ids i64 [B, T] (< eot) -> f32 [B, T]."""
    text = logits[..., :eot]
    top = text.max(axis=-1, keepdims=True)
    shifted = np.subtract(text, top)  # one [B, T, eot] buffer, exponentiated in place
    log_norm = np.log(np.exp(shifted, out=shifted).sum(axis=-1, keepdims=True)) + top
    picked = np.take_along_axis(text, target_ids[..., None], axis=-1)
    return (picked - log_norm)[..., 0]


def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)
