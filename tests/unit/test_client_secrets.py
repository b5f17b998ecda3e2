"""Client secrets (`app.api.auth`): signed, self-contained, short-lived keys for the Realtime
endpoint; nothing stored, so every replica with the same key checks them."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from app.api.auth import client_secret, secret_session
from app.service.errors import Rejected

KEY = SecretStr("the-servers-key")
SESSION = {"type": "transcription", "audio": {"input": {"transcription": {"language": "de"}}}}


def refusal(key: SecretStr | None, secret: str, now: float = 1000.0) -> str:
    with pytest.raises(Rejected) as info:
        secret_session(key, secret, now=now)
    assert info.value.kind == "unauthorized"
    return info.value.code


def test_a_secret_gives_back_its_session_until_it_expires() -> None:
    secret = client_secret(KEY, SESSION, expires_at=1600)
    assert secret.startswith("ek_") and "the-servers-key" not in secret
    assert secret_session(KEY, secret, now=1599.9) == SESSION
    assert secret_session(SecretStr("the-servers-key"), secret, now=1000) == SESSION  # a replica
    assert refusal(KEY, secret, now=1600) == "client_secret_expired"


def test_a_secret_of_another_key_or_altered_is_refused() -> None:
    secret = client_secret(KEY, SESSION, expires_at=1600)
    assert refusal(SecretStr("another-key"), secret) == "invalid_client_secret"
    assert refusal(None, secret) == "invalid_client_secret"  # the key was removed
    payload, _, signature = secret.partition(".")
    longer = client_secret(KEY, SESSION, expires_at=999_999).partition(".")[0]
    assert refusal(KEY, f"{longer}.{signature}") == "invalid_client_secret"  # expiry pushed out
    flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    assert refusal(KEY, f"{payload}.{flipped}") == "invalid_client_secret"
    for garbage in ("ek_", "ek_x.y", "ek_not base64!.??", "ek_" + "é" * 10):
        assert refusal(KEY, garbage) == "invalid_client_secret"


def test_a_server_without_a_key_still_checks_its_own_secrets() -> None:
    secret = client_secret(None, SESSION, expires_at=1600)
    assert secret_session(None, secret, now=1000) == SESSION
    assert refusal(None, secret, now=2000) == "client_secret_expired"
