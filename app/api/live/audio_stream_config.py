"""The session configuration of `/v1/audio/stream` and how `session.update` changes it.

`session.update {"session": {"model", "language", "task", "sample_rate", "encoding", "prompt",
"vad", "word_timestamps"}}`, before the first audio. Defaults: the default model, language
detected (English for English-only models), 16000 Hz, `pcm_s16le`, VAD as `STT_VAD_FILTER`, word
times estimated. `vad` is `true`/`false` or `{"threshold", "silence_duration_ms",
"prefix_padding_ms"}`. An update is applied whole or not at all (`LiveError`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from app.api.live.connection import LiveError
from app.config import Settings
from app.service.jobs import model_language
from app.service.live import ENCODINGS, StreamingOptions, VadOptions
from app.service.model_leases import SessionModels
from app.service.registry import InvalidRequestError, LoadedModel, UnknownModelError

FIELDS = ("model", "language", "task", "sample_rate", "encoding", "prompt", "vad",
          "word_timestamps")  # fmt: skip


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

    @classmethod
    def default(cls, registry: SessionModels, settings: Settings) -> StreamConfig:
        model = registry.get(None)
        vad = VadOptions() if registry.vad is not None and settings.vad_filter else None
        return cls(model, None if model.multilingual else "en", vad=vad)

    def session_fields(self) -> dict[str, Any]:
        """This session's own `StreamingOptions` fields (the server adds its live settings)."""
        return {
            "language": self.language,
            "task": self.task,
            "vad": self.vad,
            "preroll_s": self.preroll_s,
            "prompt": self.prompt,
            "word_timestamps": self.word_timestamps,
        }

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
            "step_s": step_s,
        }


def apply_update(config: StreamConfig, patch: Any, registry: SessionModels) -> StreamConfig:
    """`config` with the client's `session` object applied; raises LiveError."""
    if not isinstance(patch, dict):
        raise LiveError("'session' must be an object", "invalid_value", param="session")
    unknown = set(patch) - {*FIELDS, "type", "object", "id", "step_s"}
    if unknown:
        raise LiveError(
            f"unknown session field(s): {', '.join(sorted(unknown))}", "unknown_parameter",
            param=f"session.{sorted(unknown)[0]}",
        )  # fmt: skip
    changes: dict[str, Any] = {}
    model = config.model
    language = config.language
    if patch.get("model") is not None:
        try:
            model = registry.get(str(patch["model"]))
        except UnknownModelError as e:
            raise LiveError(str(e), "model_not_found", param="session.model") from e
        if language == "en" and "language" not in patch and model.multilingual:
            language = None
    raw = patch.get("language", language)
    try:
        language = model_language(model.name, model.multilingual, raw)
    except (InvalidRequestError, AttributeError) as e:  # AttributeError: not a string
        message = str(e) if isinstance(e, InvalidRequestError) else f"unsupported language {raw!r}"
        raise LiveError(message, "unsupported_language", param="session.language") from e
    changes.update(model=model, language=language)
    if "task" in patch:
        if patch["task"] not in ("transcribe", "translate"):
            raise LiveError("task must be 'transcribe' or 'translate'", "invalid_value",
                            param="session.task")  # fmt: skip
        changes["task"] = patch["task"] if model.multilingual else "transcribe"
    if "sample_rate" in patch:
        rate = patch["sample_rate"]
        if not isinstance(rate, int) or isinstance(rate, bool) or not 8000 <= rate <= 192000:
            raise LiveError("sample_rate must be an integer from 8000 to 192000 (Hz)",
                            "invalid_value", param="session.sample_rate")  # fmt: skip
        changes["sample_rate"] = rate
    if "encoding" in patch:
        if patch["encoding"] not in ENCODINGS:
            raise LiveError(f"encoding must be one of {', '.join(ENCODINGS)}", "invalid_value",
                            param="session.encoding")  # fmt: skip
        changes["encoding"] = patch["encoding"]
    if "prompt" in patch:
        prompt = patch["prompt"]
        if prompt is not None and not isinstance(prompt, str):
            raise LiveError("prompt must be a string", "invalid_value", param="session.prompt")
        changes["prompt"] = prompt or None
    if "word_timestamps" in patch:
        if not isinstance(patch["word_timestamps"], bool):
            raise LiveError("word_timestamps must be true or false", "invalid_value",
                            param="session.word_timestamps")  # fmt: skip
        changes["word_timestamps"] = patch["word_timestamps"]
    if "vad" in patch:
        changes["vad"], changes["preroll_s"] = _vad_setting(
            patch["vad"], config.vad, config.preroll_s, registry
        )
    return replace(config, **changes)


def _vad_setting(
    value: Any, current: VadOptions | None, preroll_s: float, registry: SessionModels
) -> tuple[VadOptions | None, float]:
    """`vad` of session.update -> (options or None for off, seconds kept before speech)."""
    if value is None or value is False:
        return None, preroll_s
    if registry.vad is None:
        raise LiveError(
            "VAD is not available on this server (models/silero_vad.onnx is missing)",
            "vad_unavailable", param="session.vad",
        )  # fmt: skip
    current = current or VadOptions()
    if value is True:
        return current, preroll_s
    if not isinstance(value, dict):
        raise LiveError("vad must be true, false or an object", "invalid_value",
                        param="session.vad")  # fmt: skip
    changes: dict[str, float] = {}
    fields = {"threshold": ("threshold", 1.0), "silence_duration_ms": ("min_silence_s", 1e-3)}
    for key, raw in value.items():
        if key == "type":
            continue
        if key == "prefix_padding_ms" and isinstance(raw, int | float) and 0 <= raw <= 2000:
            preroll_s = float(raw) / 1000
            continue
        if key not in fields or not isinstance(raw, int | float) or isinstance(raw, bool):
            raise LiveError(f"bad vad field {key!r}", "invalid_value", param=f"session.vad.{key}")
        name, scale = fields[key]
        changes[name] = float(raw) * scale
    try:
        return replace(current, **changes, neg_threshold=None), preroll_s
    except ValueError as e:
        raise LiveError(str(e), "invalid_value", param="session.vad") from e
