"""Bad input gets the right status with OpenAI's error shape, and the server stays healthy."""

from __future__ import annotations

import httpx
import pytest

from app.runtime.cpu_kind import this_cpu
from tests.api.conftest import JFK_TEXT, JFK_WAV, LiveServer, assert_openai_error, normalise

pytestmark = pytest.mark.timeout(120)

TRANSCRIBE = "/v1/audio/transcriptions"


@pytest.fixture(scope="module")
def http(server: LiveServer) -> httpx.Client:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def jfk_file() -> dict:
    return {"file": ("jfk.wav", JFK_WAV.read_bytes(), "audio/wav")}


def test_missing_file_is_400(http: httpx.Client) -> None:
    r = http.post(TRANSCRIBE, data={"model": "tiny.en"}, files={"other": ("x", b"1")})
    error = assert_openai_error(r, 400, param="file")
    assert error["type"] == "invalid_request_error"
    assert "file" in error["message"]


def test_not_multipart_is_400(http: httpx.Client) -> None:
    r = http.post(TRANSCRIBE, json={"model": "tiny.en"})
    assert_openai_error(r, 400)


def test_empty_file_is_400(http: httpx.Client) -> None:
    r = http.post(TRANSCRIBE, files={"file": ("a.wav", b"", "audio/wav")})
    assert_openai_error(r, 400, param="file")


def test_unknown_model_is_404(http: httpx.Client) -> None:
    r = http.post(TRANSCRIBE, data={"model": "large-v9"}, files=jfk_file())
    error = assert_openai_error(r, 404, param="model")
    assert error["code"] == "model_not_found"
    assert "large-v9" in error["message"] and "tiny.en" in error["message"]


def test_model_name_is_not_a_path(http: httpx.Client) -> None:
    for name in ("../models/tiny.en", "/work/main/models/tiny.en", "tiny.en/..", "base"):
        r = http.post(TRANSCRIBE, data={"model": name}, files=jfk_file())
        assert_openai_error(r, 404, param="model")


@pytest.mark.parametrize("blank", ["%20", "%09", "%20%20"])
def test_a_blank_model_id_names_no_model(http: httpx.Client, blank: str) -> None:
    """A blank id in a model route is a 400, never the default model (a blank DELETE once
    unloaded the server's default model, found by the schema fuzzer)."""
    for method in ("GET", "POST", "DELETE"):
        error = assert_openai_error(http.request(method, f"/v1/models/{blank}"), 400, param="model")
        assert "model" in error["message"]
    assert http.get("/v1/models/tiny.en").json()["loaded"]


def test_undecodable_audio_is_415(http: httpx.Client) -> None:
    for name, payload in [
        ("a.wav", b"RIFF\x00\x00\x00\x00WAVEjunk" * 30),
        ("a.mp4", b"\x00\x00\x00\x20ftypisom" + b"\x00" * 500),
        ("a.txt", b"hello, this is text, not audio\n" * 20),
    ]:
        r = http.post(TRANSCRIBE, data={"model": "tiny.en"}, files={"file": (name, payload)})
        error = assert_openai_error(r, 415, param="file")
        assert error["code"] == "unsupported_audio"


def test_bad_response_format_is_400(http: httpx.Client) -> None:
    r = http.post(TRANSCRIBE, data={"response_format": "xml"}, files=jfk_file())
    error = assert_openai_error(r, 400, param="response_format")
    assert "response_format" in error["message"]


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("temperature", "7", "temperature"),
        ("temperature", "warm", "temperature"),
        ("beam_size", "0", "beam_size"),
        ("language", "klingon", "language"),
        ("language", "de", "language"),  # tiny.en is English-only
        ("timestamp_granularities[]", "word", "timestamp_granularities[]"),
        ("timestamp_granularities[]", "sentence", "timestamp_granularities[]"),
        ("include[]", "tokens", "include[]"),
        ("stream", "perhaps", "stream"),
    ],
)
def test_bad_parameter_is_400(http: httpx.Client, field: str, value: str, param: str) -> None:
    r = http.post(TRANSCRIBE, data={"model": "tiny.en", field: value}, files=jfk_file())
    assert_openai_error(r, 400, param=param)


def test_language_names_are_the_engines(http: httpx.Client) -> None:
    """Any name the engine knows reaches the model's own rule: "mandarin" is Chinese, which the
    English-only tiny.en refuses as 'zh' (the same refusal every live protocol gives)."""
    r = http.post(TRANSCRIBE, data={"model": "tiny.en", "language": "mandarin"}, files=jfk_file())
    error = assert_openai_error(r, 400, param="language")
    assert error["code"] == "unsupported_language"
    assert "English-only" in error["message"] and "'zh'" in error["message"]
    data = {"model": "tiny.en", "language": " English ", "response_format": "verbose_json"}
    r = http.post(TRANSCRIBE, data=data, files=jfk_file())
    assert r.status_code == 200, r.text
    assert r.json()["language"] == "english"


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert_openai_error(http.get("/v1/nothing-here"), 404)
    assert_openai_error(http.get(TRANSCRIBE), 405)


def test_server_healthy_after_bad_input(http: httpx.Client) -> None:
    for _ in range(3):
        http.post(TRANSCRIBE, files={"file": ("a.wav", b"\x00garbage" * 999)})
    health = http.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ready"
    assert health.json()["active"] == 0 and health.json()["queued"] == 0
    r = http.post(TRANSCRIBE, data={"model": "tiny.en"}, files=jfk_file())
    assert r.status_code == 200, r.text
    assert normalise(r.json()["text"]) == normalise(JFK_TEXT)


def test_health_and_metrics(http: httpx.Client) -> None:
    http.post(TRANSCRIBE, files={"file": ("a.wav", b"\x00garbage" * 999)})  # a 415
    assert http.post(TRANSCRIBE, files=jfk_file()).status_code == 200
    health = http.get("/health").json()
    assert health["default_model"] == "tiny.en"
    assert [m["name"] for m in health["models"]] == ["tiny.en"]
    devices = health["models"][0]["devices"]
    assert set(devices) == {"encoder", "decoder", "aligner"} and all(devices.values())
    arithmetic = health["models"][0]["arithmetic"]  # the CPU kind the server computes for
    assert set(arithmetic) == set(devices) and this_cpu().name in arithmetic["encoder"]
    int8 = "int8 x int8" if this_cpu().int8_dot_products else "in float on their int8 grids"
    assert f"int8 inputs {int8}" in arithmetic["decoder"]
    text = http.get("/metrics").text
    for name in (
        "stt_http_requests_total",
        "stt_audio_seconds_total",
        "stt_stage_seconds_bucket",
        "stt_real_time_factor_bucket",
        "stt_queue_depth",
        "stt_active_jobs",
        "stt_active_streams",
    ):
        assert name in text, name
    assert 'route="/v1/audio/transcriptions",status="415"' in text
    assert 'outcome="rejected"' in text and 'outcome="ok"' in text
    for stage in ("decode_audio", "vad", "encoder", "decoder", "transcribe", "queue_wait", "total"):
        assert f'stage="{stage}"' in text, stage
