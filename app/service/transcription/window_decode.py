"""How one 30 s window is decoded, for a file's windows and a live stream's passes alike: a
frozen `WindowPlan` (the attempts, the rule that judges them) goes into the one decode,
`decode_window`, and a `DecodedWindow` (the chosen result and its verdict, as data)
comes out. The caller executes the verdict.

Shaped after openai/whisper's `decode_with_fallback`: the attempts run in order (rising
temperatures) until the `FallbackRule` accepts one; when it accepts none, it picks the best of
them. The attempts share one `PrefixMemo`, so the prompt is prefilled once per window. Once the
first attempt has failed, the sampling ones (T = 0.2 ... 1.0 by default) run as the rows of one
decode (`WindowPlan.batches`): a window that got that far seldom passes at the next temperature
(1 of 24 such windows at T = 0.2: tiny.en and base over the robustness corpus, the devcorpus
and the 10 min clip, with and without the VAD), and a step's cost grows far slower than its rows
(tiny.en, decoder call + Python: 5 rows 6.3 ms, 15 rows 11.2 ms), so trying them one after
another costs more than all at once. Each attempt samples with its own generator, so its
result is the one it gives alone, and the first accepted one still stands.

- A file window (`file_plan`): the options' temperature schedule; may be judged silent; a looped
  result, when it is the best the attempts gave, is still text. Its streamed text cannot be taken
  back, so only the first attempt streams, and not when the window may be judged silent.
- A live pass (`app.service.live.window_pass.pass_plan`): one greedy attempt after the forced
  prefix; judged silent only when nothing is forced (a forced prefix is speech already heard); a
  looped result is no text. Its tokens are partial text, replaced by the next pass: all stream.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from app.engine.backend import WhisperBackend
from app.engine.decoding import DecodingTask, PrefixMemo
from app.engine.decoding_types import DecodingCancelled, DecodingOptions, DecodingResult
from app.engine.language_detection import language_steps
from app.engine.tokenizer import Tokenizer
from app.runtime.steps import Steps
from app.service.transcription.fallback import FallbackRule
from app.service.transcription.options import TranscriptionOptions
from app.service.transcription.windows import judged_silent

log = logging.getLogger(__name__)
Verdict = Literal["speech", "silent", "looped"]
TOGETHER_FROM = 1  # attempts from this index on run together (the module docstring says why)
# the most self K/V (at a full text context) attempts run together may hold: 25 rows hold
# 66 MiB at tiny.en (bf16), 219 MiB at large-v3-turbo, 1.7 GiB at large-v3 (each alone there)
TOGETHER_KV_BYTES = 256 << 20


@dataclass(frozen=True)
class WindowPlan:
    """How one window is decoded and judged.

    attempts: each attempt's options, in order; the next runs when `rule` retries.
    judge_silence: the window may be judged silent (`judged_silent`, on `rule`'s thresholds).
    drop_loops: a result the repetition guard cut off is no text (verdict "looped").
    hold_doubtful: streamed text cannot be taken back, so an attempt that may be judged silent
        streams nothing.
    """

    attempts: tuple[DecodingOptions, ...]
    rule: FallbackRule
    judge_silence: bool = True
    drop_loops: bool = False
    hold_doubtful: bool = True

    def __post_init__(self) -> None:
        if not self.attempts:
            raise ValueError("a window plan needs at least one attempt")

    def batches(self, max_rows: int | None = None) -> tuple[tuple[int, ...], ...]:
        """The attempts' indices as the decodes that run them, in order: one each up to
        `TOGETHER_FROM`, the sampling attempts after it as one, or as consecutive runs of them
        of at most `max_rows` rows (a run of one attempt may have more)."""
        first = min(TOGETHER_FROM, len(self.attempts))
        rest = range(first, len(self.attempts))
        batches = [(i,) for i in range(first)]
        if not all(self.attempts[i].temperature > 0 for i in rest):
            return tuple(batches + [(i,) for i in rest])
        run: list[int] = []
        rows = 0  # of the attempts in `run`
        for i in rest:
            rows += self.attempts[i].n_group
            if run and max_rows is not None and rows > max_rows:
                batches.append(tuple(run))
                run, rows = [], self.attempts[i].n_group
            run.append(i)
        return tuple(batches + ([tuple(run)] if run else []))

    def streams(self, attempt: int, no_speech_prob: float) -> bool:
        """Whether the tokens of `attempt` (0-based) may be streamed as they are decoded: the
        first attempt's, unless the window may be judged silent and such text is held back."""
        doubtful = self.hold_doubtful and self.rule.maybe_silent(no_speech_prob)
        return attempt == 0 and not doubtful

    def verdict(self, result: DecodingResult, audio_s: float) -> Verdict:
        """What the chosen result of a window of `audio_s` seconds is."""
        rule = self.rule
        if self.judge_silence and judged_silent(
            result.no_speech_prob, result.avg_logprob, result.text, audio_s,
            rule.no_speech_threshold, rule.log_prob_threshold,
        ):  # fmt: skip
            return "silent"
        if self.drop_loops and result.looped:
            return "looped"
        return "speech"


def rows_within(budget: int, sessions: WhisperBackend) -> int:
    """The decoder rows whose self K/V, at a full text context, fit in `budget` bytes."""
    dims = sessions.manifest.dims
    per_row = 2 * dims.n_text_layer * dims.n_heads * dims.n_text_ctx * dims.head_dim
    return budget // (per_row * sessions.kv_dtype.itemsize)


@dataclass(frozen=True)
class DecodedWindow:
    """result: the chosen attempt; attempts: every attempt's result, in order."""

    result: DecodingResult
    verdict: Verdict
    attempts: tuple[DecodingResult, ...]


def file_plan(
    options: TranscriptionOptions,
    language: str,
    prompt: Sequence[int],
    prefix: str | None,
) -> WindowPlan:
    """A file window's plan: an attempt per temperature of `options`, its fallback rule."""
    attempts = tuple(
        options.decoding_options(t, language=language, prompt=prompt, prefix=prefix)
        for t in options.temperature
    )
    return WindowPlan(attempts, FallbackRule.of(options))


class TranscriptionCancelled(Exception):
    """The caller's cancel event was set; the transcription stopped at the next decoder step."""


def decode_window(
    sessions: WhisperBackend,
    tokenizer: Tokenizer,
    together_rows: int,
    cross: list[np.ndarray],
    plan: WindowPlan,
    audio_s: float,
    *,
    on_token: Callable[[int], None] | None = None,
    on_attempt: Callable[[bool], None] | None = None,
    cancel: threading.Event | None = None,
    rng: np.random.Generator | None = None,
) -> Steps[DecodedWindow]:
    """Decode the window of `cross` (its cross K/V; `audio_s` seconds of audio) by `plan`,
    as openai/whisper's `decode_with_fallback`: its attempts in order until the rule accepts
    one, else the rule's best; one `PrefixMemo` for all; the attempts of one of the plan's
    batches (at most `together_rows` rows) as one decode, each sampling from its own generator
    (spawned from `rng`). on_token gets the tokens of every attempt decoded alone;
    on_attempt(streams) is called before each decode (`WindowPlan.streams`). Raises
    TranscriptionCancelled once `cancel` is set. A resumable task (`app.runtime.steps`)."""
    memo = PrefixMemo()
    results: list[DecodingResult] = []
    first = plan.attempts[0]
    if tokenizer.multilingual and first.language is None:  # once, for every attempt
        memo.language = yield from language_steps(sessions, cross, tokenizer, first.kv_cache)
    for batch in plan.batches(together_rows):
        tasks = [
            DecodingTask(
                sessions, cross, tokenizer, plan.attempts[i], memo=memo,
                rng=None if rng is None else rng.spawn(1)[0],
            )
            for i in batch
        ]  # fmt: skip
        try:
            if on_attempt is not None:
                no_speech = yield from tasks[0].no_speech_steps()
                on_attempt(plan.streams(batch[0], no_speech))
            if len(tasks) == 1:
                tried = [(yield from tasks[0].steps(on_token, cancel))]
            else:
                tried = yield from tasks[0].together_steps(tasks[1:], cancel)
        except DecodingCancelled as e:
            raise TranscriptionCancelled(str(e)) from e
        for result in tried:
            results.append(result)
            log.debug(
                "T=%.1f: %d tokens, avg logprob %.2f, compression %.2f, no-speech %.2f%s",
                result.temperature, len(result.tokens), result.avg_logprob,
                result.compression_ratio, result.no_speech_prob,
                ", looped" if result.looped else "",
            )  # fmt: skip
            if not plan.rule.retry(result):
                return DecodedWindow(result, plan.verdict(result, audio_s), tuple(results))
    result = plan.rule.best(results)
    return DecodedWindow(result, plan.verdict(result, audio_s), tuple(results))
