"""The configuration of a Realtime transcription session, and how client updates change it.

`RealtimeConfig` is the effective setting. `apply_ga` (GA `session.update`) and `apply_beta`
(beta `transcription_session.update`) change only the fields an update names and return
(new config, [ProtocolError]). An invalid value anywhere (wrong type, out of range, a session type
other than "transcription") rejects the whole update: the old config comes back with
`invalid_value` errors. A setting OpenAI has but we do not support (noise reduction, ...) gives
an `unsupported_field` error, an unknown key `unknown_parameter`, and the rest is applied.
Params are dotted paths ("session.audio.input.turn_detection.threshold").
`session_ga` / `session_beta` give the session object the server reports. Model names,
languages and delays are only type-checked here: whether the server has them, and what a delay
means, is decided where the session's options are built (`stream_options.realtime_options`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from app.api.live.realtime_events import ProtocolError, json_type
from app.api.speaker_form import DIARIZE_MODEL
from app.service.live.bounds import PREROLL_S, SPEECH_THRESHOLD, TURN_SILENCE_S
from app.service.live.options import rate_problem
from app.service.live.turns import EAGERNESS, Eagerness

AudioFormat = Literal["audio/pcm", "audio/pcmu", "audio/pcma"]
Encoding = Literal["pcm_s16le", "g711_ulaw", "g711_alaw"]  # as app.engine.audio names them
FORMATS: tuple[AudioFormat, ...] = ("audio/pcm", "audio/pcmu", "audio/pcma")
ENCODINGS: dict[str, Encoding] = {
    "audio/pcm": "pcm_s16le",
    "audio/pcmu": "g711_ulaw",
    "audio/pcma": "g711_alaw",
}
BETA_FORMATS: dict[str, AudioFormat] = {
    "pcm16": "audio/pcm",
    "g711_ulaw": "audio/pcmu",
    "g711_alaw": "audio/pcma",
}
TurnType = Literal["server_vad", "semantic_vad"]
TURN_TYPES: tuple[str, ...] = ("server_vad", "semantic_vad")
MODEL_PARAM = "session.audio.input.transcription.model"
OPENAI_RATE = 24000  # the only PCM rate OpenAI accepts
G711_RATE = 8000
LOGPROBS = "item.input_audio_transcription.logprobs"
TOLERATED = frozenset({"object", "id", "expires_at", "client_secret"})  # echoes of what we send

_TURN_LIMITS = {
    "threshold": SPEECH_THRESHOLD,
    "prefix_padding_ms": PREROLL_S.ms,
    "silence_duration_ms": TURN_SILENCE_S.ms,
}
IDLE_TIMEOUT_MS = (1000, 600_000)  # turn_detection.idle_timeout_ms: 1 s .. 10 min of audio
Delay = Literal["minimal", "low", "medium", "high", "xhigh"]
DELAYS: tuple[str, ...] = ("minimal", "low", "medium", "high", "xhigh")
MAX_KEYWORDS = 100  # words or phrases; the prompt they go into holds at most ~100 tokens anyway
_NO_RESPONSES = "does not apply to a transcription session (it creates no responses); ignored"
_TURN_UNSUPPORTED = {"create_response": _NO_RESPONSES, "interrupt_response": _NO_RESPONSES}


def _idle_problem(value: Any) -> str | None:
    """Why `value` cannot be `idle_timeout_ms`, or None when it can (null turns it off)."""
    low, high = IDLE_TIMEOUT_MS
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number of milliseconds or null, not {json_type(value)}"
    if not low <= value <= high or not float(value).is_integer():
        return f"must be a whole number of milliseconds from {low} to {high}, not {value!r}"
    return None


def _turn_problem(name: str, value: Any) -> str | None:
    """Why `value` cannot be the turn-detection setting `name`, or None when it can."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, not {json_type(value)}"
    bound = _TURN_LIMITS[name]
    if bound.problem(value) is not None:  # NaN fails too
        return f"must be between {bound.low:g} and {bound.high:g}, not {value!r}"
    if name != "threshold" and not float(value).is_integer():
        return f"must be a whole number of milliseconds, not {value!r}"
    return None


