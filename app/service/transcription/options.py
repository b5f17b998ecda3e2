"""The options of one transcription (`Transcriber.transcribe`), validated once, and the rules
every protocol follows for the language and task a model runs.

The language rule is the engine's normaliser (`to_language_code`: codes, English names and
Whisper's aliases such as "mandarin") plus the model's own limit (an English-only model takes
English only); REST and the live protocols all call `model_language`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from app.engine.decoding_types import MAX_BEAM_SIZE, DecodingOptions
from app.engine.kv_cache import CACHE_MODES
from app.engine.languages import LANGUAGES, to_language_code
from app.engine.vad import VadOptions
from app.service.errors import Rejected

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
# what a request may ask for, on every protocol: OpenAI's temperature range (the fallback schedule
# is the service's own and never goes above it) and the engine's widest beam
MAX_REQUEST_TEMPERATURE = DEFAULT_TEMPERATURES[-1]
MAX_REQUEST_BEAM_SIZE = MAX_BEAM_SIZE
Task = Literal["transcribe", "translate"]


@dataclass(frozen=True)
class TranscriptionOptions:
    """Options of one transcription, validated once (ValueError).

    temperature: the fallback schedule, tried in order (a single float is one attempt).
    beam_size: beams at temperature 0 (None or 1 = greedy); best_of: samples at temperature > 0.
    thresholds: compression_ratio_threshold (fallback above), log_prob_threshold (fallback
    below), no_speech_threshold (skip a window above it when its avg log-prob is below
    log_prob_threshold); None disables a check.
    prompt_reset_on_temperature: a window decoded above it does not prompt the next one.
    kv_cache: "concat" | "static" | "none". seed: sampling rng seed of the request.
    vad_filter: transcribe only the speech regions Silero VAD finds (`vad_options`; None =
    defaults), as faster-whisper does; segment times stay those of the original audio. Needs a
    Transcriber built with a VAD model.
    word_timestamps: each segment gets its words with start/end and probability
    (`app.engine.timing`); segment bounds follow the words.
    hotwords: terms put at the head of every window's prompt, to bias the spelling of names
    and jargon (faster-whisper's option); at most MAX_HOTWORD_TOKENS tokens are kept.
    languages: when `language` is None, detection picks the most probable of these codes
    (OpenAI's `languages[]`); empty = any language the model knows.
    """

    language: str | None = None
    task: str = "transcribe"
    beam_size: int | None = 5
    best_of: int | None = 5
    patience: float | None = 1.0
    length_penalty: float | None = None
    temperature: float | tuple[float, ...] = DEFAULT_TEMPERATURES
    compression_ratio_threshold: float | None = 2.4
    log_prob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    prompt_reset_on_temperature: float = 0.5
    initial_prompt: str | tuple[int, ...] | None = None
    prefix: str | None = None
    without_timestamps: bool = False
    max_initial_timestamp: float | None = 1.0
    suppress_blank: bool = True
    suppress_tokens: tuple[int, ...] | None = (-1,)
    sample_len: int | None = None
    vad_filter: bool = False
    vad_options: VadOptions | None = None
    kv_cache: str = "concat"
    seed: int | None = 0
    repetition_guard: bool = True
    word_timestamps: bool = False
    hotwords: str | None = None
    languages: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        temps = self.temperature
        if isinstance(temps, int | float):
            temps = (float(temps),)
        temps = tuple(float(t) for t in temps)
        if not temps:
            raise ValueError("temperature needs at least one value")
        if any(t < 0 or t > 10 for t in temps):
            raise ValueError("temperatures must be in [0, 10]")
        object.__setattr__(self, "temperature", temps)
        if self.suppress_tokens is not None:
            object.__setattr__(self, "suppress_tokens", tuple(int(t) for t in self.suppress_tokens))
        if isinstance(self.initial_prompt, list):
            object.__setattr__(self, "initial_prompt", tuple(self.initial_prompt))
        if self.beam_size == 1:
            object.__setattr__(self, "beam_size", None)
        if self.kv_cache not in CACHE_MODES:
            raise ValueError(f"kv_cache must be one of {CACHE_MODES}, got {self.kv_cache!r}")
        if not 0 <= self.prompt_reset_on_temperature <= 10:
            raise ValueError("prompt_reset_on_temperature must be in [0, 10]")
        # let DecodingOptions check the rest, once, for every temperature of the schedule
        for t in temps:
            self.decoding_options(t)

    def decoding_options(
        self,
        temperature: float,
        *,
        language: str | None = None,
        prompt: Sequence[int] | None = None,
        prefix: str | None = None,
    ) -> DecodingOptions:
        """The options of one decode attempt at `temperature`."""
        greedy = temperature == 0
        return DecodingOptions(
            task=self.task,
            language=language if language is not None else self.language,
            temperature=temperature,
            sample_len=self.sample_len,
            best_of=None if greedy else self.best_of,
            beam_size=self.beam_size if greedy else None,
            patience=self.patience if greedy and self.beam_size else None,
            length_penalty=self.length_penalty,
            prompt=tuple(prompt) if prompt else None,
            prefix=prefix,
            suppress_tokens=self.suppress_tokens,
            suppress_blank=self.suppress_blank,
            without_timestamps=self.without_timestamps,
            max_initial_timestamp=self.max_initial_timestamp,
            kv_cache=self.kv_cache,
            seed=self.seed,
            repetition_guard=self.repetition_guard,
        )


def model_language(
    model: str, multilingual: bool, language: object, param: str = "language"
) -> str | None:
    """The language a job or stream on `model` runs in: `language` normalised by the engine
    (None or "" = detect); always "en" on an English-only model, which takes no other. Anything
    else is `Rejected` ("unsupported_language", naming `param`)."""
    code: str | None = None
    if isinstance(language, str) and language.strip():
        try:
            code = to_language_code(language)
        except ValueError:
            raise Rejected(
                "unsupported_language",
                f"Unsupported language '{language}': use an ISO-639-1 code such as 'en' or 'de'",
                param=param,
            ) from None
    elif language is not None and not isinstance(language, str):
        raise Rejected("unsupported_language", f"unsupported language {language!r}", param=param)
    if multilingual:
        return code
    if code not in (None, "en"):
        raise Rejected(
            "unsupported_language",
            f"The model '{model}' is English-only; it cannot transcribe language '{code}'",
            param=param,
        )
    return "en"


def language_choice(
    model: str,
    multilingual: bool,
    language: object,
    candidates: Sequence[str],
    *,
    params: tuple[str, str] = ("language", "languages"),
) -> tuple[str | None, tuple[str, ...]]:
    """(the language, the candidates detection picks from): `language` as `model_language`
    takes it, and OpenAI's `languages` (the languages the audio may be in) as the engine's
    codes, each once. A named language wins; one candidate is the language; else detection
    picks among them (none: any the model knows). `Rejected` (naming the `params` entry) for a
    language `model` cannot transcribe."""
    code = model_language(model, multilingual, language, param=params[0])
    codes = (model_language(model, multilingual, c, param=params[1]) for c in candidates)
    found = tuple(dict.fromkeys(c for c in codes if c is not None))
    if code is not None:
        return code, ()
    if len(found) == 1:
        return found[0], ()
    return None, found


def model_task(multilingual: bool, task: Task) -> Task:
    """The task a model runs: an English-only model's output is English already, so its
    translation is a transcription."""
    return task if multilingual else "transcribe"


def model_languages(multilingual: bool) -> list[str]:
    """The language codes a model takes: every Whisper language, or English only."""
    return list(LANGUAGES) if multilingual else ["en"]
