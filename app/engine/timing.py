"""Word timing from the alignment heads' cross-attention (the method of openai/whisper's
`timing.py`, written here from its description).

Some cross-attention heads of Whisper's decoder follow the audio: while a token is read, they
look at the frames where it was spoken (the manifest lists them per model). For one window:

1. The decoder, run over [sot sequence, <|notimestamps|>, text tokens, <|endoftext|>] with
   the window's cross K/V (its `alignment_queries` output, `app.runtime.alignment`), gives those
   heads' softmax weights [A, T, 1500] and each text token's log-probability.
2. Crop the weights to the frames that hold audio (a short last window has fewer) and
   renormalise; standardise each head over the tokens (per frame: mean 0, deviation 1); median
   filter along time (width 7); average the heads -> a tokens x frames matrix.
3. Dynamic time warping on its negation: the monotonic path from (first token, first frame) to
   (last token, last frame) that collects the most attention. A token starts at the frame where
   the path enters its row (20 ms per frame).
4. Split the text tokens into words (the tokenizer's rule, `app.engine.words`); a word starts
   where its first token starts and ends where the next word starts; its probability is the
   mean of its tokens'.
5. Clean up as openai/whisper does: a word longer than twice the median word (median capped at
   0.7 s) at a sentence end is clamped; punctuation joins its neighbour word; per segment, an
   over-long first word after a pause is shortened, and a first or last word reaching more than
   0.5 s past its segment's timestamp is pulled back to it. Segment bounds then follow the words.
6. Ours, not openai/whisper's: a segment's first word, when its span begins with 0.1 s or
   more of silence (frames 25 dB below the window's loud ones, from its log-mel), starts where
   the sound does. The DTW gives the first word of a window frame 0, and the first word after
   a pause the pause. Words inside a segment keep openai/whisper's times.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from app.engine.words import Word, join_punctuation
from app.runtime.contract import TIME_PRECISION
from app.runtime.steps import AlignerInputs, Steps

if TYPE_CHECKING:
    from app.engine.tokenizer import Tokenizer

MEDIAN_FILTER_WIDTH = 7
SILENCE_DB = 25.0  # a frame this far below the window's loud frames holds no speech
MIN_SILENT_LEAD_S = 0.1  # a word is moved only past a silent lead at least this long
SENTENCE_END = ".。!！?？"
MAX_MEDIAN_WORD_S = 0.7


def median_filter(x: np.ndarray, width: int = MEDIAN_FILTER_WIDTH) -> np.ndarray:
    """Median over a sliding window of odd `width` along the last axis; edges mirrored
    (d c b | a b c d), so the output has x's shape."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    if width == 7:
        return _median_of_7([padded[..., k : k + x.shape[-1]] for k in range(7)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.partition(windows, pad, axis=-1)[..., pad]


# Devillard's median-of-7 selection network: 13 compare-exchanges, the median ends in p[3]
_MEDIAN_7 = ((0, 5), (0, 3), (1, 6), (2, 4), (0, 1), (3, 5), (2, 6), (2, 3), (3, 6), (4, 5),
             (1, 4), (1, 3), (3, 4))  # fmt: skip


def _median_of_7(p: list[np.ndarray]) -> np.ndarray:
    """Elementwise median of seven equal-shaped arrays, by whole-array min/max (4x faster than
    np.partition over sliding windows for the attention matrices here)."""
    p = [np.array(a) for a in p]  # contiguous copies, exchanged in place
    low = np.empty_like(p[0])
    for i, j in _MEDIAN_7:
        np.minimum(p[i], p[j], out=low)
        np.maximum(p[i], p[j], out=p[j])
        p[i], low = low, p[i]
    return p[3]


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through cost [N, M] from (0, 0) to (N-1, M-1), moving right,
    down or diagonally; returns its row and column indices.

    Rows are filled one at a time, each in closed form: with a_j the cheaper of the cells above
    and above-left, c_j = x_j + min(a_j, c_{j-1}) unrolls to c_j = S_j + min_{k<=j}(a_k - S_{k-1})
    (S the row's prefix sums), a running minimum numpy computes without a Python loop.
    """
    n, m = cost.shape
    total = np.full((n + 1, m + 1), np.inf)
    total[0, 0] = 0.0
    came_left = np.zeros((n + 1, m + 1), bool)
    came_diagonal = np.zeros((n + 1, m + 1), bool)
    for i in range(1, n + 1):
        above = total[i - 1]
        diagonal, up = above[:-1], above[1:]  # for columns 1..m
        best_above = np.minimum(diagonal, up)
        prefix = np.concatenate(([0.0], np.cumsum(cost[i - 1], dtype=np.float64)))
        with np.errstate(invalid="ignore"):
            row = prefix[1:] + np.minimum.accumulate(best_above - prefix[:-1])
        total[i, 1:] = row
        left = np.concatenate(([np.inf], row[:-1]))
        came_left[i, 1:] = left < best_above
        came_diagonal[i, 1:] = diagonal <= up
    rows: list[int] = []
    cols: list[int] = []
    i, j = n, m
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        if i == 0 or (j > 0 and came_left[i, j]):
            j -= 1
        elif j == 0 or not came_diagonal[i, j]:
            i -= 1
        else:
            i, j = i - 1, j - 1
    return np.array(rows[::-1]), np.array(cols[::-1])


def token_start_frames(matrix: np.ndarray) -> np.ndarray:
    """Start frame of each row of a tokens x frames attention matrix [N, M], by DTW."""
    rows, cols = dtw(-matrix.astype(np.float64))
    enters = np.diff(rows, prepend=-1).astype(bool)  # the path's first cell in each row
    return cols[enters]


def frame_levels(mel: np.ndarray) -> np.ndarray:
    """Level (dB, relative) of each 20 ms encoder frame of a window's log-mel [n_mels, frames]
    (10 ms frames, Whisper's scaling (log10 + 4) / 4)."""
    log10_power = 4.0 * mel.astype(np.float64) - 4.0
    per_10ms = 10.0 * np.log10(np.power(10.0, log10_power).sum(axis=0))
    return per_10ms[: per_10ms.shape[0] // 2 * 2].reshape(-1, 2).max(axis=1)


def start_at_speech(words: Sequence[Word], levels: np.ndarray, offset: float = 0.0) -> list[Word]:
    """`words`, each whose span begins with silence starting where the sound does (`levels`:
    the window's `frame_levels`; `offset`: the window's start in the words' time).

    The DTW's path enters a row when attention moves on, which for the first word of a window
    is frame 0 and for the first word after a pause often the end of the word before: the pause
    is given to the word. Frames SILENCE_DB below the window's loud ones (its 95th percentile)
    are silence; a silent lead of MIN_SILENT_LEAD_S or more is cut off.
    """
    if levels.size == 0:
        return list(words)
    floor = float(np.percentile(levels, 95)) - SILENCE_DB
    out = []
    for word in words:
        first = max(round((word.start - offset) / TIME_PRECISION), 0)
        last = round((word.end - offset) / TIME_PRECISION)
        sound = np.flatnonzero(levels[first:last] >= floor)
        if sound.size and sound[0] * TIME_PRECISION >= MIN_SILENT_LEAD_S:
            word = replace(word, start=round(offset + (first + int(sound[0])) * TIME_PRECISION, 3))
        out.append(word)
    return out


def attention_matrix(weights: np.ndarray, n_frames: int) -> np.ndarray:
    """alignment weights [A, T, 1500] -> the averaged, standardised, filtered [T, n_frames]."""
    cropped = weights[:, :, :n_frames].astype(np.float32)
    cropped = cropped / np.maximum(cropped.sum(axis=-1, keepdims=True), 1e-12)
    mean = cropped.mean(axis=-2, keepdims=True)
    std = cropped.std(axis=-2, keepdims=True)
    standard = (cropped - mean) / np.maximum(std, 1e-12)
    return median_filter(standard).mean(axis=0)


def align_words(
    cross: list[np.ndarray],
    tokenizer: Tokenizer,
    sot_sequence: Sequence[int],
    language: str | None,
    text_tokens: Sequence[int],
    n_frames: int,
) -> Steps[list[Word]]:
    """Words of one window's text tokens (seconds from the window's start), as a resumable task
    (`app.runtime.steps`: its one aligner call).

    cross: the window's cross K/V, each [1, H, 1500, Dh]; n_frames: encoder frames holding
    audio.
    """
    if not text_tokens:
        return []
    eot = tokenizer.eot
    prefix = [*sot_sequence, tokenizer.no_timestamps]
    ids = [*prefix, *text_tokens, eot]
    n = len(ids)
    input_ids = np.asarray([ids], np.int64)
    # the next token where it is a text token, else any valid index (its log-prob is not read)
    target_ids = np.zeros((1, n), np.int64)
    target_ids[0, : n - 1] = [t if t < eot else 0 for t in ids[1:]]
    weights, logprobs = yield AlignerInputs(input_ids, target_ids, cross)
    return words_of_window(
        tokenizer, language, text_tokens, weights[0, :, :n], logprobs[0, :n], n_frames, len(prefix)
    )


def words_of_window(
    tokenizer: Tokenizer,
    language: str | None,
    text_tokens: Sequence[int],
    weights: np.ndarray,
    logprobs: np.ndarray,
    n_frames: int,
    n_prefix: int,
) -> list[Word]:
    """Words of one window (seconds from its start) from the aligner's outputs.

    weights [A, T, 1500] and logprobs [T] over the aligner's input row: `n_prefix` tokens (sot
    sequence and <|notimestamps|>), then the text tokens, then <|endoftext|>; n_frames: encoder
    frames holding audio (mel frames / 2).
    """
    if not text_tokens:
        return []
    matrix = attention_matrix(weights, max(n_frames, 1))
    # rows from <|notimestamps|> (it predicts the first text token) to the last text token
    rows = matrix[n_prefix - 1 : n_prefix + len(text_tokens)]
    starts = token_start_frames(rows) * TIME_PRECISION  # [len(text_tokens) + 1]
    peaks = rows[: len(text_tokens)].argmax(axis=1) * TIME_PRECISION  # [len(text_tokens)]
    token_logprobs = logprobs[n_prefix - 1 : n_prefix - 1 + len(text_tokens)].astype(np.float64)
    probs = np.exp(token_logprobs)
    words, word_tokens = tokenizer.split_words(list(text_tokens), language)
    bounds = np.cumsum([0] + [len(t) for t in word_tokens])
    timed = [
        Word(
            start=float(starts[lo]),
            end=float(starts[hi]),
            word=word,
            probability=float(probs[lo:hi].mean()),
            tokens=tuple(tokens),
            logprobs=tuple(token_logprobs[lo:hi].tolist()),
            peak=float(peaks[lo:hi].max()),
        )
        for word, tokens, lo, hi in zip(words, word_tokens, bounds[:-1], bounds[1:], strict=True)
    ]
    return join_punctuation(_clamp_sentence_ends(timed))


def median_word_s(words: Sequence[Word]) -> float:
    durations = [w.end - w.start for w in words if w.end > w.start]
    return min(MAX_MEDIAN_WORD_S, float(np.median(durations))) if durations else 0.0


def _clamp_sentence_ends(words: list[Word]) -> list[Word]:
    """A word longer than twice the median at a sentence end ran into the following pause."""
    longest = 2 * median_word_s(words)
    if longest == 0:
        return words
    out = words[:1]
    for previous, word in itertools.pairwise(words):
        if word.end - word.start > longest:
            if word.word in SENTENCE_END:
                word = replace(word, end=word.start + longest)
            elif previous.word in SENTENCE_END:
                word = replace(word, start=word.end - longest)
        out.append(word)
    return out


def assign_words(
    groups: Sequence[Sequence[Word]],
    segments: Sequence[tuple[float, float]],
    time_offset: float,
    last_speech: float,
    levels: np.ndarray | None = None,
) -> tuple[list[tuple[float, float, list[Word]]], float]:
    """Hand a window's words (window-relative; `groups`: each segment's, see `group_words`) to
    its segments (start, end: absolute seconds), in order, adjusting segment bounds to them;
    returns each segment's (start, end, words) and the end of the last speech for the next
    window. No word starts before `last_speech`: a window that starts at its predecessor's last
    timestamp may align its first word a few frames before the previous word's end. With the
    window's `levels`, each segment's first word starts where its sound does."""
    median = median_word_s([w for group in groups for w in group])
    longest = 2 * median
    out = []
    for (start, end), group in zip(segments, groups, strict=True):
        placed = []
        for word in group:
            begin = max(round(time_offset + word.start, 2), last_speech)
            end_s = max(round(time_offset + word.end, 2), begin)
            placed.append(replace(word, start=begin, end=end_s))
        if placed:
            if levels is not None:
                placed[:1] = start_at_speech(placed[:1], levels, time_offset)
            start, end = _fit_segment(start, end, placed, median, longest, last_speech)
            last_speech = end
        out.append((start, end, placed))
    return out, last_speech


def _fit_segment(
    start: float, end: float, words: list[Word], median: float, longest: float, last_speech: float
) -> tuple[float, float]:
    """Fit a segment's first and last words (replaced in `words`) and its bounds to each other;
    returns the segment's bounds."""
    first = words[0]
    after_pause = first.end - last_speech > 4 * median
    too_long = first.end - first.start > longest or (
        len(words) > 1 and words[1].end - first.start > 2 * longest
    )
    if after_pause and too_long:
        if len(words) > 1 and words[1].end - words[1].start > longest:
            boundary = max(words[1].end / 2, words[1].end - longest)
            first = replace(first, end=boundary)
            words[1] = replace(words[1], start=boundary)
        first = replace(first, start=max(0.0, first.end - longest))
    if start < first.end and start - 0.5 > first.start:
        first = replace(first, start=max(0.0, min(first.end - median, start)))
    else:
        start = first.start
    words[0] = first
    last = words[-1]
    if end > last.start and end + 0.5 < last.end:
        words[-1] = replace(last, end=max(last.start + median, end))
    else:
        end = last.end
    # the segment holds its words (openai/whisper leaves a pulled-back word up to a median
    # word's length outside it)
    return min(start, words[0].start), max(end, words[-1].end)


def group_words(words: Sequence[Word], sizes: Sequence[int]) -> list[list[Word]]:
    """A window's words, in order, split among its segments, which hold `sizes` text tokens in
    turn (a segment takes words until it has its tokens)."""
    groups: list[list[Word]] = []
    index = 0
    for size in sizes:
        group: list[Word] = []
        taken = 0
        while index < len(words) and taken < size:
            group.append(words[index])
            taken += len(words[index].tokens)
            index += 1
        groups.append(group)
    return groups
