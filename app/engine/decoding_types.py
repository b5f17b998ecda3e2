"""What decoding one window is asked and what it gives: `DecodingOptions` (frozen, validated
once, as openai/whisper's), `DecodingResult` with its `DecodeStats`, `LanguageDetection`, and
`compression_ratio` (the repetitiveness measure of the temperature fallback). The loop that
uses them: `app.engine.decoding`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from app.engine.kv_cache import CACHE_MODES

TASKS = ("transcribe", "translate")
MAX_BEAM_SIZE = 16
MAX_BEST_OF = 16


class DecodingCancelled(Exception):
    """The caller's cancel event was set; decoding stopped at the next step."""


def compression_ratio(text: str) -> float:
    """len(utf-8 bytes) / len(zlib-compressed bytes); high values mean repetitive text."""
    data = text.encode("utf-8")
    if not data:
        return 0.0
    return len(data) / len(zlib.compress(data))


def _as_tokens(value: object, name: str) -> str | tuple[int, ...] | None:
    if value is None or isinstance(value, str):
        return value
    try:
        tokens = tuple(int(t) for t in value)  # type: ignore[attr-defined]
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a string or a sequence of token ids") from e
    return tokens


@dataclass(frozen=True)
class DecodingOptions:
    """How to decode one window. Validated once at construction (ValueError).

    temperature: 0 = greedy (or beam search with `beam_size`); > 0 = sampling, `best_of` samples.
    sample_len: maximum sampled tokens (default n_text_ctx // 2 = 224).
    patience: beam search keeps going until round(beam_size * patience) candidates finished.
    length_penalty: None = rank by log-prob / length; alpha in [0, 1] = Google NMT penalty.
    prompt: previous text (str, encoded with a leading space) or tokens; the last 223 are used.
    prefix: text or tokens forced at the start of the sampled part. Tokens that hold timestamps
        (a live stream's committed text) continue under the timestamp grammar: after a prefix
        ending in text, text may follow.
    suppress_tokens: ids, or a comma-separated string; -1 = the model's non-speech symbols.
    max_initial_timestamp: the first timestamp is at most this many seconds into the window.
    kv_cache: "concat" | "static" | "none" (reference: full re-run every step).
    seed: seeds the sampling rng of a request (None = fresh entropy each time).
    repetition_guard: end a sequence that falls into a repetition loop.
    """

    task: str = "transcribe"
    language: str | None = None
    temperature: float = 0.0
    sample_len: int | None = None
    best_of: int | None = None
    beam_size: int | None = None
    patience: float | None = None
    length_penalty: float | None = None
    prompt: str | tuple[int, ...] | None = None
    prefix: str | tuple[int, ...] | None = None
    suppress_tokens: str | tuple[int, ...] | None = "-1"
    suppress_blank: bool = True
    without_timestamps: bool = False
    max_initial_timestamp: float | None = 1.0
    kv_cache: str = "concat"
    seed: int | None = 0
    repetition_guard: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "prompt", _as_tokens(self.prompt, "prompt"))
        set_(self, "prefix", _as_tokens(self.prefix, "prefix"))
        if self.suppress_tokens is not None and not isinstance(self.suppress_tokens, str):
            set_(self, "suppress_tokens", _as_tokens(self.suppress_tokens, "suppress_tokens"))
        if isinstance(self.suppress_tokens, str):
            try:
                parsed = tuple(int(t) for t in self.suppress_tokens.split(",") if t.strip())
            except ValueError as e:
                raise ValueError("suppress_tokens must be comma-separated integers") from e
            set_(self, "suppress_tokens", parsed)

        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.kv_cache not in CACHE_MODES:
            raise ValueError(f"kv_cache must be one of {CACHE_MODES}, got {self.kv_cache!r}")
        if not 0.0 <= self.temperature <= 10.0:
            raise ValueError(f"temperature must be in [0, 10], got {self.temperature}")
        if self.sample_len is not None and self.sample_len < 1:
            raise ValueError("sample_len must be >= 1")
        if self.beam_size is not None:
            if not 1 <= self.beam_size <= MAX_BEAM_SIZE:
                raise ValueError(f"beam_size must be in 1..{MAX_BEAM_SIZE}, got {self.beam_size}")
            if self.best_of is not None:
                raise ValueError("beam_size and best_of can't be given together")
            if self.temperature != 0:
                raise ValueError("beam search runs at temperature 0; use best_of to sample")
        if self.best_of is not None:
            if not 1 <= self.best_of <= MAX_BEST_OF:
                raise ValueError(f"best_of must be in 1..{MAX_BEST_OF}, got {self.best_of}")
            if self.temperature == 0 and self.best_of > 1:
                raise ValueError("best_of with greedy sampling (temperature 0) is not compatible")
        if self.patience is not None:
            if self.beam_size is None:
                raise ValueError("patience requires beam_size to be given")
            if self.patience <= 0:
                raise ValueError("patience must be > 0")
        if self.length_penalty is not None and not 0 <= self.length_penalty <= 1:
            raise ValueError("length_penalty (alpha) must be between 0 and 1")
        if self.max_initial_timestamp is not None and self.max_initial_timestamp < 0:
            raise ValueError("max_initial_timestamp must be >= 0")

    @property
    def n_group(self) -> int:
        """Rows decoded together: beams, samples, or 1."""
        return self.beam_size or self.best_of or 1


@dataclass(frozen=True)
class DecodeStats:
    """Where one decode's time went. Seconds; `steps` = loop iterations (tokens per row)."""

    prefill_s: float  # 0 when the prefix came from the memo
    decoder_s: float  # decoder calls after the prefill (every row of the batch together)
    wall_s: float  # the step loop: decoder calls, filters, search, cache copies
    steps: int
    calls: int
    prefill_reused: bool
    cache_nbytes: int  # peak cross + self K/V bytes held (all rows)
    handed_nbytes: int  # input bytes given to the runtime by the step calls (all of them)


@dataclass(frozen=True)
class DecodingResult:
    """The chosen sequence of one window.

    tokens: sampled tokens (timestamps included, EOT and the initial tokens excluded).
    avg_logprob: sum of the tokens' log-probs / (len(tokens) + 1), as in openai/whisper.
    no_speech_prob: probability of `<|nospeech|>` at the sot position.
    truncated: the sequence hit sample_len or the text context without EOT.
    looped: the repetition guard ended it.
    """

    tokens: tuple[int, ...]
    text: str
    avg_logprob: float
    sum_logprob: float
    no_speech_prob: float
    temperature: float
    compression_ratio: float
    language: str
    language_probs: dict[str, float] | None = None
    truncated: bool = False
    looped: bool = False
    stats: DecodeStats | None = field(default=None, compare=False)


@dataclass(frozen=True)
class LanguageDetection:
    language: str
    probability: float
    probabilities: dict[str, float]  # code -> probability, most likely first
