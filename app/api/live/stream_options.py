"""Every live protocol's configuration -> the session's `StreamingOptions`, in one place.

One function per protocol (`realtime_options`, `audio_stream_options`, `wyoming_options`), all on
the server's `LiveDefaults` (built once from the settings: `live_defaults`, the one place the
default VAD is decided) and the service's language rule (`model_language`: the engine's
normaliser, so "mandarin" or "English" work on every path). Each raises `Rejected`; the adapters
translate it and never validate options themselves.
"""

from __future__ import annotations

from dataclasses import replace

from app.api.live.audio_stream_config import StreamConfig
from app.api.live.realtime_config import RealtimeConfig
from app.config import Settings
from app.service.errors import Rejected
from app.service.live import StreamingOptions, VadOptions
from app.service.live.options import LiveDefaults
from app.service.live.turns import CANDIDATE_SILENCE_S, TurnRules
from app.service.live.utterance import PAUSE_S
from app.service.models.loaded import LoadedModel
from app.service.transcription.jobs import TranscriptionJob
from app.service.transcription.options import (
    TranscriptionOptions,
    language_choice,
    model_language,
)

REALTIME_LANGUAGE = "session.audio.input.transcription.language"
REALTIME_LANGUAGES = "session.audio.input.transcription.languages"
# Realtime's `delay` (how long text waits to be surer) as the live pace (step_s, edge_s): a pass
# every step_s of audio; AlignAtt commits a word once the decoder read edge_s past it. medium is
# the server's shipped default (0.5 s since the word before an unsettled one waits for a second
# reading: live_edge.md). Measured offline (live_delay.md, live_edge.md): below it words come
# sooner and base reads worse; above it they come later for no gain (an edge of 1.6 s or more,
# or 1.5 s steps, read worse again: not used)
DELAY_PACE: dict[str, tuple[float, float]] = {
    "minimal": (0.5, 0.4),
    "low": (0.75, 0.45),
    "medium": (1.0, 0.5),
    "high": (1.0, 0.7),
    "xhigh": (1.0, 1.0),
}
REALTIME_TURNS = "session.audio.input.turn_detection.type"
WYOMING_BEAM_SIZE = 1  # voice commands: greedy, as Home Assistant's own Whisper add-on defaults to
# Home Assistant's `vad_sensitivity` (wyoming `transcribe`) as the end of a command: with the
# turn model, the eagerness of semantic turn detection (relaxed waits longest on an unfinished
# pause); without it, the silence that ends the command (Home Assistant's own VAD's: 1.25, 0.7,
# 0.25 s)
SENSITIVITIES: tuple[str, ...] = ("relaxed", "default", "aggressive")
_EAGERNESS = {"relaxed": "low", "default": "auto", "aggressive": "high"}
_SILENCE_S = {"relaxed": 1.25, "default": 0.7, "aggressive": 0.25}


def live_defaults(
    settings: Settings, base: TranscriptionOptions, vad_installed: bool, turn_installed: bool
) -> LiveDefaults:
    """The server's live settings and decoding defaults; the default VAD is on when the model
    is installed and STT_VAD_FILTER is set; semantic turn detection needs the turn model."""
    return LiveDefaults(
        step_s=settings.stream_step_s,
        policy=settings.stream_policy,
        edge_s=settings.stream_edge_s,
        pause_s=settings.stream_pause_s or None,
        no_speech_threshold=base.no_speech_threshold,
        kv_cache=base.kv_cache,
        vad=VadOptions() if vad_installed and settings.vad_filter else None,
        vad_installed=vad_installed,
        turn_installed=turn_installed,
    )


def realtime_default(defaults: LiveDefaults) -> RealtimeConfig:
    """A new Realtime session's configuration: server VAD cuts turns when the VAD model is
    installed; without it the client commits them."""
    return RealtimeConfig() if defaults.vad_installed else RealtimeConfig(turn_detection=None)


