"""The session configuration of `/v1/audio/stream` and how `session.update` changes it.

`session.update {"session": {"model", "language", "task", "sample_rate", "encoding", "prompt",
"vad", "word_timestamps", "speakers"}}`, before the first audio. Defaults: the default model,
language detected (English for English-only models), 16000 Hz, `pcm_s16le`, the server's default
VAD, word times estimated, no speakers. `vad` is `true`/`false` or `{"threshold",
"silence_duration_ms", "prefix_padding_ms"}`. An update is applied whole or not at all
(`Rejected`). The session's options are built from it by `stream_options.audio_stream_options`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from app.service.errors import Rejected
from app.service.live import ENCODINGS, StreamingOptions, VadOptions
from app.service.live.bounds import PREROLL_S
from app.service.live.options import LiveDefaults, pcm_rate
from app.service.models.leases import SessionModels
from app.service.models.loaded import LoadedModel
from app.service.transcription.options import model_language, model_task

FIELDS = ("model", "language", "task", "sample_rate", "encoding", "prompt", "vad",
          "word_timestamps", "speakers")  # fmt: skip


@dataclass(frozen=True)
class StreamConfig:
    model: LoadedModel
    language: str | None
    task: str = "transcribe"
    sample_rate: int = 16000
    encoding: str = "pcm_s16le"
    prompt: str | None = None
    vad: VadOptions | None = None
    preroll_s: float = StreamingOptions().preroll_s
    word_timestamps: bool = False
    speakers: bool = False  # each closed segment's speakers (`transcript.speakers`)

    @classmethod
    def default(cls, model: LoadedModel, defaults: LiveDefaults) -> StreamConfig:
        return cls(model, None if model.multilingual else "en", vad=defaults.vad)

    def as_json(self, step_s: float) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "language": self.language,
            "task": self.task,
            "sample_rate": self.sample_rate,
            "encoding": self.encoding,
            "prompt": self.prompt,
            "vad": self.vad is not None,
            "word_timestamps": self.word_timestamps,
            "speakers": self.speakers,
            "step_s": step_s,
        }


def apply_update(config: StreamConfig, patch: Any, models: SessionModels) -> StreamConfig:
    """`config` with the client's `session` object applied; raises Rejected."""
    if not isinstance(patch, dict):
        raise Rejected("invalid_value", "'session' must be an object", param="session")
    unknown = set(patch) - {*FIELDS, "type", "object", "id", "step_s"}
    if unknown:
        raise Rejected(
            "unknown_parameter", f"unknown session field(s): {', '.join(sorted(unknown))}",
            param=f"session.{sorted(unknown)[0]}",
        )  # fmt: skip
    changes: dict[str, Any] = {}
    model = config.model
    language = config.language
    if patch.get("model") is not None:
        try:
            model = models.get(str(patch["model"]))
        except Rejected as e:
            raise Rejected(e.code, e.message, param="session.model", kind=e.kind) from e
        if language == "en" and "language" not in patch and model.multilingual:
            language = None
    raw = patch.get("language", language)
    language = model_language(model.name, model.multilingual, raw, param="session.language")
    changes.update(model=model, language=language)
    if "task" in patch:
        if patch["task"] not in ("transcribe", "translate"):
            raise Rejected("invalid_value", "task must be 'transcribe' or 'translate'",
                           param="session.task")  # fmt: skip
        changes["task"] = model_task(model.multilingual, patch["task"])
    if "sample_rate" in patch:
        changes["sample_rate"] = pcm_rate(patch["sample_rate"], "session.sample_rate")
    if "encoding" in patch:
        if patch["encoding"] not in ENCODINGS:
            raise Rejected("invalid_value", f"encoding must be one of {', '.join(ENCODINGS)}",
                           param="session.encoding")  # fmt: skip
        changes["encoding"] = patch["encoding"]
    if "prompt" in patch:
        prompt = patch["prompt"]
        if prompt is not None and not isinstance(prompt, str):
            raise Rejected("invalid_value", "prompt must be a string", param="session.prompt")
        changes["prompt"] = prompt or None
    for flag in ("word_timestamps", "speakers"):
        if flag in patch:
            if not isinstance(patch[flag], bool):
                raise Rejected("invalid_value", f"{flag} must be true or false",
                               param=f"session.{flag}")  # fmt: skip
            changes[flag] = patch[flag]
    if "vad" in patch:
        changes["vad"], changes["preroll_s"] = _vad_setting(
            patch["vad"], config.vad, config.preroll_s, models
        )
    return replace(config, **changes)


def _vad_setting(
    value: Any, current: VadOptions | None, preroll_s: float, models: SessionModels
) -> tuple[VadOptions | None, float]:
    """`vad` of session.update -> (options or None for off, seconds kept before speech)."""
    if value is None or value is False:
        return None, preroll_s
    if models.vad is None:
        raise Rejected(
            "vad_unavailable",
            "VAD is not available on this server (models/silero_vad.onnx is missing)",
            param="session.vad",
        )
    current = current or VadOptions()
    if value is True:
        return current, preroll_s
    if not isinstance(value, dict):
        raise Rejected("invalid_value", "vad must be true, false or an object",
                       param="session.vad")  # fmt: skip
    changes: dict[str, float] = {}
    fields = {"threshold": ("threshold", 1.0), "silence_duration_ms": ("min_silence_s", 1e-3)}
    for key, raw in value.items():
        if key == "type":
            continue
        if (
            key == "prefix_padding_ms"
            and isinstance(raw, int | float)
            and PREROLL_S.ms.problem(raw) is None
        ):
            preroll_s = float(raw) / 1000
            continue
        if key not in fields or not isinstance(raw, int | float) or isinstance(raw, bool):
            raise Rejected("invalid_value", f"bad vad field {key!r}", param=f"session.vad.{key}")
        name, scale = fields[key]
        changes[name] = float(raw) * scale
    try:
        return replace(current, **changes, neg_threshold=None), preroll_s
    except ValueError as e:
        raise Rejected("invalid_value", str(e), param="session.vad") from e