@dataclass(frozen=True)
class TurnDetection:
    """Server VAD: the server cuts turns where speech stops (`server_vad`), or where a pause the
    turn model judges finished begins (`semantic_vad`: `eagerness` sets the longest wait,
    `app.service.live.turns`)."""

    threshold: float = SPEECH_THRESHOLD.default  # speech probability, 0..1
    prefix_padding_ms: int = int(PREROLL_S.ms.default)  # audio kept before the start of speech
    silence_duration_ms: int = int(TURN_SILENCE_S.ms.default)  # this much silence ends a turn
    type: TurnType = "server_vad"
    eagerness: Eagerness = "auto"  # semantic_vad
    idle_timeout_ms: int | None = None  # this much audio without speech: timeout_triggered

    def __post_init__(self) -> None:
        for name in _TURN_LIMITS:
            problem = _turn_problem(name, getattr(self, name))
            if problem:
                raise ValueError(f"turn_detection.{name} {problem}")
        if (problem := _idle_problem(self.idle_timeout_ms)) is not None:
            raise ValueError(f"turn_detection.idle_timeout_ms {problem}")
        if self.type not in TURN_TYPES:
            raise ValueError(f"turn_detection.type must be one of {', '.join(TURN_TYPES)}")
        if self.eagerness not in EAGERNESS:
            raise ValueError(f"turn_detection.eagerness must be one of {', '.join(EAGERNESS)}")


@dataclass(frozen=True)
class RealtimeConfig:
    """The effective settings of one transcription session."""

    model: str | None = None  # None: the server's default
    language: str | None = None  # None: detected (among `languages`, when set)
    prompt: str | None = None
    keywords: tuple[str, ...] = ()  # words or phrases that guide the spelling
    languages: tuple[str, ...] = ()  # the candidates detection picks from
    delay: Delay | None = None  # None: the server's pace (STT_STREAM_STEP_S, STT_STREAM_EDGE_S)
    format: AudioFormat = "audio/pcm"
    rate: int = OPENAI_RATE  # forced to 8000 for G.711; PCM: any rate `rate_problem` allows
    turn_detection: TurnDetection | None = TurnDetection()  # None: the client commits turns
    noise_reduction: None = None
    logprobs: bool = False
    speakers: bool = False  # extension: speaker segments on any model

    @property
    def diarize(self) -> bool:
        """Each item's speakers are sent (`...segment`): OpenAI's diarizing model, or asked."""
        return self.speakers or self.model == DIARIZE_MODEL

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {self.format!r}")
        if self.delay is not None and self.delay not in DELAYS:
            raise ValueError(f"delay must be one of {', '.join(DELAYS)}, not {self.delay!r}")
        if self.format != "audio/pcm":
            object.__setattr__(self, "rate", G711_RATE)
        elif (problem := rate_problem(self.rate)) is not None:
            raise ValueError(f"rate {problem}")

    @property
    def encoding(self) -> Encoding:
        """The `app.engine.audio.pcm_to_float` encoding of the session's audio."""
        return ENCODINGS[self.format]


class _Update:
    """What one session update asks for: the changes, the errors that reject it, the others."""

    def __init__(self, config: RealtimeConfig, event_id: str | None) -> None:
        self.config = config
        self.event_id = event_id
        self.changes: dict[str, Any] = {}
        self.invalid: list[ProtocolError] = []
        self.ignored: list[ProtocolError] = []

    def invalid_value(self, param: str, problem: str) -> None:
        message = f"'{param}' {problem}"
        self.invalid.append(ProtocolError(message, "invalid_value", param, self.event_id))

    def unsupported(self, param: str, message: str) -> None:
        self.ignored.append(ProtocolError(message, "unsupported_field", param, self.event_id))

    def unknown(self, param: str) -> None:
        message = f"unknown parameter '{param}' for a transcription session; it is ignored"
        self.ignored.append(ProtocolError(message, "unknown_parameter", param, self.event_id))

    def as_object(self, value: Any, param: str) -> dict[str, Any]:
        """`value` when it is a JSON object; else an error and {}."""
        if isinstance(value, dict):
            return value
        self.invalid_value(param, f"must be an object, not {json_type(value)}")
        return {}

    def result(self) -> tuple[RealtimeConfig, list[ProtocolError]]:
        if self.invalid:
            return self.config, self.invalid
        return replace(self.config, **self.changes), self.ignored


def apply_ga(
    config: RealtimeConfig, session: dict[str, Any], *, event_id: str | None = None
) -> tuple[RealtimeConfig, list[ProtocolError]]:
    """Apply a GA `session.update`'s `session` (see the module doc); errors carry `event_id`."""
    up = _Update(config, event_id)
    for key, value in up.as_object(session, "session").items():
        param = f"session.{key}"
        if key == "type":
            _session_type(up, value, param)
        elif key == "audio":
            for sub, audio in up.as_object(value, param).items():
                if sub == "input":
                    _ga_input(up, audio, f"{param}.input")
                else:  # "output": a transcription session has no audio output
                    up.unknown(f"{param}.{sub}")
        elif key == "include":
            _include(up, value, param)
        elif key not in TOLERATED:
            up.unknown(param)
    return up.result()


