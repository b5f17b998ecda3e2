"""app.api.live: the Realtime transcription protocol's events and session settings.

Checked against the `openai` package itself: every server event validates as its `openai` type
and is told apart by the SDK's own parser; client events are what the SDK's connection puts on
the socket (a fake one here); session updates apply as the module doc of `realtime_config` says.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from openai._models import construct_type_unchecked
from openai.resources.beta.realtime.realtime import RealtimeConnection as BetaConnection
from openai.resources.realtime.realtime import RealtimeConnection
from openai.types import realtime as ga_types
from openai.types.beta import realtime as beta_types
from openai.types.beta.realtime.transcription_session import ClientSecret, TranscriptionSession
from pydantic import BaseModel, TypeAdapter, ValidationError

from app.api.live import realtime_events as ev
from app.api.live.realtime_config import (
    LOGPROBS,
    RealtimeConfig,
    TurnDetection,
    apply_beta,
    apply_ga,
    session_beta,
    session_ga,
)
from app.api.live.realtime_events import ProtocolError, parse_client_event
from app.api.schemas import LanguageJSON, LogprobJSON

ITEM, PREV = "item_AAAAAAAAAAAAAAAAAAAAAA", "item_BBBBBBBBBBBBBBBBBBBBBB"


class WsTranscriptionSession(TranscriptionSession):
    """The beta type requires `client_secret`, which (its doc says) a session updated over the
    WebSocket does not have; everything else is checked as the SDK declares it."""

    client_secret: ClientSecret | None = None


class WsTranscriptionSessionUpdated(beta_types.TranscriptionSessionUpdatedEvent):
    session: WsTranscriptionSession


def _extras(model: Any, path: str = "") -> list[str]:
    """Keys of `model` (a validated openai model) that its type does not declare."""
    if isinstance(model, list):
        return [x for i, item in enumerate(model) for x in _extras(item, f"{path}[{i}]")]
    if not isinstance(model, BaseModel):
        return []
    found = [f"{path}.{key}" for key in model.model_extra or {}]
    for name in type(model).model_fields:
        found += _extras(getattr(model, name), f"{path}.{name}")
    return found


# --- server events -----------------------------------------------------------------------

GA_SESSION = session_ga(RealtimeConfig(), "sess_1")
BETA_SESSION = session_beta(RealtimeConfig(), "sess_1")
TRANSCRIPTION = "ConversationItemInputAudioTranscription"
USER_ITEM = ev.UserAudioItem(id=ITEM)
# (our event, its type in openai.types.realtime, in openai.types.beta.realtime: True = same name)
SERVER_EVENTS: list[tuple[BaseModel, str | None, str | bool]] = [
    (ev.SessionCreated(session=GA_SESSION), "SessionCreatedEvent", False),
    (ev.SessionUpdated(session=GA_SESSION), "SessionUpdatedEvent", False),
    (ev.TranscriptionSessionUpdated(session=BETA_SESSION), None, False),
    (ev.SpeechStarted(audio_start_ms=12, item_id=ITEM), "InputAudioBufferSpeechStartedEvent", True),
    (ev.SpeechStopped(audio_end_ms=3400, item_id=ITEM), "InputAudioBufferSpeechStoppedEvent", True),
    (ev.Committed(item_id=ITEM, previous_item_id=PREV), "InputAudioBufferCommittedEvent", True),
    (ev.Committed(item_id=ITEM), "InputAudioBufferCommittedEvent", False),
    (ev.Cleared(), "InputAudioBufferClearedEvent", True),
    (ev.ItemAdded(item=USER_ITEM, previous_item_id=PREV), "ConversationItemAdded", False),
    (ev.ItemCreated(item=USER_ITEM), "ConversationItemCreatedEvent", True),
    (ev.TranscriptionDelta(item_id=ITEM, delta=" Hello"), f"{TRANSCRIPTION}DeltaEvent", True),
    (
        ev.TranscriptionCompleted(item_id=ITEM, transcript="Hi", usage=ev.DurationUsage(seconds=2)),
        f"{TRANSCRIPTION}CompletedEvent",
        False,
    ),
    (
        ev.TranscriptionCompleted(
            item_id=ITEM, transcript="Hi", usage=ev.DurationUsage(seconds=2),
            languages=[LanguageJSON(code="en")],
            logprobs=[LogprobJSON(token=" Hi", logprob=-0.01, bytes=[32, 72, 105])],
        ),
        f"{TRANSCRIPTION}CompletedEvent",
        False,
    ),
    (
        ev.TimeoutTriggered(audio_start_ms=800, audio_end_ms=6800, item_id=ITEM),
        "InputAudioBufferTimeoutTriggered",
        False,
    ),
    (
        ev.TranscriptionFailed(item_id=ITEM, error=ev.TranscriptionError(message="no audio")),
        f"{TRANSCRIPTION}FailedEvent",
        True,
    ),
    (ev.ErrorEvent(error=ev.ErrorDetail(message="bad")), "RealtimeErrorEvent", "ErrorEvent"),
    (ProtocolError("bad", "unknown_event", "type", "evt_1").event(), "RealtimeErrorEvent", False),
]  # fmt: skip
IDS = [str(event.type) for event, _, _ in SERVER_EVENTS]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("event", "ga", "beta"), SERVER_EVENTS, ids=IDS)
def test_server_event_validates_as_the_openai_type(
    event: BaseModel, ga: str | None, beta: str | bool
) -> None:
    wire = json.loads(event.model_dump_json())
    assert wire == event.model_dump()
    types = [getattr(ga_types, ga)] if ga else [WsTranscriptionSessionUpdated]
    if beta:
        types.append(getattr(beta_types, ga if beta is True else beta))
    for openai_type in types:
        extras = _extras(openai_type.model_validate(wire))
        if ga in ("SessionCreatedEvent", "SessionUpdatedEvent"):  # a create *request* type
            assert extras == [".session.id", ".session.object"]
        elif ga:  # (the beta session object is checked below)
            assert extras == [], openai_type
    # and the SDK's own parser (no validation, a discriminated union) tells it apart
    union = ga_types.RealtimeServerEvent if ga else beta_types.RealtimeServerEvent
    parsed = construct_type_unchecked(value=wire, type_=union)  # type: ignore[arg-type]
    assert type(parsed) is (types[0] if ga else beta_types.TranscriptionSessionUpdatedEvent)
    assert type(TypeAdapter(ev.ServerEvent).validate_python(wire)) is type(event)


def test_ids() -> None:
    events = {ev.SpeechStarted(audio_start_ms=0, item_id=ITEM).event_id for _ in range(50)}
    assert len(events) == 50
    assert all(re.fullmatch(r"event_[A-Za-z0-9]{22}", e) for e in events)
    assert re.fullmatch(r"event_[A-Za-z0-9]{22}", ev.new_event_id())
    assert re.fullmatch(r"item_[A-Za-z0-9]{22}", ev.new_item_id())
    assert re.fullmatch(r"sess_[A-Za-z0-9]{22}", ev.new_session_id())
    assert ev.new_item_id() != ev.new_item_id()


# --- session objects ----------------------------------------------------------------------

CONFIGS = [
    RealtimeConfig(),
    RealtimeConfig(model="whisper-1", language="en", prompt="Names: Ada.", turn_detection=None),
    RealtimeConfig(format="audio/pcmu"),
    RealtimeConfig(format="audio/pcma", turn_detection=TurnDetection(0.7, 100, 1000)),
    RealtimeConfig(keywords=("Ada", "Lovelace"), languages=("de", "fr"), delay="high",
                   logprobs=True, turn_detection=TurnDetection(idle_timeout_ms=6000)),
]  # fmt: skip


@pytest.mark.parametrize("config", CONFIGS)
def test_session_objects_validate_and_echo_back(config: RealtimeConfig) -> None:
    ga = session_ga(config, "sess_1")
    parsed = ga_types.RealtimeTranscriptionSessionCreateResponse.model_validate(ga)
    # the SDK's session types have idle_timeout_ms only on the update's input side
    idle = config.turn_detection is not None and config.turn_detection.idle_timeout_ms
    assert _extras(parsed) == ([".audio.input.turn_detection.idle_timeout_ms"] if idle else [])
    assert parsed.audio and parsed.audio.input and parsed.audio.input.format
    assert parsed.audio.input.format.type == config.format
    assert ga["audio"]["input"]["format"].get("rate") == (24000 if config.rate == 24000 else None)
    beta = session_beta(config, "sess_1")
    parsed_beta = WsTranscriptionSession.model_validate(beta)
    names = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}
    assert parsed_beta.input_audio_format == names[config.format]
    assert (parsed_beta.turn_detection is None) == (config.turn_detection is None)
    # a client may send back what it was told: nothing changes and nothing is reported
    assert apply_ga(config, ga) == (config, [])
    assert apply_beta(config, beta) == (config, [])


@pytest.mark.parametrize("apply", [apply_ga, apply_beta])
def test_semantic_vad_is_taken_with_its_eagerness_and_reported_as_openai_does(apply: Any) -> None:
    turns = {"type": "semantic_vad", "eagerness": "low"}
    session = nest(TD, turns) if apply is apply_ga else {"turn_detection": turns}
    config, errors = apply(TUNED, session)
    assert errors == []
    assert config.turn_detection == TurnDetection(0.6, 200, 800, "semantic_vad", "low")
    ga = session_ga(config, "sess_1")
    assert ga["audio"]["input"]["turn_detection"] == turns
    # the SDK's transcription session type knows server_vad's fields only (its input type has
    # semantic_vad's eagerness): it parses, eagerness as an extra
    parsed = ga_types.RealtimeTranscriptionSessionCreateResponse.model_validate(ga)
    assert parsed.audio and parsed.audio.input and parsed.audio.input.turn_detection
    assert parsed.audio.input.turn_detection.type == "semantic_vad"
    assert apply_ga(config, ga) == (config, [])  # echoed back: nothing changes
    back, _ = apply(config, nest(TD, {"type": "server_vad"}) if apply is apply_ga
                    else {"turn_detection": {"type": "server_vad"}})  # fmt: skip
    # its VAD settings were kept
    assert back.turn_detection == TurnDetection(0.6, 200, 800, "server_vad", "low")


def test_an_unknown_eagerness_is_an_invalid_value() -> None:
    config, (error,) = apply_ga(TUNED, nest(TD, {"type": "semantic_vad", "eagerness": "eager"}))
    assert config == TUNED and error.code == "invalid_value"
    assert error.param == f"session.{TD}.eagerness" and "'low', 'medium'" in error.message


def test_ga_session_reports_our_rate_extension() -> None:
    ga = session_ga(RealtimeConfig(rate=16000), "sess_1")
    assert ga["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}
    with pytest.raises(ValidationError, match=r"AudioPCM\.rate\n  Input should be 24000"):
        ga_types.RealtimeTranscriptionSessionCreateResponse.model_validate(ga)  # OpenAI: 24000
    event = json.loads(ev.SessionUpdated(session=ga).model_dump_json())
    parsed = construct_type_unchecked(value=event, type_=ga_types.RealtimeServerEvent)  # type: ignore[arg-type]
    assert parsed.session.audio.input.format.rate == 16000  # what the SDK hands the client


# --- client events ------------------------------------------------------------------------


class FakeSocket:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, data: str) -> None:
        self.sent.append(json.loads(data))

    def close(self, *args: Any, **kwargs: Any) -> None:
        pass


SDK_SESSION: dict[str, Any] = {
    "type": "transcription",
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "transcription": {"model": "whisper-1", "language": "en", "prompt": "Ada"},
            "turn_detection": {"type": "server_vad", "threshold": 0.6, "silence_duration_ms": 800},
            "noise_reduction": None,
        }
    },
    "include": [],
}


def test_what_the_sdk_sends_parses() -> None:
    socket, beta_socket = FakeSocket(), FakeSocket()
    connection = RealtimeConnection(socket)  # type: ignore[arg-type]
    connection.session.update(session=SDK_SESSION, event_id="evt_1")  # type: ignore[arg-type]
    connection.input_audio_buffer.append(audio="AAAAAA==")
    connection.input_audio_buffer.commit()
    connection.input_audio_buffer.clear(event_id="evt_2")
    BetaConnection(beta_socket).transcription_session.update(  # type: ignore[arg-type]
        session={"input_audio_format": "g711_ulaw", "input_audio_transcription": {"model": "x"}}
    )
    update, append, commit, clear, beta_update = (
        parse_client_event(e) for e in socket.sent + beta_socket.sent
    )
    assert update == ev.SessionUpdate(session=SDK_SESSION, event_id="evt_1")
    assert append == ev.AudioAppend(audio="AAAAAA==")
    assert (commit, clear) == (ev.AudioCommit(), ev.AudioClear(event_id="evt_2"))
    assert isinstance(beta_update, ev.TranscriptionSessionUpdate)
    expected = TurnDetection(threshold=0.6, silence_duration_ms=800)
    assert apply_ga(RealtimeConfig(), update.session) == (  # type: ignore[union-attr]
        RealtimeConfig(model="whisper-1", language="en", prompt="Ada", turn_detection=expected),
        [],
    )
    config, errors = apply_beta(RealtimeConfig(), beta_update.session)
    assert (config.format, config.rate, config.encoding, config.model, errors) == (
        *("audio/pcmu", 8000, "g711_ulaw", "x"),
        [],
    )


def test_base64_is_left_to_the_caller() -> None:
    event = parse_client_event({"type": "input_audio_buffer.append", "audio": "not base64!"})
    assert event == ev.AudioAppend(audio="not base64!")
    assert parse_client_event({"type": "input_audio_buffer.commit", "x": 1}) == ev.AudioCommit()


@pytest.mark.parametrize(
    ("message", "code", "param"),
    [
        ({"type": "response.create"}, "unknown_event", "type"),
        ({"type": "session.created", "event_id": "evt_9"}, "unknown_event", "type"),
        ({}, "invalid_value", "type"),
        ({"type": 5}, "invalid_value", "type"),
        ({"type": "input_audio_buffer.append", "event_id": "evt_7"}, "invalid_value", "audio"),
        ({"type": "input_audio_buffer.append", "audio": 5}, "invalid_value", "audio"),
        ({"type": "input_audio_buffer.append", "audio": None}, "invalid_value", "audio"),
        ({"type": "session.update"}, "invalid_value", "session"),
        ({"type": "session.update", "session": "x"}, "invalid_value", "session"),
        ({"type": "transcription_session.update", "session": []}, "invalid_value", "session"),
        ({"type": "input_audio_buffer.commit", "event_id": 5}, "invalid_value", "event_id"),
        (["input_audio_buffer.commit"], "invalid_value", None),
    ],
)
def test_bad_client_events(message: Any, code: str, param: str | None) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_client_event(message)
    error = caught.value
    assert (error.code, error.param) == (code, param)
    if code == "unknown_event":
        assert "input_audio_buffer.append" in error.message  # the accepted types are listed
    wire = json.loads(error.event().model_dump_json())
    assert ga_types.RealtimeErrorEvent.model_validate(wire).error.code == code
    sent_id = message.get("event_id") if isinstance(message, dict) else None
    assert wire["error"]["event_id"] == (sent_id if isinstance(sent_id, str) else None)


# --- session updates ----------------------------------------------------------------------

IN = "audio.input."  # GA settings live under session.audio.input
TD = "audio.input.turn_detection"
TUNED = RealtimeConfig(language="de", prompt="Ada", turn_detection=TurnDetection(0.6, 200, 800))


def nest(path: str, value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """`base` (copied) with `value` set at the dotted `path`."""
    session = copy.deepcopy(base or {})
    *parents, leaf = path.split(".")
    node = session
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return session


def row(apply: Any, path: str, value: Any, *more: Any, at: str = "") -> Any:
    """A table row; its error `param` is "session." + path + at."""
    return pytest.param(apply, nest(path, value), *more, f"session.{path}{at}", id=path)


@pytest.mark.parametrize(
    ("apply", "path", "value", "expected"),
    [
        (apply_ga, "type", "transcription", {}),
        (apply_ga, f"{IN}transcription", {"language": "en"}, {"language": "en"}),
        (apply_ga, f"{IN}transcription", {"language": None}, {"language": None}),
        (apply_ga, f"{IN}transcription", {"prompt": ""}, {"prompt": None}),
        (apply_ga, TD, None, {"turn_detection": None}),
        (apply_ga, TD, {"silence_duration_ms": 300}, {"turn_detection": (0.6, 200, 300)}),
        (apply_ga, TD, {"type": "server_vad", "threshold": 1}, {"turn_detection": (1.0, 200, 800)}),
        (apply_ga, f"{IN}format", {"type": "audio/pcmu"}, {"format": "audio/pcmu"}),
        (apply_ga, f"{IN}format", {"type": "audio/pcma", "rate": 8000}, {"format": "audio/pcma"}),
        (apply_ga, f"{IN}format", {"type": "audio/pcm", "rate": 16000}, {"rate": 16000}),
        (apply_ga, f"{IN}format", {"type": "audio/pcm"}, {}),
        (apply_ga, "client_secret", None, {}),
        (apply_beta, "input_audio_transcription", {"model": "large-v3"}, {"model": "large-v3"}),
        (apply_beta, "input_audio_format", "g711_alaw", {"format": "audio/pcma"}),
        (apply_beta, "input_audio_format", "g711_ulaw", {"format": "audio/pcmu"}),
        (apply_beta, "input_audio_format", "pcm16", {}),
        (apply_beta, "turn_detection", None, {"turn_detection": None}),
        (apply_beta, "turn_detection", {"prefix_padding_ms": 0}, {"turn_detection": (0.6, 0, 800)}),
        (apply_beta, "input_audio_noise_reduction", None, {}),
        (apply_beta, "include", None, {}),
        (apply_beta, "type", "transcription", {}),
        (apply_ga, f"{IN}transcription", {"keywords": ["Ada", " Lovelace ", "Ada"]},
         {"keywords": ("Ada", "Lovelace")}),
        (apply_ga, f"{IN}transcription", {"keywords": None}, {"keywords": ()}),
        (apply_ga, f"{IN}transcription", {"languages": ["de", "fr"]}, {"languages": ("de", "fr")}),
        (apply_ga, f"{IN}transcription", {"delay": "low"}, {"delay": "low"}),
        (apply_ga, "include", [LOGPROBS], {"logprobs": True}),
        (apply_ga, TD, {"idle_timeout_ms": 5000},
         {"turn_detection": (0.6, 200, 800, "server_vad", "auto", 5000)}),
        (apply_beta, "input_audio_transcription", {"languages": ["en"]}, {"languages": ("en",)}),
        (apply_beta, "include", [LOGPROBS], {"logprobs": True}),
    ],
)  # fmt: skip
def test_update_changes_only_what_it_names(
    apply: Any, path: str, value: Any, expected: dict[str, Any]
) -> None:
    if isinstance(expected.get("turn_detection"), tuple):
        expected = {**expected, "turn_detection": TurnDetection(*expected["turn_detection"])}
    config, errors = apply(TUNED, nest(path, value, {"id": "sess_1", "object": "x"}))
    assert errors == []
    assert config == RealtimeConfig(**{**vars(TUNED), **expected})


def test_turn_detection_back_on_starts_from_defaults_and_pcm_rates() -> None:
    off = RealtimeConfig(turn_detection=None)
    assert apply_ga(off, nest(TD, {"threshold": 0.3}))[0].turn_detection == (
        TurnDetection(threshold=0.3)
    )
    g711 = RealtimeConfig(format="audio/pcmu", rate=24000)
    assert (g711.rate, g711.encoding) == (8000, "g711_ulaw")
    assert apply_ga(g711, nest(f"{IN}format", {"type": "audio/pcma"}))[0].rate == 8000
    assert apply_ga(g711, nest(f"{IN}format", {"type": "audio/pcm"}))[0].rate == 24000
    assert apply_beta(RealtimeConfig(rate=16000), {"input_audio_format": "pcm16"})[0].rate == 24000


@pytest.mark.parametrize(
    ("apply", "session", "param"),
    [
        row(apply_ga, "type", "realtime"),
        row(apply_ga, "audio", "x"),
        row(apply_ga, f"{IN}format", "audio/pcm"),
        row(apply_ga, f"{IN}format.type", "audio/wav"),
        row(apply_ga, f"{IN}format.rate", 7000),
        row(apply_ga, f"{IN}format.rate", 16000.0),
        row(apply_ga, f"{IN}format", {"type": "audio/pcmu", "rate": 16000}, at=".rate"),
        row(apply_ga, f"{TD}.threshold", 2),
        row(apply_ga, f"{TD}.threshold", "0.5"),
        row(apply_ga, f"{TD}.threshold", True),
        row(apply_ga, f"{TD}.prefix_padding_ms", 2001),
        row(apply_ga, f"{TD}.silence_duration_ms", 99),
        row(apply_ga, f"{TD}.silence_duration_ms", 300.5),
        row(apply_ga, f"{TD}.type", "vad"),
        row(apply_ga, TD, True),
        row(apply_ga, f"{IN}transcription.model", 5),
        row(apply_ga, f"{IN}transcription", []),
        row(apply_ga, f"{IN}noise_reduction", "near_field"),
        row(apply_ga, "include", "x"),
        row(apply_ga, "include", ["item.input_audio_transcription.text"]),
        row(apply_ga, "include", [LOGPROBS, "x"]),
        row(apply_ga, f"{IN}transcription.keywords", "Ada"),
        row(apply_ga, f"{IN}transcription.keywords", ["Ada", " "]),
        row(apply_ga, f"{IN}transcription.keywords", [f"w{i}" for i in range(101)]),
        row(apply_ga, f"{IN}transcription.languages", [1]),
        row(apply_ga, f"{IN}transcription.delay", "fast"),
        row(apply_ga, f"{TD}.idle_timeout_ms", 500),
        row(apply_ga, f"{TD}.idle_timeout_ms", "5000"),
        row(apply_ga, f"{TD}.idle_timeout_ms", 5000.5),
        row(apply_beta, "input_audio_format", "opus"),
        row(apply_beta, "input_audio_format", ["pcm16"]),
        row(apply_beta, "turn_detection.threshold", -0.1),
        row(apply_beta, "input_audio_transcription.language", 1),
        row(apply_beta, "type", "realtime"),
    ],
)
def test_invalid_value_rejects_the_whole_update(
    apply: Any, session: dict[str, Any], param: str
) -> None:
    if apply is apply_beta:  # next to a valid change, which is not applied either
        session.setdefault("input_audio_format", "g711_alaw")
    elif isinstance(session.get("audio", {}), dict):
        inputs = session.setdefault("audio", {}).setdefault("input", {})
        inputs.setdefault("transcription", {"language": "fr"})
    config, errors = apply(TUNED, session, event_id="evt_3")
    assert config is TUNED
    assert [(e.code, e.param, e.event_id) for e in errors] == [("invalid_value", param, "evt_3")]
    assert errors[0].message.startswith(f"'{param}' ")


U, K = "unsupported_field", "unknown_parameter"
NOISE = "noise_reduction is not supported and is ignored"


@pytest.mark.parametrize(
    ("apply", "session", "code", "says", "param"),
    [
        row(apply_ga, f"{IN}noise_reduction", {"type": "near_field"}, U, NOISE),
        row(apply_ga, f"{TD}.create_response", True, U, "ignored"),
        row(apply_ga, f"{TD}.window_ms", 5, K, "ignored"),
        row(apply_ga, f"{IN}transcription", None, U, "cannot be turned off"),
        row(apply_ga, f"{IN}format.channels", 2, K, "ignored"),
        row(apply_ga, "audio.output", {}, K, "ignored"),
        row(apply_ga, "voice", "alloy", K, "ignored"),
        row(apply_beta, "input_audio_noise_reduction", {"type": "far_field"}, U, NOISE),
        row(apply_beta, "modalities", ["text"], U, "ignored"),
        row(apply_beta, "input_audio_transcription", None, U, "kept"),
        row(apply_beta, "voice", "alloy", K, "ignored"),
    ],
)  # fmt: skip
def test_unsupported_settings_are_reported_and_the_rest_applies(
    apply: Any, session: dict[str, Any], code: str, says: str, param: str
) -> None:
    if apply is apply_ga:  # a valid change next to them: G.711 µ-law
        session.setdefault("audio", {}).setdefault("input", {}).setdefault("format", {})
        session["audio"]["input"]["format"]["type"] = "audio/pcmu"
    else:
        session["input_audio_format"] = "g711_ulaw"
    config, errors = apply(TUNED, session, event_id="evt_4")
    [error] = errors
    assert (error.code, error.param, error.event_id) == (code, param, "evt_4")
    assert says in error.message
    assert (config.format, config.rate) == ("audio/pcmu", 8000)  # the valid part was applied
    assert config.turn_detection == TUNED.turn_detection
    wire = error.event().model_dump()
    assert ga_types.RealtimeErrorEvent.model_validate(wire).error.param == param


def test_harmless_unsupported_values_are_quiet() -> None:
    session = nest(TD, {"create_response": False, "interrupt_response": None}, {"include": []})
    assert apply_ga(TUNED, session) == (TUNED, [])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"threshold": 1.5}, "threshold"),
        ({"prefix_padding_ms": -1}, "prefix_padding_ms"),
        ({"silence_duration_ms": 10001}, "silence_duration_ms"),
        ({"silence_duration_ms": 300.5}, "whole number"),
    ],
)
def test_turn_detection_limits(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TurnDetection(**settings)


@pytest.mark.parametrize("settings", [{"rate": 7999}, {"rate": 192001}, {"format": "audio/wav"}])
def test_config_limits(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RealtimeConfig(**settings)
    assert RealtimeConfig(rate=192000).encoding == "pcm_s16le"
