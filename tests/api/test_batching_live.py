"""Cross-request batching through the live server (batching is on by default): concurrent
requests get the same transcripts as the same requests one at a time, and /metrics shows that
their decoder steps were shared. The server runs the fp16 build of tiny.en, whose rows OpenVINO
computes bit-identically however they are packed (with int8 files a near-tie token may flip with
the load: tests/conftest.py, `fp16_model_dir`)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from app.api.metrics import batch_rows
from tests.api.conftest import JFK_WAV, LONG_WAV, LiveServer, start_server, stop_server
from tests.conftest import fp16_model_dir

pytestmark = pytest.mark.timeout(300)

# (clip, beam_size): greedy rows batch across requests; a beam request brings its own rows
JOBS = [(LONG_WAV, "1"), (JFK_WAV, "1"), (LONG_WAV, "1"), (JFK_WAV, "3"), (JFK_WAV, "1")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    models_dir = fp16_model_dir("tiny.en").parent
    live = start_server(tmp_path_factory.mktemp("fp16"), "fp16", STT_MODELS_DIR=str(models_dir))
    yield live
    stop_server(live)


def transcribe(server: LiveServer, job: tuple) -> str:
    path, beam_size = job
    response = httpx.post(
        server.url("/v1/audio/transcriptions"),
        files={"file": (path.name, path.read_bytes())},
        data={"model": "tiny.en", "beam_size": beam_size, "response_format": "text"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response.text


def decode_rows(server: LiveServer) -> tuple[float, float]:
    """(sum, count) of the `stt_batch_rows` histogram for decode steps of tiny.en."""
    return batch_rows(httpx.get(server.url("/metrics"), timeout=10).text, "tiny.en")


def test_concurrent_requests_match_sequential(server: LiveServer) -> None:
    one_at_a_time = {job: transcribe(server, job) for job in dict.fromkeys(JOBS)}  # each once
    sequential = [one_at_a_time[job] for job in JOBS]
    rows_before, steps_before = decode_rows(server)
    with ThreadPoolExecutor(len(JOBS)) as pool:
        concurrent = list(pool.map(lambda job: transcribe(server, job), JOBS))
    rows_after, steps_after = decode_rows(server)
    assert concurrent == sequential
    assert "fellow Americans" in concurrent[1]
    steps = steps_after - steps_before
    assert steps > 0
    assert (rows_after - rows_before) / steps > 1.5, "decoder steps were shared across requests"