def apply_beta(
    config: RealtimeConfig, session: dict[str, Any], *, event_id: str | None = None
) -> tuple[RealtimeConfig, list[ProtocolError]]:
    """Apply the `session` of a beta `transcription_session.update`; see `apply_ga`."""
    up = _Update(config, event_id)
    for key, value in up.as_object(session, "session").items():
        param = f"session.{key}"
        if key == "input_audio_format":
            if isinstance(value, str) and value in BETA_FORMATS:
                fmt = BETA_FORMATS[value]
                up.changes["format"] = fmt
                up.changes["rate"] = OPENAI_RATE if fmt == "audio/pcm" else G711_RATE
            else:
                up.invalid_value(param, f"must be one of {', '.join(BETA_FORMATS)}, not {value!r}")
        elif key == "input_audio_transcription":
            _transcription(up, value, param)
        elif key == "turn_detection":
            _turn_detection(up, value, param)
        elif key == "input_audio_noise_reduction":
            _noise_reduction(up, value, param)
        elif key == "include":
            _include(up, value, param)
        elif key == "modalities":
            if value is not None:
                up.unsupported(param, "modalities do not apply to a transcription session; ignored")
        elif key == "type":
            _session_type(up, value, param)
        elif key not in TOLERATED:
            up.unknown(param)
    return up.result()


def _session_type(up: _Update, value: Any, param: str) -> None:
    if value != "transcription":
        up.invalid_value(param, f"must be 'transcription' (this endpoint), not {value!r}")


def _ga_input(up: _Update, value: Any, param: str) -> None:
    for key, setting in up.as_object(value, param).items():
        path = f"{param}.{key}"
        if key == "format":
            _ga_format(up, setting, path)
        elif key == "transcription":
            _transcription(up, setting, path)
        elif key == "turn_detection":
            _turn_detection(up, setting, path)
        elif key == "noise_reduction":
            _noise_reduction(up, setting, path)
        else:
            up.unknown(path)


def _ga_format(up: _Update, value: Any, param: str) -> None:
    fmt = up.as_object(value, param)
    kind = fmt.get("type", "audio/pcm")
    if kind not in FORMATS:
        up.invalid_value(f"{param}.type", f"must be one of {', '.join(FORMATS)}, not {kind!r}")
        return
    rate = fmt.get("rate", OPENAI_RATE if kind == "audio/pcm" else G711_RATE)
    if kind == "audio/pcm" and (problem := rate_problem(rate)) is not None:
        up.invalid_value(f"{param}.rate", f"{problem} (OpenAI uses {OPENAI_RATE})")
    elif kind != "audio/pcm" and rate != G711_RATE:
        up.invalid_value(f"{param}.rate", f"must be 8000 for {kind} (G.711), not {rate!r}")
    for key in fmt:
        if key not in ("type", "rate"):
            up.unknown(f"{param}.{key}")
    up.changes.update(format=kind, rate=rate)  # G.711: 8000, checked above


def _transcription(up: _Update, value: Any, param: str) -> None:
    if value is None:
        up.unsupported(
            param, "transcription cannot be turned off in a transcription session; kept as it was"
        )
        return
    for key, setting in up.as_object(value, param).items():
        path = f"{param}.{key}"
        if key in ("model", "language", "prompt"):
            if setting is None or isinstance(setting, str):
                up.changes[key] = setting or None  # "" means unset, as null does
            else:
                up.invalid_value(path, f"must be a string or null, not {json_type(setting)}")
        elif key in ("keywords", "languages"):
            _strings(up, key, setting, path)
        elif key == "speakers":  # an extension: speaker segments on any model
            if isinstance(setting, bool):
                up.changes["speakers"] = setting
            else:
                up.invalid_value(path, f"must be true or false, not {json_type(setting)}")
        elif key == "delay":
            if setting is None or setting in DELAYS:
                up.changes["delay"] = setting
            else:
                choices = ", ".join(repr(d) for d in DELAYS)
                up.invalid_value(path, f"must be one of {choices} or null, not {setting!r}")
        else:
            up.unknown(path)


def _strings(up: _Update, key: str, value: Any, param: str) -> None:
    """`keywords` or `languages`: an array of non-empty strings (null: none)."""
    items = [] if value is None else value
    if not isinstance(items, list) or not all(isinstance(i, str) and i.strip() for i in items):
        up.invalid_value(param, f"must be an array of non-empty strings or null, not {value!r}")
    elif len(items) > MAX_KEYWORDS:
        up.invalid_value(param, f"holds {len(items)} entries; at most {MAX_KEYWORDS}")
    else:
        up.changes[key] = tuple(dict.fromkeys(i.strip() for i in items))


