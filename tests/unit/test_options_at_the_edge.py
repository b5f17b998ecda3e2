"""Request options are built once, at the edge that took the request, with one language rule,
one rate bound and one default VAD for every protocol; refusals are one error (`Rejected`) that
the REST adapter maps to its status once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import UploadFile

from app.api.errors import to_api_error
from app.api.forms import AudioForm
from app.api.live.audio_stream_config import StreamConfig, apply_update
from app.api.live.realtime_config import DELAYS, RealtimeConfig, TurnDetection, apply_ga
from app.api.live.stream_options import (
    audio_stream_options,
    live_defaults,
    realtime_default,
    realtime_options,
    wyoming_options,
    wyoming_sensitivity,
)
from app.config import Settings
from app.service.errors import Rejected
from app.service.live import FramedPcm, PcmInput, VadOptions
from app.service.live.bounds import EDGE_S, STEP_S
from app.service.live.options import LiveDefaults, pcm_rate
from app.service.live.turns import CANDIDATE_SILENCE_S, TurnRules
from app.service.models.options import DownloadsDisabledError
from app.service.pool import PoolClosedError, QueueFullError
from app.service.transcription.jobs import ModelUnavailableError, UnknownModelError
from app.service.transcription.options import TranscriptionOptions


@dataclass
class _Model:
    """What the options builders read of a loaded model."""

    name: str = "base"
    multilingual: bool = True
    vad_available: bool = True
    base_options: TranscriptionOptions = field(default_factory=TranscriptionOptions)


class _Registry:
    """What `apply_update` asks of the session's models."""

    def __init__(self, model: _Model) -> None:
        self.model, self.vad = model, object()

    def get(self, name: str | None) -> _Model:
        if name not in (None, self.model.name):
            raise UnknownModelError(str(name), [self.model.name])
        return self.model


def _defaults(vad_installed: bool = True, vad_filter: bool = True) -> LiveDefaults:
    settings = Settings(models=["base"], vad_filter=vad_filter)
    return live_defaults(settings, TranscriptionOptions(), vad_installed, vad_installed)


def _form(**fields: Any) -> AudioForm:
    return AudioForm(file=UploadFile(file=None), **fields)  # type: ignore[arg-type]


def _language_on_every_path(model: _Model, language: str) -> dict[str, str | None]:
    """The language each protocol's options run in when the client names `language`."""
    defaults = _defaults()
    rest = _form().options(model, task="transcribe", language=language)  # type: ignore[arg-type]
    realtime = realtime_options(RealtimeConfig(language=language), model, defaults)  # type: ignore[arg-type]
    config = apply_update(StreamConfig(model, None), {"language": language}, _Registry(model))  # type: ignore[arg-type]
    stream, job = wyoming_options(model, language, defaults, None)  # type: ignore[arg-type]
    return {
        "rest": rest.language,
        "realtime": realtime.language,
        "audio_stream": audio_stream_options(config, defaults).language,
        "wyoming": stream.language,
        "wyoming_transcript": job.options.language,
    }


@pytest.mark.parametrize(
    ("name", "code"),
    [("mandarin", "zh"), ("Mandarin", "zh"), (" ZH ", "zh"), ("castilian", "es"),
     ("English", "en"), ("valencian", "ca"), ("cantonese", "yue")],
)  # fmt: skip
def test_every_name_the_engine_knows_is_accepted_on_every_path(name: str, code: str) -> None:
    paths = _language_on_every_path(_Model(), name)
    assert paths == dict.fromkeys(paths, code)


