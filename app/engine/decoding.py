"""Decoding of one 30 s window: the step loop (options and result: `decoding_types`; the
language: `language_detection`).

Shaped after openai/whisper's `decoding.py`: a frozen `DecodingOptions` validated once, and a loop
built from small pieces — the K/V cache strategy (`kv_cache`), logit filters (`logit_filters`),
a token selector and a sequence ranker (`search`).

    initial tokens = [sot_prev, *prompt[-223:]] + sot sequence (+ notimestamps) + prefix
    prefill (batch 1)  -> no-speech prob at the sot position, logits at the last position
    fork to n rows     (1 greedy, best_of sampling, beam_size beams)
    loop: filters -> select -> on_token -> cache.forward(new tokens)   until EOT / sample_len / ctx

The loop is a resumable task (`app.runtime.steps.Steps`): it yields each decoder call and is sent
its outputs; the backend serves it (`run_steps`), alone or batched with other requests' decodes.

Cross K/V (one window, batch 1) are passed in and never copied. The prefilled prefix can be kept
in a `PrefixMemo` so the transcriber's temperature-fallback attempts on the same window reuse it;
sampling attempts can also run as the rows of one decode (`DecodingTask.together_steps`: each
group of rows samples from its own generator, so each gives what it gives alone).

Streaming (`on_token`): for greedy decoding every accepted token is reported as it is chosen. With
several rows (beam search, best_of sampling) a token is reported once it is *stable*: the common
prefix of every live beam and every finished candidate, i.e. a token the final result is certain
to start with; the rest of the chosen sequence is reported when the search ends. The reported
tokens are thus always exactly a prefix of `DecodingResult.tokens`, never retracted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from app.engine.decoding_types import (
    DecodeStats,
    DecodingCancelled,
    DecodingOptions,
    DecodingResult,
    LanguageDetection,
    compression_ratio,
)
from app.engine.kv_cache import KVCache, make_cache
from app.engine.language_detection import detect_language
from app.engine.logit_filters import (
    RepetitionGuard,
    log_softmax,
    window_filters,
)
from app.engine.search import (
    BeamSearchDecoder,
    GreedyDecoder,
    GroupedSampler,
    MaximumLikelihoodRanker,
    TokenDecoder,
    report_stable,
)
from app.runtime.steps import Steps

if TYPE_CHECKING:
    from app.engine.backend import WhisperBackend
    from app.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class _Prefill:
    cache: KVCache  # batch 1, holds the initial tokens; never mutated after creation
    last_logits: np.ndarray  # f32 [V]
    no_speech_prob: float
    seconds: float


class PrefixMemo:
    """Per-window memo of prefilled prefixes (by cache mode and initial tokens) and of the
    language detection, so fallback attempts on the same cross K/V recompute nothing."""

    def __init__(self) -> None:
        self._prefills: dict[tuple[str, tuple[int, ...]], _Prefill] = {}
        self.language: LanguageDetection | None = None

    def get(self, mode: str, tokens: tuple[int, ...]) -> _Prefill | None:
        return self._prefills.get((mode, tokens))

    def put(self, mode: str, tokens: tuple[int, ...], prefill: _Prefill) -> None:
        self._prefills[(mode, tokens)] = prefill

    def clear(self) -> None:
        self._prefills.clear()
        self.language = None


class DecodingTask:
    """One decode of one window with fixed options (build, then `run`)."""

    def __init__(
        self,
        sessions: WhisperBackend,
        cross: list[np.ndarray],
        tokenizer: Tokenizer,
        options: DecodingOptions,
        *,
        memo: PrefixMemo | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        dims = sessions.manifest.dims
        self.sessions = sessions
        self.cross = cross
        self.tokenizer = tokenizer
        self.options = options
        self.memo = memo
        self.n_ctx = dims.n_text_ctx
        self.n_vocab = dims.n_vocab
        self.sample_len = options.sample_len or self.n_ctx // 2
        if self.sample_len > self.n_ctx // 2:
            raise ValueError(f"sample_len must be <= {self.n_ctx // 2}")

        self.language_probs: dict[str, float] | None = None
        language = options.language
        if tokenizer.multilingual and language is None:
            detection = memo.language if memo is not None else None
            if detection is None:
                detection = detect_language(sessions, cross, tokenizer, options.kv_cache)
                if memo is not None:
                    memo.language = detection
            language = detection.language
            self.language_probs = detection.probabilities
        self.language = language or "en"

        self.sot_sequence = tokenizer.sot_sequence(
            language if tokenizer.multilingual else None,
            options.task,  # type: ignore[arg-type]
            without_timestamps=options.without_timestamps,
        )
        self.initial_tokens = self._initial_tokens()
        self.sample_begin = len(self.initial_tokens)
        # a prefix with timestamps (a live stream's committed segments) is part of the sampled
        # text for the timestamp grammar; a text prefix (openai/whisper's) is not
        forced = self._prefix_tokens
        timed = any(t >= tokenizer.timestamp_begin for t in forced)
        self.grammar_begin = self.sample_begin - len(forced) if timed else self.sample_begin
        self.sot_index = self.initial_tokens.index(tokenizer.sot)
        if self.sample_begin >= self.n_ctx:
            raise ValueError("the prompt and prefix leave no room to decode")
        self.logit_filters = window_filters(
            tokenizer,
            options,
            n_vocab=self.n_vocab,
            sample_begin=self.sample_begin,
            grammar_begin=self.grammar_begin,
            prefix=tuple(forced),
            guard=self._guard() if options.repetition_guard else None,
        )
        self.ranker = MaximumLikelihoodRanker(options.length_penalty)
        if rng is None:
            rng = np.random.default_rng(options.seed)
        self.rng = rng
        self._prefilled: tuple[_Prefill, bool] | None = None

    def _encode_text(self, value: str | tuple[int, ...]) -> list[int]:
        if isinstance(value, str):
            return self.tokenizer.encode(" " + value.strip())
        return list(value)

    def _initial_tokens(self) -> tuple[int, ...]:
        tokens = list(self.sot_sequence)
        self._prefix_tokens: list[int] = []
        if self.options.prefix:
            prefix = self._encode_text(self.options.prefix)
            max_prefix_len = self.n_ctx // 2 - self.sample_len
            # as openai/whisper: trimmed only when sample_len leaves less than half the context
            keep = max_prefix_len if max_prefix_len > 0 else self.n_ctx // 2 - 1
            prefix = prefix[-keep:]
            tokens += prefix
            self._prefix_tokens = prefix
        if self.options.prompt:
            prompt = self._encode_text(self.options.prompt)
            tokens = [self.tokenizer.sot_prev, *prompt[-(self.n_ctx // 2 - 1) :], *tokens]
        return tuple(tokens)

    def _guard(self) -> RepetitionGuard:
        tok = self.tokenizer
        return RepetitionGuard(
            eot=tok.eot, timestamp_begin=tok.timestamp_begin, sample_begin=self.sample_begin
        )

    def no_speech_steps(self) -> Steps[float]:
        """Probability of `<|nospeech|>` at the sot position (prefills the prefix if needed)."""
        return (yield from self._prefill_steps())[0].no_speech_prob

    def _prefill_steps(self) -> Steps[tuple[_Prefill, bool]]:
        if self._prefilled is None:
            self._prefilled = yield from self._compute_prefill()
        return self._prefilled

    def _compute_prefill(self) -> Steps[tuple[_Prefill, bool]]:
        mode = self.options.kv_cache
        if self.memo is not None:
            found = self.memo.get(mode, self.initial_tokens)
            if found is not None:
                return found, True
        start = time.perf_counter()
        cache = make_cache(mode, self.sessions, self.cross, 1)
        tokens = np.asarray([self.initial_tokens], dtype=np.int64)  # [1, L]
        logits = yield from cache.forward_steps(tokens, positions=(self.sot_index, -1))  # [1, 2, V]
        at_sot = log_softmax(logits[:, 0].astype(np.float32))[0]
        no_speech_prob = float(np.exp(at_sot[self.tokenizer.no_speech]))
        prefill = _Prefill(cache, logits[0, 1].copy(), no_speech_prob, time.perf_counter() - start)
        if self.memo is not None:
            self.memo.put(mode, self.initial_tokens, prefill)
        return prefill, False

    def run(
        self,
        on_token: Callable[[int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> DecodingResult:
        return self.sessions.run_steps(self.steps(on_token, cancel))

    def steps(
        self,
        on_token: Callable[[int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Steps[DecodingResult]:
        """This decode as a resumable task (`app.runtime.steps`)."""
        return (yield from self._steps((self,), on_token, cancel))[0]

    def together_steps(
        self, others: Sequence[DecodingTask], cancel: threading.Event | None = None
    ) -> Steps[list[DecodingResult]]:
        """This sampling decode and `others'` (the same window and initial tokens; their own
        temperatures and generators) as the rows of one decode: each task's result is the one
        it gives alone, for the cost of one decode of all their rows (nothing streams)."""
        tasks = (self, *others)
        for task in tasks:
            if task.options.beam_size is not None or task.options.temperature == 0:
                raise ValueError("only sampling decodes (temperature > 0) run together")
            if task.initial_tokens != self.initial_tokens or task.memo is not self.memo:
                raise ValueError("decodes run together share their initial tokens and memo")
        return (yield from self._steps(tasks, None, cancel))

    def _steps(
        self,
        tasks: Sequence[DecodingTask],
        on_token: Callable[[int], None] | None,
        cancel: threading.Event | None,
    ) -> Steps[list[DecodingResult]]:
        """The decode loop as a resumable task (its decoder calls served by the backend)."""
        opts, tok = self.options, self.tokenizer
        if cancel is not None and cancel.is_set():
            raise DecodingCancelled("decoding was cancelled")
        prefill, reused = yield from self._prefill_steps()
        started = time.perf_counter()
        sizes = [task.options.n_group for task in tasks]
        n = sum(sizes)
        cache = prefill.cache.fork(n)
        tokens = np.tile(np.asarray(self.initial_tokens, dtype=np.int64), (n, 1))  # [n, L]
        logits = np.tile(prefill.last_logits, (n, 1))  # [n, V]
        sum_logprobs = np.zeros(n, dtype=np.float64)

        decoder: TokenDecoder
        if opts.beam_size is not None:
            decoder = BeamSearchDecoder(opts.beam_size, tok.eot, cache, opts.patience or 1.0)
        elif len(tasks) == 1:
            decoder = GreedyDecoder(opts.temperature, tok.eot, self.rng)
        else:
            decoder = GroupedSampler(
                [
                    (GreedyDecoder(t.options.temperature, tok.eot, t.rng), k)
                    for t, k in zip(tasks, sizes, strict=True)
                ]
            )

        reported = self.sample_begin  # tokens[:, :reported] went to on_token already
        peak_nbytes = cache.nbytes
        steps = 0
        while True:
            if cancel is not None and cancel.is_set():
                raise DecodingCancelled("decoding was cancelled")
            for logit_filter in self.logit_filters:
                logit_filter.apply(logits, tokens)
            tokens, completed = decoder.update(tokens, logits, sum_logprobs)
            steps += 1
            if on_token is not None:
                reported = report_stable(on_token, tokens, decoder, reported, tok.eot)
            # a sequence longer than n_ctx can't be fed back: stop there (never past a buffer)
            if completed or steps >= self.sample_len or tokens.shape[1] > self.n_ctx:
                break
            logits = (yield from cache.forward_steps(tokens))[:, -1]  # [n, V]
            peak_nbytes = max(peak_nbytes, cache.nbytes)

        candidates, scores, ended = decoder.finalize(tokens, sum_logprobs)
        stats = DecodeStats(
            prefill_s=0.0 if reused else prefill.seconds,
            decoder_s=cache.decoder_s,
            wall_s=time.perf_counter() - started,
            steps=steps,
            calls=cache.calls,
            prefill_reused=reused,
            cache_nbytes=peak_nbytes,
            handed_nbytes=cache.handed_nbytes,
        )
        if len(tasks) == 1:
            return [self._result(candidates, scores, ended, stats, prefill, on_token, reported)]
        results, first = [], 0
        for i, (task, k) in enumerate(zip(tasks, sizes, strict=True)):
            rows = slice(first, first + k)
            first += k
            # the shared decode's costs are counted once, with the first result
            results.append(
                task._result(
                    candidates[rows], scores[rows], ended[rows], stats if i == 0 else None, prefill
                )
            )
        return results

    def _result(
        self,
        candidates: list[list[int]],
        scores: list[float],
        ended: list[bool],
        stats: DecodeStats | None,
        prefill: _Prefill,
        on_token: Callable[[int], None] | None = None,
        reported: int = 0,
    ) -> DecodingResult:
        """The ranked best of this decode's candidates (whole rows ending in EOT), as a result;
        the rest of its tokens to on_token (those after `reported`)."""
        tok, opts = self.tokenizer, self.options
        sampled = []
        for seq in candidates:
            body = seq[self.sample_begin :]
            end = body.index(tok.eot) if tok.eot in body else len(body)
            sampled.append(body[:end])
        best = self.ranker.rank(sampled, scores)
        chosen = tuple(sampled[best])
        if on_token is not None:
            for t in chosen[reported - self.sample_begin :]:
                on_token(t)
        sum_logprob = float(scores[best])
        text = tok.decode(chosen).strip()
        return DecodingResult(
            tokens=chosen,
            text=text,
            avg_logprob=sum_logprob / (len(chosen) + 1),
            sum_logprob=sum_logprob,
            no_speech_prob=prefill.no_speech_prob,
            temperature=opts.temperature,
            compression_ratio=compression_ratio(text),
            language=self.language,
            language_probs=self.language_probs,
            truncated=not ended[best],
            looped=bool(opts.repetition_guard and self._guard().is_looping(chosen)),
            stats=stats,
        )


def decode(
    sessions: WhisperBackend,
    cross: list[np.ndarray],
    tokenizer: Tokenizer,
    options: DecodingOptions,
    on_token: Callable[[int], None] | None = None,
    cancel: threading.Event | None = None,
    *,
    memo: PrefixMemo | None = None,
    rng: np.random.Generator | None = None,
) -> DecodingResult:
    """Decode one 30 s window.

    cross: the window's cross-attention K/V from `sessions.encode()`, each f32 [1, H, 1500, Dh].
    on_token(token_id): called per accepted token (see the module docstring for beams).
    cancel: when set, raises DecodingCancelled at the next step.
    memo: per-window memo; pass the same one to every attempt on this window to reuse the prefill.
    rng: sampling generator (default: seeded from options.seed).
    """
    task = DecodingTask(sessions, cross, tokenizer, options, memo=memo, rng=rng)
    return task.run(on_token, cancel)