def _turn_detection(up: _Update, value: Any, param: str) -> None:
    if value is None:
        up.changes["turn_detection"] = None
        return
    base = up.config.turn_detection or TurnDetection()
    values: dict[str, Any] = {f.name: getattr(base, f.name) for f in fields(TurnDetection)}
    for key, setting in up.as_object(value, param).items():
        path = f"{param}.{key}"
        if key == "type":
            if setting in TURN_TYPES:
                values["type"] = setting
            elif setting is not None:
                up.invalid_value(path, f"must be 'server_vad' or 'semantic_vad', not {setting!r}")
        elif key == "eagerness":
            if setting in EAGERNESS:
                values["eagerness"] = setting
            elif setting is not None:
                choices = ", ".join(repr(e) for e in EAGERNESS)
                up.invalid_value(path, f"must be one of {choices}, not {setting!r}")
        elif key in _TURN_LIMITS:
            problem = _turn_problem(key, setting)
            if problem:
                up.invalid_value(path, problem)
            else:
                values[key] = float(setting) if key == "threshold" else int(setting)
        elif key == "idle_timeout_ms":
            if (problem := _idle_problem(setting)) is not None:
                up.invalid_value(path, problem)
            else:
                values[key] = None if setting is None else int(setting)
        elif key in _TURN_UNSUPPORTED:
            if setting is not None and setting is not False:
                up.unsupported(path, f"{key} {_TURN_UNSUPPORTED[key]}")
        else:
            up.unknown(path)
    up.changes["turn_detection"] = TurnDetection(**values)


def _noise_reduction(up: _Update, value: Any, param: str) -> None:
    if isinstance(value, dict):
        up.unsupported(param, "noise_reduction is not supported and is ignored (it stays off)")
    elif value is not None:
        up.invalid_value(param, f"must be an object or null, not {json_type(value)}")


def _include(up: _Update, value: Any, param: str) -> None:
    """`include`: [LOGPROBS] sends each completed item's token log-probs; [] or null none."""
    if value is not None and not isinstance(value, list):
        up.invalid_value(param, f"must be an array or null, not {json_type(value)}")
        return
    for item in value or []:
        if item != LOGPROBS:
            up.invalid_value(param, f"may only hold {LOGPROBS!r}, not {item!r}")
    up.changes["logprobs"] = LOGPROBS in (value or [])


# --- what the server reports ---------------------------------------------------------------


def _turn_detection_dict(config: RealtimeConfig) -> dict[str, Any] | None:
    """As OpenAI reports it: server_vad with its VAD settings, semantic_vad with its eagerness."""
    td = config.turn_detection
    if td is None:
        return None
    idle = {} if td.idle_timeout_ms is None else {"idle_timeout_ms": td.idle_timeout_ms}
    if td.type == "semantic_vad":
        return {"type": td.type, "eagerness": td.eagerness} | idle
    return {"type": td.type, **{name: getattr(td, name) for name in _TURN_LIMITS}} | idle


def _transcription_dict(config: RealtimeConfig) -> dict[str, Any]:
    return {
        "model": config.model,
        "language": config.language,
        "prompt": config.prompt,
        "keywords": list(config.keywords) or None,
        "languages": list(config.languages) or None,
        "delay": config.delay,
    } | ({"speakers": True} if config.speakers else {})


def session_ga(config: RealtimeConfig, session_id: str) -> dict[str, Any]:
    """The GA session object (`session.created` / `.updated`). A PCM rate other than 24000 (our
    extension) is reported as it is, though the `openai` type allows only 24000 (unchecked)."""
    fmt = {"type": config.format} | ({"rate": config.rate} if config.format == "audio/pcm" else {})
    return {
        "type": "transcription",
        "id": session_id,
        "object": "realtime.transcription_session",
        "audio": {
            "input": {
                "format": fmt,
                "transcription": _transcription_dict(config),
                "turn_detection": _turn_detection_dict(config),
                "noise_reduction": None,
            }
        },
        "include": [LOGPROBS] if config.logprobs else [],
    }


def session_beta(config: RealtimeConfig, session_id: str) -> dict[str, Any]:
    """The beta transcription session object (`transcription_session.updated`).

    The beta format names carry no rate (pcm16 is 24 kHz), so none is reported.
    """
    beta_format = {fmt: name for name, fmt in BETA_FORMATS.items()}[config.format]
    return {
        "id": session_id,
        "object": "realtime.transcription_session",
        "input_audio_format": beta_format,
        "input_audio_transcription": _transcription_dict(config),
        "turn_detection": _turn_detection_dict(config),
        "input_audio_noise_reduction": None,
        "include": [LOGPROBS] if config.logprobs else [],
    }