@pytest.mark.parametrize(
    ("model", "language", "says"),
    [
        (_Model(), "klingon", "Unsupported language 'klingon'"),
        (_Model("tiny.en", multilingual=False), "mandarin", "English-only; it cannot transcribe "
         "language 'zh'"),
    ],
)  # fmt: skip
def test_a_language_the_model_cannot_run_is_refused_alike_on_every_path(
    model: _Model, language: str, says: str
) -> None:
    defaults = _defaults()
    builders = [
        lambda: _form().options(model, task="transcribe", language=language),
        lambda: realtime_options(RealtimeConfig(language=language), model, defaults),
        lambda: apply_update(StreamConfig(model, None), {"language": language}, _Registry(model)),
        lambda: wyoming_options(model, language, defaults, None),
    ]
    for build in builders:
        with pytest.raises(Rejected) as info:
            build()  # type: ignore[no-untyped-call]
        assert info.value.code == "unsupported_language" and info.value.kind == "invalid_request"
        assert says in info.value.message and info.value.param.endswith("language")


RATES = [7999, 8000, 16000, 24000, 48000, 192000, 192001, 16000.0, True, "16000"]


def _accepts(make: Any, rate: Any) -> bool:
    try:
        make(rate)
    except (ValueError, Rejected):
        return False
    return True


def _realtime_rate(rate: Any) -> None:
    """A Realtime `session.update` setting the PCM rate; ValueError when it is refused."""
    _, errors = apply_ga(RealtimeConfig(), {"audio": {"input": {"format": {"rate": rate}}}})
    if errors:
        raise ValueError(errors[0].message)


def test_the_rate_bound_is_the_same_for_every_path() -> None:
    """8000..192000 whole Hz, no matter which protocol's configuration carries the rate."""
    english = _Model("tiny.en", multilingual=False)
    paths = {
        "bound": lambda r: pcm_rate(r, "rate"),
        "realtime_config": lambda r: RealtimeConfig(rate=r),
        "realtime_update": _realtime_rate,
        "audio_stream": lambda r: apply_update(
            StreamConfig(english, "en"),  # type: ignore[arg-type]
            {"sample_rate": r},
            _Registry(english),  # type: ignore[arg-type]
        ),
        "pcm": lambda r: PcmInput("pcm_s16le", r),
        "wyoming": lambda r: FramedPcm(r, 2, 1),
    }
    expected = [False, True, True, True, True, True, False, False, False, False]
    for name, make in paths.items():
        accepted = [_accepts(make, rate) for rate in RATES]
        assert accepted == expected, name


def test_an_out_of_range_rate_is_refused_with_one_message() -> None:
    with pytest.raises(Rejected) as info:
        apply_update(StreamConfig(_Model(), None), {"sample_rate": 4000}, _Registry(_Model()))  # type: ignore[arg-type]
    assert info.value.param == "session.sample_rate"
    assert info.value.message == "session.sample_rate must be between 8000 and 192000 Hz, not 4000"
    _, errors = apply_ga(RealtimeConfig(), {"audio": {"input": {"format": {"rate": 4000}}}})
    assert "must be between 8000 and 192000 Hz, not 4000" in errors[0].message
    with pytest.raises(ValueError, match="must be between 8000 and 192000 Hz, not 4000"):
        FramedPcm(4000, 2, 1)


@pytest.mark.parametrize(("installed", "wanted"), [(True, True), (True, False), (False, True)])
def test_the_default_vad_is_decided_once_for_every_protocol(installed: bool, wanted: bool) -> None:
    defaults = _defaults(vad_installed=installed, vad_filter=wanted)
    default_vad = VadOptions() if installed and wanted else None
    assert defaults.vad == default_vad
    model = _Model()
    client_turns = RealtimeConfig(turn_detection=None)  # the client commits: VAD only skips silence
    assert realtime_options(client_turns, model, defaults).vad == default_vad  # type: ignore[arg-type]
    assert audio_stream_options(StreamConfig.default(model, defaults), defaults).vad == default_vad  # type: ignore[arg-type]
    assert wyoming_options(model, None, defaults, None)[0].vad == default_vad  # type: ignore[arg-type]
    # server VAD cuts Realtime turns whenever the model is installed, whatever STT_VAD_FILTER says
    server_turns = realtime_options(realtime_default(defaults), model, defaults)  # type: ignore[arg-type]
    assert (server_turns.vad is not None) == installed


