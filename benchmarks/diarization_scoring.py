"""Scores of the diarization benchmark: DER (pyannote's way) and WDER.

DER: no collar, overlapped speech scored, (missed + false alarm + confusion) / reference speech, at
10 ms, with the best one-to-one mapping of found speakers to reference speakers (pyannote.metrics'
`DiarizationErrorRate(collar=0, skip_overlap=False)`; the benchmark checks the two agree).

WDER (speaker-attributed word error rate, Shafey et al. 2019): the transcript's words (Whisper,
word timing) are aligned to the reference words (each said by one reference speaker); of the
aligned pairs (correct or substituted words), the share whose word was given a speaker other than
its reference speaker, after the one-to-one mapping of found speakers to reference speakers that
gets the most aligned words right. A word takes the speaker whose turns cover most of it (the
service's rule, `word_speaker`).
"""

from __future__ import annotations

from collections.abc import Sequence

import jiwer
import numpy as np
from scipy.optimize import linear_sum_assignment

from app.engine.words import Word
from app.service.diarize.activity import Turn
from app.service.diarize.attribution import word_speaker
from benchmarks.common import normalize
from benchmarks.diarization_corpus import HOP


def hypothesis(turns: Sequence[Turn], frames: int) -> np.ndarray:
    n = max((t.speaker for t in turns), default=-1) + 1
    found = np.zeros((frames, max(n, 1)), bool)
    for t in turns:
        found[round(t.start / HOP) : round(t.end / HOP), t.speaker] = True
    return found


def segments(activity: np.ndarray) -> list[list]:
    """[frames, speakers] bool -> [[start, end, speaker], ...] seconds (for pyannote.metrics)."""
    found = []
    for s in range(activity.shape[1]):
        edges = np.diff(np.concatenate([[0], activity[:, s].astype(np.int8), [0]]))
        found += [
            [a * HOP, b * HOP, s]
            for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True)
        ]
    return found


def der(reference: np.ndarray, found: np.ndarray) -> dict[str, float]:
    """Seconds of reference speech, missed, false alarm and confusion."""
    overlap = reference.astype(np.int64).T @ found.astype(np.int64)  # [ref, hyp] shared frames
    rows, cols = linear_sum_assignment(overlap, maximize=True)
    n_ref, n_hyp = reference.sum(axis=1), found.sum(axis=1)
    correct = np.zeros(len(reference), np.int64)
    for r, h in zip(rows, cols, strict=True):
        correct += reference[:, r] & found[:, h]
    return {
        "total": float(n_ref.sum() * HOP),
        "missed": float(np.maximum(n_ref - n_hyp, 0).sum() * HOP),
        "false alarm": float(np.maximum(n_hyp - n_ref, 0).sum() * HOP),
        "confusion": float((np.minimum(n_ref, n_hyp) - correct).sum() * HOP),
    }


def error_rate(parts: dict[str, float]) -> float:
    return (parts["missed"] + parts["false alarm"] + parts["confusion"]) / max(parts["total"], 1e-9)


def _tokens(text: str) -> list[str]:
    return normalize(text).split()


def wder(
    reference: Sequence[tuple[str, int]], words: Sequence[Word], turns: Sequence[Turn]
) -> tuple[int, int]:
    """(aligned words given the wrong speaker, aligned words): WDER = first / second."""
    ref_words, ref_speakers = [], []
    for text, speaker in reference:
        tokens = _tokens(text)
        ref_words += tokens
        ref_speakers += [speaker] * len(tokens)
    hyp_words, hyp_speakers = [], []
    for w in words:
        tokens = _tokens(w.word)
        hyp_words += tokens
        hyp_speakers += [word_speaker(w.start, w.end, turns)] * len(tokens)
    if not ref_words or not hyp_words:
        return 0, 0
    out = jiwer.process_words(" ".join(ref_words), " ".join(hyp_words))
    pairs = []
    for chunk in out.alignments[0]:
        if chunk.type in ("equal", "substitute"):
            for k in range(chunk.ref_end_idx - chunk.ref_start_idx):
                pairs.append(
                    (ref_speakers[chunk.ref_start_idx + k], hyp_speakers[chunk.hyp_start_idx + k])
                )
    n_ref = max(ref_speakers) + 1
    n_hyp = max(max(h for _, h in pairs) + 1, 1) if pairs else 1
    agree = np.zeros((n_ref, n_hyp), np.int64)
    for r, h in pairs:
        if h >= 0:
            agree[r, h] += 1
    rows, cols = linear_sum_assignment(agree, maximize=True)
    right = int(agree[rows, cols].sum())
    return len(pairs) - right, len(pairs)