def realtime_options(
    config: RealtimeConfig, model: LoadedModel, defaults: LiveDefaults
) -> StreamingOptions:
    """A Realtime session on `model`: its turn detection is the VAD (threshold, silence that
    ends a turn, audio kept before speech), with `semantic_vad` the VAD's short pauses judged by
    the turn model (`app.service.live.turns`); without turn detection the default VAD still
    keeps silence from being decoded. `keywords` lead the prompt (as REST's `keywords[]` lead
    every window's), `languages` limit detection, `delay` sets the pace (`DELAY_PACE`), and
    log-probs need the passes aligned."""
    language, candidates = language_choice(
        model.name, model.multilingual, config.language, config.languages,
        params=(REALTIME_LANGUAGE, REALTIME_LANGUAGES),
    )  # fmt: skip
    session = {
        "language": language,
        "languages": candidates,
        "prompt": " ".join(filter(None, (", ".join(config.keywords), config.prompt))) or None,
        "pace": None if config.delay is None else DELAY_PACE[config.delay],
        "word_timestamps": config.logprobs,
    }
    turns = config.turn_detection
    if turns is None or not defaults.vad_installed:
        return defaults.options(**session)
    semantic = turns.type == "semantic_vad"
    if semantic and not defaults.turn_installed:
        raise Rejected(
            "turn_model_missing",
            "semantic_vad needs the turn model, which this server does not have (make models); "
            "use server_vad",
            param=REALTIME_TURNS,
            kind="unavailable",
        )
    silence_s = CANDIDATE_SILENCE_S if semantic else turns.silence_duration_ms / 1000
    vad = VadOptions(threshold=turns.threshold, neg_threshold=None, min_silence_s=silence_s)
    return defaults.options(
        **session,
        vad=vad,
        preroll_s=turns.prefix_padding_ms / 1000,
        pause_s=None if semantic else "default",  # every pause is a candidate the model judges
        turn=TurnRules.of(turns.eagerness) if semantic else None,
    )


def audio_stream_options(config: StreamConfig, defaults: LiveDefaults) -> StreamingOptions:
    """A `/v1/audio/stream` session (its configuration was checked field by field when the
    client set it: `audio_stream_config.apply_update`)."""
    return defaults.options(
        language=config.language,
        task=config.task,
        vad=config.vad,
        preroll_s=config.preroll_s,
        prompt=config.prompt,
        word_timestamps=config.word_timestamps,
    )


def wyoming_sensitivity(value: object) -> str:
    """`transcribe`'s `vad_sensitivity` (None: "default"), checked."""
    value = getattr(value, "value", value)  # the wyoming package's enum or the string it kept
    if value is None:
        return "default"
    if value not in SENSITIVITIES:
        raise Rejected(
            "invalid_vad_sensitivity",
            f"vad_sensitivity must be one of {', '.join(SENSITIVITIES)}, not {value!r}",
        )
    return str(value)


def wyoming_options(
    model: LoadedModel, language: str | None, defaults: LiveDefaults, endpoint: str | None
) -> tuple[StreamingOptions, TranscriptionJob]:
    """A Wyoming utterance on `model` in `language` (as `transcribe` named it; None = detect):
    the live session's options (for the transcript chunks; its VAD, when on, watches for the
    `PAUSE_S` pause that starts the whole pass early) and the whole-utterance job (the
    transcript: greedy, the server's defences). `endpoint`: the `vad_sensitivity` by which
    the session ends the command (its end of turn, then `Finalized("pause")`), None: the client
    ends it (`audio-stop`)."""
    code = model_language(model.name, model.multilingual, language)
    job_options = replace(model.base_options, language=code, beam_size=WYOMING_BEAM_SIZE)
    job = TranscriptionJob(b"", job_options)
    if endpoint is None or not defaults.vad_installed:
        return defaults.options(language=code, pause_s=PAUSE_S), job
    turn = TurnRules.of(_EAGERNESS[endpoint]) if defaults.turn_installed else None
    silence_s = CANDIDATE_SILENCE_S if turn is not None else _SILENCE_S[endpoint]
    vad = VadOptions(min_silence_s=silence_s)
    return defaults.options(language=code, vad=vad, pause_s=PAUSE_S, turn=turn), job
