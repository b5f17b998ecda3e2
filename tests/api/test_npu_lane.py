"""The server on `STT_DEVICE=NPU` through OpenVINO's real NPU plugin, its partitioner (NPUW)
computing on the CPU (`STT_NPU_EMULATION=true`): every protocol served, every shape compiled
before `/health` says ready and none during a request, a restart loading them from the cache.

What a real NPU adds is its driver and its own compiler behind the same plugin; the numbers the
NPU path computes are checked against the CPU's in `tests/engine/test_npu_emulation.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from wyoming.asr import Transcript

from app.api.metrics import batch_rows
from tests.api.conftest import (
    JFK_TEXT,
    JFK_WAV,
    LiveServer,
    free_port,
    normalise,
    start_server,
    stop_server,
)
from tests.api.test_realtime import (
    COMPLETED,
    DELTA,
    check_items,
    clip,
    jfk_heard_and_completed,
    pcm16,
    sdk_run,
)
from tests.api.test_stream_ws import JFK_MAX_WER, assert_close
from tests.api.test_wyoming import jfk, text_of, utterance
from tests.conftest import AUDIO

pytestmark = pytest.mark.timeout(600)

# tiny.en: the encoder's window; the decoder's step at 1 and 5 rows over one window and at 2, 4
# and 8 rows over as many (batched steps, BATCH_MAX_ROWS 8); a prompt's 32-token chunk; word
# timing's prefill
PLANNED = 8
LIBRISPEECH = AUDIO / "2412-153948-0000.flac"
LIBRISPEECH_2 = AUDIO / "1089-134686-0000.flac"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("ov-cache")


def npu_env(cache_dir, wyoming_port: int) -> dict[str, str]:
    return {
        "STT_DEVICE": "NPU",
        "STT_NPU_EMULATION": "true",
        "STT_OV_CACHE_DIR": str(cache_dir),
        "STT_WYOMING_PORT": str(wyoming_port),
        "STT_WYOMING_HOST": "127.0.0.1",
        "STT_WYOMING_ZEROCONF": "",
    }


@pytest.fixture(scope="module")
def npu(tmp_path_factory: pytest.TempPathFactory, cache_dir) -> Iterator[tuple[LiveServer, int]]:
    port = free_port()
    live = start_server(tmp_path_factory.mktemp("npu"), "npu", **npu_env(cache_dir, port))
    yield live, port
    stop_server(live)


@pytest.fixture(scope="module")
def server(npu: tuple[LiveServer, int]) -> LiveServer:
    """The NPU server under the name the shared realtime helpers take."""
    return npu[0]


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0)


def compiles(server: LiveServer) -> dict[tuple[str, str], float]:
    text = httpx.get(server.url("/metrics"), timeout=10).text
    return {
        (s.labels["device"], s.labels["source"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "stt_graph_compiles"
        for s in family.samples
        if s.name == "stt_graph_compiles_total"
    }


def transcribe(client: openai.OpenAI, path=JFK_WAV, **extra) -> openai.types.Transcription:
    with path.open("rb") as f:
        return client.audio.transcriptions.create(
            model="tiny.en", file=f, extra_body={k: str(v) for k, v in extra.items()}
        )


def test_health_says_the_npu_is_emulated_and_every_shape_was_compiled_at_start(
    server: LiveServer,
) -> None:
    (model,) = httpx.get(server.url("/health"), timeout=10).json()["models"]
    assert model["devices"] == {"encoder": "NPU", "decoder": "NPU", "aligner": "NPU"}
    assert all("NPU emulated: NPUW on the CPU" in a for a in model["arithmetic"].values())
    assert compiles(server) == {("NPU", "compiled"): PLANNED}


@pytest.mark.parametrize("beam_size", [1, 3, 5], ids=["greedy", "beam3-padded", "beam5"])
def test_json_reads_jfk(client: openai.OpenAI, beam_size: int) -> None:
    result = transcribe(client, beam_size=beam_size)
    assert normalise(result.text) == normalise(JFK_TEXT)


def test_sampling_at_a_temperature_reads_jfk(client: openai.OpenAI) -> None:
    """temperature 0.3: best_of 5 samples, the rows of the 5-row step."""
    with JFK_WAV.open("rb") as f:
        result = client.audio.transcriptions.create(model="tiny.en", file=f, temperature=0.3)
    assert_close(result.text, JFK_TEXT, JFK_MAX_WER)


def test_verbose_json_times_every_word(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f:
        result = client.audio.transcriptions.create(
            model="tiny.en", file=f, response_format="verbose_json",
            timestamp_granularities=["word", "segment"],
        )  # fmt: skip
    words = result.words or []
    assert normalise(" ".join(w.word for w in words)) == normalise(JFK_TEXT)
    starts = [w.start for w in words]
    assert starts == sorted(starts) and all(w.end >= w.start for w in words)
    assert 0 < words[-1].end <= result.duration


def test_sse_streams_the_tokens_as_they_are_decoded(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f:
        events = list(client.audio.transcriptions.create(model="tiny.en", file=f, stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert events[-1].type == "transcript.text.done" and len(deltas) >= 10
    assert normalise("".join(deltas)) == normalise(events[-1].text) == normalise(JFK_TEXT)


def decode_rows(server: LiveServer) -> tuple[float, float]:
    """(sum, count) of the scheduler's rows per decoder step (`stt_batch_rows`, decode)."""
    return batch_rows(httpx.get(server.url("/metrics"), timeout=10).text, "tiny.en")