@pytest.mark.parametrize(
    ("sensitivity", "eagerness", "silence_s"),
    [("relaxed", "low", 1.25), ("default", "auto", 0.7), ("aggressive", "high", 0.25)],
)
def test_wyoming_ends_a_command_by_its_vad_sensitivity(sensitivity, eagerness, silence_s) -> None:
    """With the turn model the command ends as Realtime's semantic_vad of the same eagerness
    ends a turn; without it, at Home Assistant's own VAD's silence for that sensitivity."""
    model = _Model()
    with_turns = _defaults()
    options = wyoming_options(model, None, with_turns, sensitivity)[0]  # type: ignore[arg-type]
    semantic_vad = TurnDetection(type="semantic_vad", eagerness=eagerness)
    semantic = realtime_options(RealtimeConfig(turn_detection=semantic_vad), model, with_turns)  # type: ignore[arg-type]
    assert options.turn == semantic.turn == TurnRules.of(eagerness)
    assert options.vad == VadOptions(min_silence_s=CANDIDATE_SILENCE_S)
    settings = Settings(models=["base"])
    no_turns = live_defaults(settings, TranscriptionOptions(), True, False)
    options = wyoming_options(model, None, no_turns, sensitivity)[0]  # type: ignore[arg-type]
    assert options.turn is None and options.vad == VadOptions(min_silence_s=silence_s)
    assert wyoming_sensitivity(sensitivity) == sensitivity


def test_wyoming_without_endpointing_or_vad_leaves_the_end_to_the_client() -> None:
    model = _Model()
    assert wyoming_options(model, None, _defaults(), None)[0].turn is None  # type: ignore[arg-type]
    no_vad = _defaults(vad_installed=False)
    assert wyoming_options(model, None, no_vad, "default")[0].vad is None  # type: ignore[arg-type]
    assert wyoming_sensitivity(None) == "default"
    with pytest.raises(Rejected) as info:
        wyoming_sensitivity("sleepy")
    assert info.value.code == "invalid_vad_sensitivity"
    assert "relaxed, default, aggressive" in info.value.message


def test_the_form_builds_the_options_the_model_can_run() -> None:
    english = _Model("tiny.en", multilingual=False)
    translate = _form().options(english, task="translate", language=None)  # type: ignore[arg-type]
    assert (translate.task, translate.language) == ("transcribe", "en")
    streamed = _form(stream=True).options(_Model(), task="transcribe", language=None)  # type: ignore[arg-type]
    assert streamed.beam_size is None  # greedy: text is released as soon as a segment closes
    tuned = _form(stream=True, beam_size=4, temperature=0.3, hotwords="  Ada ", prompt="Hi")
    options = tuned.options(_Model(), task="translate", language="de")  # type: ignore[arg-type]
    assert (options.beam_size, options.temperature, options.hotwords) == (4, (0.3,), "Ada")
    assert (options.task, options.language, options.initial_prompt) == ("translate", "de", "Hi")
    with pytest.raises(Rejected) as info:
        _form(vad_filter=True).options(
            _Model(vad_available=False), task="transcribe", language=None
        )  # type: ignore[arg-type]
    assert (info.value.code, info.value.param) == ("vad_unavailable", "vad_filter")


@pytest.mark.parametrize(
    ("error", "status", "type_", "code", "param", "retry_after"),
    [
        (Rejected("invalid_value", "bad"), 400, "invalid_request_error", "invalid_value", None,
         None),
        (DownloadsDisabledError("off"), 403, "invalid_request_error", "model_downloads_disabled",
         "model", None),
        (UnknownModelError("x", ["tiny.en"]), 404, "invalid_request_error", "model_not_found",
         "model", None),
        (ModelUnavailableError("x", "going", "model_unloading"), 409, "invalid_request_error",
         "model_unloading", "model", "5"),
        (Rejected("session_too_long", "long", kind="limit"), 413, "invalid_request_error",
         "session_too_long", None, None),
        (QueueFullError("full", 3), 429, "rate_limit_error", "queue_full", None, "3"),
        (ModelUnavailableError("x", "loading", "model_loading", 7), 503, "server_error",
         "model_loading", "model", "7"),
        (PoolClosedError("closing"), 503, "server_error", "shutting_down", None, None),
    ],
)  # fmt: skip
def test_a_rejection_leaves_rest_with_the_status_of_its_kind(
    error: Rejected, status: int, type_: str, code: str, param: str | None, retry_after: str | None
) -> None:
    api = to_api_error(error)
    assert (api.status_code, api.type, api.code, api.param) == (status, type_, code, param)
    assert api.message == error.message == str(error)
    assert (api.headers or {}).get("Retry-After") == retry_after


