"""Settings from STT_* environment variables."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.config import Settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for key in list(os.environ):
        if key.startswith("STT_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_defaults() -> None:
    s = Settings()
    assert s.models == ["base"] and s.default_model == "base"
    assert s.models_dir == Path("models")
    assert (s.ep, s.device, s.kv_cache) == ("openvino", "AUTO", "concat")
    assert (s.workers, s.max_queue, s.threads) == (0, 8, 0)
    assert s.batching and s.worker_count == s.batch_max_rows == 8
    assert s.max_upload_bytes == 25 * 1024 * 1024
    assert s.api_key is None and s.cors_origins == []


def test_from_environment(clean_env: pytest.MonkeyPatch) -> None:
    for key, value in {
        "STT_MODELS": "tiny.en, base",
        "STT_DEVICE": "npu",
        "STT_DECODER_DEVICE": "cpu",
        "STT_EP": "CPU",
        "STT_API_KEY": "s3cret",
        "STT_CORS_ORIGINS": "http://a.example,http://b.example",
        "STT_WORKERS": "2",
        "STT_MAX_QUEUE": "0",
        "STT_LOG_LEVEL": "debug",
        "STT_OV_CACHE_DIR": "/tmp/ov",
    }.items():
        clean_env.setenv(key, value)
    s = Settings()
    assert s.models == ["tiny.en", "base"] and s.default_model == "tiny.en"
    assert (s.device, s.decoder_device, s.encoder_device, s.ep) == ("NPU", "CPU", None, "cpu")
    assert s.api_key is not None and s.api_key.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(s)
    assert s.cors_origins == ["http://a.example", "http://b.example"]
    assert (s.workers, s.max_queue, s.log_level) == (2, 0, "DEBUG")
    assert s.worker_count == 2
    assert s.ov_cache_dir == Path("/tmp/ov")


def test_worker_count_without_batching(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("STT_BATCHING", "false")
    assert Settings().worker_count == 1


def test_empty_api_key_means_none(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("STT_API_KEY", "")
    assert Settings().api_key is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("STT_DEFAULT_MODEL", "large"),  # not one of STT_MODELS
        ("STT_MODELS", " , "),
        ("STT_MODELS", "base,base"),
        ("STT_DEVICE", "TPU"),
        ("STT_EP", "cuda"),
        ("STT_KV_CACHE", "paged"),
        ("STT_WORKERS", "-1"),
        ("STT_MAX_QUEUE", "-1"),
        ("STT_MAX_UPLOAD_MB", "0"),
        ("STT_BATCH_MAX_ROWS", "0"),
        ("STT_BATCH_MAX_PADDING", "1.0"),
        ("STT_MODEL_TTL_S", "-2"),
        ("STT_MAX_LOADED_MODELS", "-1"),
        ("STT_MODEL_DOWNLOADS", "maybe"),
        ("STT_DIARIZATION", "maybe"),
        ("STT_DIARIZATION_DEVICE", "TPU"),
    ],
)
def test_rejects_bad_values(clean_env: pytest.MonkeyPatch, key: str, value: str) -> None:
    clean_env.setenv(key, value)
    with pytest.raises(ValidationError):
        Settings()


def test_speaker_models_run_on_the_diarization_device(clean_env: pytest.MonkeyPatch) -> None:
    from app.main import runtime_options, speaker_runtime

    clean_env.setenv("STT_DEVICE", "cpu")
    settings = Settings()
    assert settings.diarization  # on by default
    assert speaker_runtime(settings).device == "CPU"  # unset: the Whisper models' device
    clean_env.setenv("STT_DIARIZATION_DEVICE", "gpu")
    clean_env.setenv("STT_DIARIZATION", "false")
    settings = Settings()
    assert not settings.diarization
    assert speaker_runtime(settings).device == "GPU"
    assert runtime_options(settings).device == "CPU"


def test_wyoming_speakers_need_the_speaker_models(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("STT_WYOMING_SPEAKERS", "true")
    assert Settings().wyoming_speakers
    clean_env.setenv("STT_DIARIZATION", "false")
    with pytest.raises(ValidationError, match="STT_WYOMING_SPEAKERS needs STT_DIARIZATION"):
        Settings()


def test_batching_settings_reach_the_models(clean_env: pytest.MonkeyPatch) -> None:
    from app.main import build_models

    clean_env.setenv("STT_BATCH_MAX_ROWS", "12")
    batching = build_models(Settings()).open_options.batching
    assert batching is not None and batching.max_rows == 12
    clean_env.setenv("STT_BATCHING", "false")
    assert build_models(Settings()).open_options.batching is None


def test_model_management_settings_reach_the_manager(clean_env: pytest.MonkeyPatch) -> None:
    from app.main import build_models

    options = build_models(Settings()).options
    assert (options.ttl_s, options.max_loaded, options.autoload, options.downloads) == (
        -1.0, 0, False, False,
    )  # fmt: skip
    clean_env.setenv("STT_MODEL_TTL_S", "300")
    clean_env.setenv("STT_MAX_LOADED_MODELS", "2")
    clean_env.setenv("STT_MODEL_AUTOLOAD", "true")
    clean_env.setenv("STT_MODEL_DOWNLOADS", "true")
    options = build_models(Settings()).options
    assert (options.ttl_s, options.max_loaded, options.autoload, options.downloads) == (
        300.0, 2, True, True,
    )  # fmt: skip


def test_max_loaded_models_holds_the_start_up_models(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("STT_MODELS", "tiny.en,base")
    clean_env.setenv("STT_MAX_LOADED_MODELS", "1")
    with pytest.raises(ValidationError, match="STT_MAX_LOADED_MODELS=1 is less than the 2"):
        Settings()
    clean_env.setenv("STT_MAX_LOADED_MODELS", "2")
    assert Settings().max_loaded_models == 2


def test_live_stream_defaults_are_the_sessions(clean_env: pytest.MonkeyPatch) -> None:
    """The server's live settings default to what a `StreamingOptions` defaults to: one default
    per knob, whichever way a session is made (the edge once drifted to 0.5 here vs 0.7)."""
    from app.service.live import StreamingOptions

    settings, options = Settings(), StreamingOptions()
    assert (settings.stream_policy, settings.stream_edge_s, settings.stream_step_s) == (
        options.policy,
        options.edge_s,
        options.step_s,
    )