def test_clients_at_once_share_the_decoder_steps(client: openai.OpenAI, server: LiveServer) -> None:
    """Greedy decodes of three clients at once batched on the shapes compiled for batched steps
    (3 rows padded to 4): fewer decoder steps than the clients' alone, each reading what it reads
    alone. (A beam-5 request's 5 rows batch with no other's: `BATCH_MAX_ROWS` is 8.) Two clients
    share steps only while the first one's decode outlasts the second one's window being encoded
    (one window per encoder call on the NPU): 0-10 of their 75 steps, by timing alone, so two
    clients prove nothing either way; three share 28-46 of 123."""
    paths = (JFK_WAV, LIBRISPEECH, LIBRISPEECH_2)
    clients = len(paths)
    _, steps_before = decode_rows(server)
    alone = [transcribe(client, path, beam_size=1).text for path in paths]
    _, steps_between = decode_rows(server)
    with ThreadPoolExecutor(clients) as pool:
        texts = [r.text for r in pool.map(lambda p: transcribe(client, p, beam_size=1), paths)]
    _, steps_after = decode_rows(server)
    assert normalise(texts[0]) == normalise(JFK_TEXT)
    assert texts == alone
    # without batching the counts are equal; how many steps are shared depends on when each
    # client's window is encoded (one window per encoder call on the NPU)
    assert steps_after - steps_between <= steps_between - steps_before - 5


def test_realtime_items_stream_deltas_while_speaking_and_complete(server: LiveServer) -> None:
    """The official SDK's realtime client at real-time pace, server VAD: the live passes run on
    the NPU's compiled shapes (the static cache, word timing's fixed width)."""
    session = {"type": "transcription", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "silence_duration_ms": 500}}}}  # fmt: skip
    audio = pcm16(np.concatenate([clip(JFK_WAV, 24000), np.zeros(24000 * 2, np.float32)]))
    run = asyncio.run(
        sdk_run(server, session, audio, bytes_per_s=48000, done=jfk_heard_and_completed)
    )
    check_items(run)
    assert len(run.of(COMPLETED)) >= 2  # jfk pauses after "Americans"
    assert_close(run.transcript, JFK_TEXT, JFK_MAX_WER)
    first_delta = next(t for t, e in run.events if e["type"] == DELTA)
    assert first_delta < run.audio_end_t - 2.0


def test_wyoming_gives_the_transcript(npu: tuple[LiveServer, int]) -> None:
    _, port = npu
    events, _ = asyncio.run(utterance(port, jfk(16000), 16000))
    assert normalise(text_of(events)) == normalise(JFK_TEXT)
    assert [Transcript.is_type(e.type) for e in events].count(True) == 1


def test_no_request_compiled_anything(client: openai.OpenAI, server: LiveServer) -> None:
    """Last in this module: after every protocol above, beams 1, 3 and 5, sampling, words and
    two clients at once, the counter still holds only the start-up's compiles."""
    transcribe(client, beam_size=7)  # 7 rows: a 5-row piece and a padded one
    assert compiles(server) == {("NPU", "compiled"): PLANNED}


def test_a_restart_loads_every_shape_from_the_cache(
    tmp_path_factory: pytest.TempPathFactory, cache_dir, npu: tuple[LiveServer, int]
) -> None:
    live = start_server(
        tmp_path_factory.mktemp("npu-again"), "npu-again", **npu_env(cache_dir, free_port())
    )
    try:
        assert compiles(live) == {("NPU", "cache"): PLANNED}
        client = openai.OpenAI(base_url=live.url("/v1"), api_key="unused", max_retries=0)
        assert normalise(transcribe(client, beam_size=1).text) == normalise(JFK_TEXT)
    finally:
        stop_server(live)
