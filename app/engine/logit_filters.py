"""Logit filters applied before each token is chosen (ported from openai/whisper's decoding.py).

Each filter edits `logits` f32 [B, V] in place, given the token sequences so far `tokens` i64
[B, L] (initial tokens included; sampling starts at index `sample_begin`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from app.runtime.contract import TIME_PRECISION

if TYPE_CHECKING:
    from app.engine.decoding_types import DecodingOptions
    from app.engine.tokenizer import Tokenizer

NEG_INF = -np.inf


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of f32 [B, V] that tolerates -inf entries (at least one finite)."""
    top = np.max(logits, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    shifted = logits - top
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def log_softmax_at(logits: np.ndarray, index: np.ndarray) -> np.ndarray:
    """`log_softmax(logits)` at `index` (i64 [B, K]) -> f32 [B, K], the same values bit for bit,
    without the whole [B, V] result (one full-width pass fewer; beam search needs K per row)."""
    top = np.max(logits, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    shifted = logits - top
    picked = np.take_along_axis(shifted, index, axis=-1)
    np.exp(shifted, out=shifted)
    with np.errstate(divide="ignore"):
        return picked - np.log(np.sum(shifted, axis=-1, keepdims=True))


def logsumexp_rows(logits: np.ndarray) -> np.ndarray:
    """log(sum(exp(row))) of every row of [B, V] (f64 [B]); rows need one finite entry."""
    top = np.max(logits, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    total = np.sum(np.exp(logits - top), axis=-1, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return top[:, 0].astype(np.float64) + np.log(total)


class LogitFilter(ABC):
    @abstractmethod
    def apply(self, logits: np.ndarray, tokens: np.ndarray) -> None:
        """Edit logits f32 [B, V] in place given tokens i64 [B, L]."""


class SuppressBlank(LogitFilter):
    """At the first sampled position, forbid a blank (" ") and end-of-text."""

    def __init__(self, blank_tokens: Iterable[int], eot: int, sample_begin: int) -> None:
        self.suppress = sorted({*blank_tokens, eot})
        self.sample_begin = sample_begin

    def apply(self, logits: np.ndarray, tokens: np.ndarray) -> None:
        if tokens.shape[1] == self.sample_begin:
            logits[:, self.suppress] = NEG_INF


class SuppressAtStart(LogitFilter):
    """At the first sampled position, forbid `tokens` (after a forced prefix that ends inside
    the text: the word continuations, so that the prefix's last word stays whole)."""

    def __init__(self, tokens: Iterable[int], sample_begin: int) -> None:
        self.suppress = np.asarray(sorted(set(tokens)), dtype=np.intp)
        self.sample_begin = sample_begin

    def apply(self, logits: np.ndarray, tokens: np.ndarray) -> None:
        if tokens.shape[1] == self.sample_begin:
            logits[:, self.suppress] = NEG_INF


class SuppressTokens(LogitFilter):
    """Always forbid a fixed set of token ids."""

    def __init__(self, suppress_tokens: Sequence[int]) -> None:
        self.suppress = np.asarray(sorted(set(suppress_tokens)), dtype=np.intp)

    def apply(self, logits: np.ndarray, tokens: np.ndarray) -> None:
        if self.suppress.size:
            logits[:, self.suppress] = NEG_INF


class ApplyTimestampRules(LogitFilter):
    """Whisper's timestamp grammar.

    - `<|notimestamps|>` is never sampled (it is part of the initial tokens when wanted);
    - timestamps come in pairs (end of one segment, start of the next), except right before EOT:
      after a lone timestamp only a timestamp or EOT may follow; after a pair, only text;
    - timestamps never decrease, and a segment has non-zero length;
    - the first sampled token is a timestamp no later than `max_initial_timestamp_index`
      (in 0.02 s steps);
    - when the summed probability of all timestamps beats every single text token, a timestamp
      is forced.
    """

    def __init__(
        self,
        *,
        eot: int,
        no_timestamps: int,
        timestamp_begin: int,
        sample_begin: int,
        max_initial_timestamp_index: int | None,
    ) -> None:
        self.eot = eot
        self.no_timestamps = no_timestamps
        self.timestamp_begin = timestamp_begin
        self.sample_begin = sample_begin
        self.max_initial_timestamp_index = max_initial_timestamp_index

    def apply(self, logits: np.ndarray, tokens: np.ndarray) -> None:
        ts_begin = self.timestamp_begin
        logits[:, self.no_timestamps] = NEG_INF

        sampled = tokens[:, self.sample_begin :]  # [B, S]
        rows, length = sampled.shape
        is_ts = sampled >= ts_begin
        last_was_timestamp = is_ts[:, -1] if length >= 1 else np.zeros(rows, bool)
        penultimate_was_timestamp = is_ts[:, -2] if length >= 2 else np.ones(rows, bool)
        lone = last_was_timestamp & ~penultimate_was_timestamp
        # a pair was just closed: text must follow; a lone timestamp: a timestamp or EOT
        logits[last_was_timestamp & penultimate_was_timestamp, ts_begin:] = NEG_INF
        logits[lone, : self.eot] = NEG_INF
        if length:
            # never go back in time; after text, the closing timestamp may equal the last one,
            # otherwise it must be later (non-zero segment length, no infinite loop)
            has_ts = is_ts.any(axis=1)
            last_index = length - 1 - np.argmax(is_ts[:, ::-1], axis=1)
            latest = sampled[np.arange(rows), last_index] - ts_begin  # [B], valid where has_ts
            first_allowed = np.where(has_ts, latest + np.where(lone, 0, 1), 0)
            earlier = np.arange(logits.shape[1] - ts_begin) < first_allowed[:, None]
            logits[:, ts_begin:][earlier] = NEG_INF

        if tokens.shape[1] == self.sample_begin:
            # the first sampled token is a timestamp, no later than max_initial_timestamp
            logits[:, :ts_begin] = NEG_INF
            if self.max_initial_timestamp_index is not None:
                last_allowed = ts_begin + self.max_initial_timestamp_index
                logits[:, last_allowed + 1 :] = NEG_INF

        # if the timestamps together are likelier than any text token, sample a timestamp
        # (compared on logits: log-softmax subtracts the same normaliser from both sides)
        timestamp_logprob = logsumexp_rows(logits[:, ts_begin:])
        max_text_token_logprob = np.max(logits[:, :ts_begin], axis=-1)
        logits[timestamp_logprob > max_text_token_logprob, :ts_begin] = NEG_INF


class RepetitionGuard(LogitFilter):
    """Ends a sequence (forces EOT) once its text tokens fall into a repetition loop.

    A loop is the last `period` text tokens (timestamps ignored) repeated back to back at least
    `min_repeats` times over at least `min_span` tokens, for some period <= `max_period`.
    """

    def __init__(
        self,
        *,
        eot: int,
        timestamp_begin: int,
        sample_begin: int,
        max_period: int = 24,
        min_repeats: int = 3,
        min_span: int = 32,
    ) -> None:
        if min(max_period, min_repeats) < 1:
            raise ValueError("a loop needs max_period >= 1 and min_repeats >= 1")
        self.eot = eot
        self.timestamp_begin = timestamp_begin
        self.sample_begin = sample_begin
        self.max_period = max_period
        self.min_repeats = min_repeats
        self.min_span = min_span
        # the longest tail a loop check looks at, in text tokens
        self.max_span = max(
            p * max(min_repeats, -(-min_span // p)) for p in range(1, max_period + 1)
        )

    def apply(self, logits: np.ndarray, tokens: np.ndarray) -> None:
        if tokens.shape[1] - self.sample_begin < self.min_span:
            return  # a loop spans at least min_span text tokens
        for k in range(tokens.shape[0]):
            row = tokens[k, self.sample_begin :]
            if row.size and row[-1] == self.eot:
                continue
            if self.is_looping(row):
                logits[k, :] = NEG_INF
                logits[k, self.eot] = 0.0

    def is_looping(self, sampled: np.ndarray | Sequence[int]) -> bool:
        """True when the text tokens of `sampled` end in a repetition loop."""
        tail = np.asarray(sampled)[-3 * self.max_span :]  # timestamps come in between
        text = tail[tail < self.timestamp_begin]
        return find_loop(text, self.max_period, self.min_repeats, self.min_span) is not None


def find_loop(
    text: np.ndarray | Sequence[int], max_period: int, min_repeats: int, min_span: int
) -> tuple[int, int] | None:
    """(period, repeats) of a loop at the end of `text` (1-D ints), or None (the shortest
    period that loops; min_repeats >= 1)."""
    seq = np.asarray(text)
    n = len(seq)
    if n == 0:
        return None
    # a loop of period p ends with seq[-1] == seq[-1 - p]: only those periods are checked
    back = seq[-2::-1][:max_period]  # seq[-1 - p] for p = 1, 2, ...
    periods = (np.flatnonzero(back == seq[-1]) + 1).tolist()
    if min_repeats <= 1 and max(1, min_span) <= max_period:
        periods = sorted({*periods, max(1, min_span)})  # one repeat: nothing to compare
    for period in periods:
        need = max(min_repeats, -(-min_span // period))  # ceil(min_span / period)
        span = need * period
        # the last `span` tokens repeat with this period
        if span <= n and np.array_equal(seq[n - span + period :], seq[n - span : n - period]):
            return period, need
    return None


def window_filters(
    tok: Tokenizer,
    opts: DecodingOptions,
    *,
    n_vocab: int,
    sample_begin: int,
    grammar_begin: int,
    prefix: tuple[int, ...],
    guard: RepetitionGuard | None,
) -> list[LogitFilter]:
    """The filters one window's decode applies, in order: blank and suppressed tokens, whole
    words after a timed prefix that ends in text (`grammar_begin < sample_begin`: a live stream's
    committed words), the timestamp grammar, the repetition guard."""
    filters: list[LogitFilter] = []
    if opts.suppress_blank:
        filters.append(SuppressBlank(tok.encode(" "), tok.eot, sample_begin))
    if opts.suppress_tokens:
        filters.append(SuppressTokens(_suppressed(tok, opts, n_vocab)))
    if grammar_begin < sample_begin and prefix[-1] < tok.eot:
        filters.append(SuppressAtStart(tok.word_continuations, sample_begin))
    if not opts.without_timestamps:
        max_index = None
        if opts.max_initial_timestamp is not None:
            max_index = round(opts.max_initial_timestamp / TIME_PRECISION)
        filters.append(
            ApplyTimestampRules(
                eot=tok.eot,
                no_timestamps=tok.no_timestamps,
                timestamp_begin=tok.timestamp_begin,
                sample_begin=grammar_begin,
                max_initial_timestamp_index=max_index,
            )
        )
    if guard is not None:
        filters.append(guard)
    return filters


def _suppressed(tok: Tokenizer, opts: DecodingOptions, n_vocab: int) -> list[int]:
    """The option's suppressed tokens (-1: the non-speech ones), and never task / start /
    previous-text / no-speech tokens."""
    suppress = list(opts.suppress_tokens or ())  # type: ignore[arg-type]
    if -1 in suppress:
        suppress = [t for t in suppress if t >= 0]
        suppress.extend(tok.non_speech_tokens)
    suppress = [t for t in suppress if 0 <= t < n_vocab]
    suppress.extend([tok.transcribe, tok.translate, tok.sot, tok.sot_prev, tok.sot_lm])
    suppress.append(tok.no_speech)
    return sorted(set(suppress))