def test_keywords_join_the_hotwords_and_languages_narrow_detection() -> None:
    model = _Model()
    both = _form(hotwords=" Ada", keywords=(" Lovelace ", "", "Babbage")).options(
        model, task="transcribe", language=None
    )  # type: ignore[arg-type]
    assert both.hotwords == "Ada, Lovelace, Babbage"
    assert (
        _form(keywords=("Ada",)).options(model, task="transcribe", language=None).hotwords == "Ada"
    )  # type: ignore[arg-type]
    narrowed = _form(languages=("German", "fr", "de")).options(
        model, task="transcribe", language=None
    )  # type: ignore[arg-type]
    assert (narrowed.language, narrowed.languages) == (None, ("de", "fr"))
    one = _form(languages=("fr",)).options(model, task="transcribe", language=None)  # type: ignore[arg-type]
    assert (one.language, one.languages) == ("fr", ())
    named = _form(languages=("de", "fr")).options(model, task="transcribe", language="en")  # type: ignore[arg-type]
    assert (named.language, named.languages) == ("en", ())  # the language named wins
    for bad, on in (
        (("de", "klingon"), model),
        (("en", "de"), _Model("tiny.en", multilingual=False)),
    ):
        with pytest.raises(Rejected) as info:
            _form(languages=bad).options(on, task="transcribe", language=None)  # type: ignore[arg-type]
        assert (info.value.code, info.value.param) == ("unsupported_language", "languages[]")


def test_realtime_keywords_languages_delay_and_logprobs_become_the_sessions_options() -> None:
    model, defaults = _Model(), _defaults()

    def options(**config: Any) -> Any:
        return realtime_options(RealtimeConfig(**config), model, defaults)  # type: ignore[arg-type]

    assert options(keywords=("Ada", "Lovelace"), prompt="Notes on the engine.").prompt == (
        "Ada, Lovelace Notes on the engine."
    )  # the keywords lead, as REST's lead every window's prompt
    assert options(keywords=("Ada",)).prompt == "Ada" and options().prompt is None
    narrowed = options(languages=("German", "fr", "de"))
    assert (narrowed.language, narrowed.languages) == (None, ("de", "fr"))
    assert (options(languages=("fr",)).language, options(languages=("fr",)).languages) == (
        "fr",
        (),
    )
    named = options(language="en", languages=("de", "fr"))
    assert (named.language, named.languages) == ("en", ())  # the language named wins
    for bad, on in (
        (("de", "klingon"), model),
        (("en", "de"), _Model("tiny.en", multilingual=False)),
    ):
        with pytest.raises(Rejected) as info:
            realtime_options(RealtimeConfig(languages=bad), on, defaults)  # type: ignore[arg-type]
        assert info.value.code == "unsupported_language"
        assert info.value.param == "session.audio.input.transcription.languages"
    server = options()
    assert (server.step_s, server.edge_s) == (defaults.step_s, defaults.edge_s)
    paces = [(o.step_s, o.edge_s) for d in DELAYS for o in [options(delay=d)]]
    assert paces[DELAYS.index("medium")] == (STEP_S.default, EDGE_S.default)  # shipped defaults
    assert paces == sorted(paces) and len(set(paces)) == len(DELAYS)  # later text, surer text
    assert options(logprobs=True).word_timestamps and not options().word_timestamps
