"""Hardening under load and over long runs, against a fresh uvicorn server (tiny.en).

`--mode load`: 8 WebSocket streams at real-time pace plus 16 concurrent REST clients for
`--minutes` (5). Counts 5xx answers, dropped sessions (no `transcript.text.done`, an `error`
event or a close code other than 1000) and wrong transcripts (normalised WER against the
testdata reference, compared with the same clip transcribed on the quiet server first); reports
p50/p95 latency and the share of 429s. The server runs with its defaults (STT_WORKERS automatic,
STT_MAX_QUEUE=8), so 16 REST clients and 8 streams are over capacity on purpose; a client that gets
a 429 waits `Retry-After` (at most `--max-backoff` s) like the OpenAI SDK, then sends the next
request.

`--mode long`: `--requests` (1000) REST requests (a mix of json, SSE and undecodable uploads),
then one WebSocket session of at least `--session-minutes` (60) of speech fed at `--speed` (4) x
real time, never more than `--max-lead` s ahead of the last committed text. The server's RSS,
open file descriptors (/proc/PID/fd) and threads (/proc/PID/status) are sampled at the start,
along the way and at the end.

    .venv/bin/python -m benchmarks.hardening_load --mode load --no-wait
    .venv/bin/python -m benchmarks.hardening_load --mode long --no-wait

Writes benchmarks/results/hardening_load.md or hardening_long.md (`--out-dir`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from app.runtime.memory import malloc_environment
from benchmarks import common
from benchmarks.common import REPO
from benchmarks.load import percentile
from benchmarks.server import Server, start_server

MAX_CLIP_S = 15.0  # clips used by the load mode (short turns, like a voice assistant's)
FRAME_S = 0.1  # WebSocket audio frame (s)
DONE_TIMEOUT_S = 180.0  # most time a session may take to answer session.close
TRANSCRIBE = "/v1/audio/transcriptions"
CORRECT_WER_SLACK = 10.0  # % points a transcript under load may be worse than on a quiet server


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["load", "long"], required=True)
    p.add_argument("--model", default="tiny.en")
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        help="STT_WORKERS (default 0: the server's automatic value)",
    )
    p.add_argument("--max-queue", type=int, default=8, help="STT_MAX_QUEUE (default 8)")
    p.add_argument("--ep", default="openvino", choices=["openvino", "cpu"])
    p.add_argument("--minutes", type=float, default=5.0, help="load: duration (default 5)")
    p.add_argument("--streams", type=int, default=8, help="load: WebSocket streams (default 8)")
    p.add_argument("--rest-clients", type=int, default=16, help="load: REST clients (16)")
    p.add_argument("--max-backoff", type=float, default=5.0, help="load: longest 429 wait (s)")
    p.add_argument("--requests", type=int, default=1000, help="long: REST requests (1000)")
    p.add_argument("--long-clients", type=int, default=2, help="long: concurrent REST clients")
    p.add_argument(
        "--session-minutes", type=float, default=60.0, help="long: WebSocket audio (min)"
    )
    p.add_argument("--speed", type=float, default=4.0, help="long: feed speed x real time")
    p.add_argument(
        "--max-lead", type=float, default=30.0, help="long: most audio (s) ahead of the commits"
    )
    common.add_args(p)
    return p.parse_args()


# ---- the server process -------------------------------------------------------------------------
def process_sample(pid: int) -> dict[str, float]:
    """RSS (MB), open file descriptors and threads of a live process."""
    rss, _peak = common.rss_mb(pid)
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    threads = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            threads = int(line.split()[1])
    return {"rss_mb": rss, "fds": fds, "threads": threads, "t": time.time()}


def code_state() -> str:
    """The commit measured, and any uncommitted changes under app/ (the tree may be shared)."""
    import subprocess

    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True).stdout

    commit = git("rev-parse", "--short", "HEAD").strip()
    changed = [line[3:] for line in git("status", "--short", "app").splitlines()]
    return f"Code: commit {commit}" + (
        f", with uncommitted changes in {', '.join(changed)}." if changed else " (clean)."
    )


def launch(args: argparse.Namespace, extra_env: dict[str, str] | None = None) -> Server:
    """A fresh server; notes on `args` the code it runs and the worker count it chose."""
    # glibc malloc settings in the environment, as `make run` and the Docker image start it
    env = {"STT_MAX_QUEUE": str(args.max_queue), **malloc_environment(), **(extra_env or {})}
    args.code_state = code_state()  # what the server process loads
    server = start_server(args.model, common.MODELS_DIR, args.workers, args.threads, args.ep, env)
    health = httpx.get(server.url + "/health", timeout=10).json()
    args.workers_line = f"STT_WORKERS={args.workers} ({health['workers']} workers)"
    return server


# ---- audio --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Clip:
    name: str
    upload: bytes  # the file as stored (wav, flac or mp3)
    pcm: bytes  # mono pcm_s16le at 16 kHz, for the WebSocket
    reference: str
    duration_s: float


def to_pcm16(audio: np.ndarray) -> bytes:
    """f32 [N] in [-1, 1] -> little-endian int16 bytes."""
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def short_clips() -> list[Clip]:
    """The English testdata clips of at most MAX_CLIP_S seconds."""
    from app.engine.audio import decode_audio

    clips = []
    for entry in common.english_clips():
        if entry["duration_s"] > MAX_CLIP_S:
            continue
        path = common.TESTDATA / entry["file"]
        pcm = to_pcm16(decode_audio(path))
        clips.append(Clip(path.name, path.read_bytes(), pcm, entry["text"], entry["duration_s"]))
    return clips


def clip_wer(reference: str, text: str | None) -> float:
    """Normalised WER in % of one transcript (100 when there is none)."""
    if text is None:
        return 100.0
    return common.wer([reference], [text])[0]


# ---- clients ------------------------------------------------------------------------------------
@dataclass
class RestOutcome:
    clip: str
    status: int  # 0: transport error
    latency_s: float
    text: str | None = None
    error: str | None = None


@dataclass
class StreamOutcome:
    clip: str
    close_code: int | None = None
    text: str | None = None  # transcript.text.done
    errors: list[dict] = field(default_factory=list)
    commit_lags_s: list[float] = field(default_factory=list)  # delta received - its audio end
    finalize_s: float | None = None  # session.close -> transcript.text.done
    exception: str | None = None
    audio_s: float = 0.0

    @property
    def dropped(self) -> bool:
        return (
            self.text is None
            or self.close_code != 1000
            or bool(self.errors)
            or bool(self.exception)
        )


async def rest_request(
    client: httpx.AsyncClient, clip: Clip, data: dict[str, str] | None = None
) -> RestOutcome:
    """One upload; json answers keep their text, SSE answers their `transcript.text.done`."""
    t0 = time.perf_counter()
    files = {"file": (clip.name, clip.upload)}
    try:
        if data and data.get("stream") == "true":
            text = None
            async with client.stream("POST", TRANSCRIBE, files=files, data=data) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        if event["type"] == "transcript.text.done":
                            text = event["text"]
                        elif event["type"] == "error":
                            return RestOutcome(clip.name, 500, time.perf_counter() - t0,
                                               error=json.dumps(event))  # fmt: skip
                status = r.status_code
            return RestOutcome(clip.name, status, time.perf_counter() - t0, text)
        r = await client.post(TRANSCRIBE, files=files, data=data or {})
    except httpx.HTTPError as e:
        return RestOutcome(clip.name, 0, time.perf_counter() - t0, error=repr(e))
    elapsed = time.perf_counter() - t0
    if r.status_code == 200:
        return RestOutcome(clip.name, 200, elapsed, r.json()["text"])
    outcome = RestOutcome(clip.name, r.status_code, elapsed, error=r.text[:300])
    outcome.retry_after = float(r.headers.get("retry-after", "1"))  # type: ignore[attr-defined]
    return outcome


async def stream_session(
    ws_url: str,
    name: str,
    frames: Any,
    *,
    speed: float | None,
    max_lead_s: float | None = None,
) -> StreamOutcome:
    """Send pcm_s16le 16 kHz `frames` (an iterable of bytes of FRAME_S each) at `speed` x real
    time, then session.close; collect the committed text and per-delta commit lags."""
    out = StreamOutcome(name)
    committed_end = 0.0  # stream time (s) of the last committed delta
    sent_s = 0.0
    closed_at: float | None = None
    try:
        async with connect(ws_url, max_size=None, open_timeout=60) as ws:
            t0 = time.monotonic()

            async def receive() -> None:
                nonlocal committed_end
                async for message in ws:
                    event = json.loads(message)
                    kind = event["type"]
                    if kind == "transcript.text.delta":
                        committed_end = event["end"]
                        if speed:
                            arrived = time.monotonic() - t0
                            out.commit_lags_s.append(arrived - event["end"] / speed)
                    elif kind == "transcript.text.done":
                        out.text = event["text"]
                        if closed_at is not None:
                            out.finalize_s = time.monotonic() - closed_at
                    elif kind == "error":
                        out.errors.append(event["error"])

            receiver = asyncio.create_task(receive())
            for i, frame in enumerate(frames):
                await ws.send(frame)
                sent_s += len(frame) / 32000
                if speed:
                    delay = t0 + (i + 1) * FRAME_S / speed - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                while max_lead_s is not None and sent_s - committed_end > max_lead_s:
                    if receiver.done():
                        break
                    await asyncio.sleep(0.05)
                if receiver.done():
                    break
            closed_at = time.monotonic()
            await ws.send(json.dumps({"type": "session.close"}))
            await asyncio.wait_for(receiver, DONE_TIMEOUT_S)
            out.close_code = ws.close_code
    except (ConnectionClosed, WebSocketException, OSError, TimeoutError) as e:
        out.exception = repr(e)
    out.audio_s = sent_s
    return out


def frames_of(pcm: bytes) -> list[bytes]:
    step = int(FRAME_S * common.SAMPLE_RATE) * 2
    return [pcm[i : i + step] for i in range(0, len(pcm), step)]


# ---- load mode ----------------------------------------------------------------------------------
async def quiet_baseline(url: str, clips: list[Clip]) -> dict[str, dict[str, str]]:
    """Each clip transcribed once on the idle server, by REST (beam 5) and by a real-time
    stream (greedy): {"rest" | "stream": {clip: text}}, the texts to expect under load."""
    ws_url = url.replace("http://", "ws://") + "/v1/audio/stream"
    texts: dict[str, dict[str, str]] = {"rest": {}, "stream": {}}
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        for clip in clips:
            outcome = await rest_request(client, clip)
            if outcome.status != 200:
                raise SystemExit(f"baseline request for {clip.name} failed: {outcome}")
            texts["rest"][clip.name] = outcome.text or ""
            session = await stream_session(ws_url, clip.name, frames_of(clip.pcm), speed=1.0)
            if session.dropped:
                raise SystemExit(f"baseline session for {clip.name} failed: {session}")
            texts["stream"][clip.name] = session.text or ""
    return texts


async def run_load(url: str, clips: list[Clip], args: argparse.Namespace) -> dict[str, Any]:
    deadline = time.monotonic() + args.minutes * 60
    ws_url = url.replace("http://", "ws://") + "/v1/audio/stream"
    rest: list[RestOutcome] = []
    streams: list[StreamOutcome] = []

    async def rest_client(k: int) -> None:
        rng = random.Random(k)
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            await asyncio.sleep(rng.uniform(0, 2))
            while time.monotonic() < deadline:
                outcome = await rest_request(client, rng.choice(clips))
                rest.append(outcome)
                if outcome.status == 429:
                    await asyncio.sleep(min(args.max_backoff, outcome.retry_after))  # type: ignore[attr-defined]

    async def stream_client(k: int) -> None:
        await asyncio.sleep(k * 0.7)  # staggered, as people start talking at different times
        i = k
        while time.monotonic() < deadline:
            clip = clips[i % len(clips)]
            i += 1
            streams.append(await stream_session(ws_url, clip.name, frames_of(clip.pcm), speed=1.0))

    loads: list[float] = []

    async def load_sampler() -> None:
        while time.monotonic() < deadline:
            loads.append(common.load1())
            await asyncio.sleep(15)

    t0 = time.perf_counter()
    await asyncio.gather(
        *(rest_client(k) for k in range(args.rest_clients)),
        *(stream_client(k) for k in range(args.streams)),
        load_sampler(),
    )
    return {"rest": rest, "streams": streams, "wall_s": time.perf_counter() - t0, "loads": loads}


def load_report(
    results: dict[str, Any],
    clips: list[Clip],
    baseline: dict[str, dict[str, str]],
    args: argparse.Namespace,
    load_before: float,
) -> list[str]:
    rest: list[RestOutcome] = results["rest"]
    streams: list[StreamOutcome] = results["streams"]
    by_name = {c.name: c for c in clips}
    base_wer = {c.name: clip_wer(c.reference, baseline["rest"][c.name]) for c in clips}
    stream_base_wer = {c.name: clip_wer(c.reference, baseline["stream"][c.name]) for c in clips}
    ok = [r for r in rest if r.status == 200]
    statuses: dict[int, int] = {}
    for r in rest:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    rest_5xx = sum(n for s, n in statuses.items() if s >= 500 or s == 0)
    rest_changed = [r for r in ok if common.normalize(r.text or "") != common.normalize(
        baseline["rest"][r.clip])]  # fmt: skip
    rest_wrong = [
        r for r in ok
        if clip_wer(by_name[r.clip].reference, r.text) > base_wer[r.clip] + CORRECT_WER_SLACK
    ]  # fmt: skip
    dropped = [s for s in streams if s.dropped]
    finished = [s for s in streams if not s.dropped]
    stream_wer = {s.clip: [] for s in finished}
    for s in finished:
        stream_wer[s.clip].append(clip_wer(by_name[s.clip].reference, s.text))
    stream_wrong = [
        s for s in finished
        if clip_wer(by_name[s.clip].reference, s.text)
        > stream_base_wer[s.clip] + CORRECT_WER_SLACK
    ]  # fmt: skip
    stream_changed = [
        s for s in finished
        if common.normalize(s.text or "") != common.normalize(baseline["stream"][s.clip])
    ]  # fmt: skip
    stream_5xx = sum(
        1 for s in streams
        if s.close_code == 1011 or any(e.get("type") == "server_error" for e in s.errors)
    )  # fmt: skip
    lags = [lag for s in finished for lag in s.commit_lags_s]
    finals = [s.finalize_s for s in finished if s.finalize_s is not None]
    latencies = [r.latency_s for r in ok]
    rest_corpus = common.wer([by_name[r.clip].reference for r in ok], [r.text or "" for r in ok])
    stream_corpus = common.wer(
        [by_name[s.clip].reference for s in finished], [s.text or "" for s in finished]
    )
    loads = results["loads"]

    def pct(values: list[float], q: float) -> str:
        return f"{percentile(values, q):.2f}" if values else "-"

    lines = common.header(
        "Hardening: load (WebSocket streams + REST clients)",
        load_before,
        [
            f"Server: uvicorn started here on {args.model}, {args.workers_line}, "
            f"STT_MAX_QUEUE={args.max_queue}, STT_THREADS={args.threads}, EP {args.ep}. "
            f"{args.streams} WebSocket streams at real-time pace (100 ms pcm_s16le frames; each "
            f"stream sends one clip per session, session after session) and {args.rest_clients} "
            "REST clients (json, server defaults: beam 5) posting a random clip back to back "
            f"(on 429: wait Retry-After, at most {args.max_backoff:g} s) for "
            f"{args.minutes:g} min, wall {results['wall_s']:.0f} s. Clips: "
            + ", ".join(f"{c.name} ({c.duration_s:g} s)" for c in clips)
            + ". Load average (1 min) during the run: "
            + (f"min {min(loads):.2f}, max {max(loads):.2f}, mean {np.mean(loads):.2f}" if loads
               else "-")
            + ". " + args.code_state,
            f"Correct = normalised WER (Whisper's English normaliser) against the testdata "
            f"reference at most {CORRECT_WER_SLACK:g} points above that of the same clip "
            "transcribed alone on the quiet server before the run, the same way (REST: beam 5; "
            "stream: real-time pace, greedy).",
        ],
    )  # fmt: skip
    total = len(rest)
    lines += ["", "## REST", ""]
    lines += common.table(
        ["requests", "200", "429", "429 share", "5xx or transport errors", "other",
         "p50 s (200s)", "p95 s (200s)", "max s"],
        [[
            total, statuses.get(200, 0), statuses.get(429, 0),
            f"{100 * statuses.get(429, 0) / max(total, 1):.1f} %", rest_5xx,
            total - statuses.get(200, 0) - statuses.get(429, 0) - rest_5xx,
            pct(latencies, 0.5), pct(latencies, 0.95),
            f"{max(latencies):.2f}" if latencies else "-",
        ]],
    )  # fmt: skip
    lines += [
        "",
        f"Transcripts: {len(ok)} answered; corpus WER {rest_corpus[0]:.2f} % "
        f"({rest_corpus[1]} errors / {rest_corpus[2]} words); {len(rest_wrong)} wrong; "
        f"{len(rest_changed)} differ (normalised) from the quiet-server text of the same clip.",
        "",
        "## WebSocket",
        "",
    ]
    lines += common.table(
        ["sessions", "finished", "dropped", "5xx-like (1011 / server_error)",
         "commit lag p50 s", "commit lag p95 s", "close -> done p50 s", "close -> done p95 s"],
        [[
            len(streams), len(finished), len(dropped), stream_5xx,
            pct(lags, 0.5), pct(lags, 0.95), pct(finals, 0.5), pct(finals, 0.95),
        ]],
    )  # fmt: skip
    lines += [
        "",
        f"Commit lag: arrival of a `transcript.text.delta` minus the moment its audio ended "
        f"({len(lags)} deltas). Transcripts: corpus WER {stream_corpus[0]:.2f} % "
        f"({stream_corpus[1]} / {stream_corpus[2]} words); {len(stream_wrong)} wrong; "
        f"{len(stream_changed)} differ (normalised) from the quiet-server stream of the same clip.",
        "",
        "Per clip: WER on the quiet server, and mean WER under load (count):",
        "",
    ]
    rows = []
    for clip in clips:
        rest_w = [clip_wer(clip.reference, r.text) for r in ok if r.clip == clip.name]
        s_w = stream_wer.get(clip.name, [])
        rows.append([
            clip.name, f"{base_wer[clip.name]:.1f} %", f"{stream_base_wer[clip.name]:.1f} %",
            f"{np.mean(rest_w):.1f} % ({len(rest_w)})" if rest_w else "-",
            f"{np.mean(s_w):.1f} % ({len(s_w)})" if s_w else "-",
        ])  # fmt: skip
    lines += common.table(
        ["clip", "quiet REST", "quiet stream", "REST under load", "stream under load"], rows
    )
    problems = [f"- REST {r.status} {r.clip}: {r.error}" for r in rest if r.status >= 500 or
                r.status == 0][:10]  # fmt: skip
    problems += [
        f"- stream {s.clip}: close {s.close_code}, errors {s.errors}, {s.exception}"
        for s in dropped
    ][:10]
    problems += [f"- wrong REST {r.clip}: {r.text!r}" for r in rest_wrong][:5]
    problems += [f"- wrong stream {s.clip}: {s.text!r}" for s in stream_wrong][:5]
    if problems:
        lines += ["", "## Problems (first few)", "", *problems]
    return lines


# ---- long mode ----------------------------------------------------------------------------------
GARBAGE = b"\x00garbage, not audio " * 500


async def run_long_rest(
    url: str, pid: int, clip: Clip, args: argparse.Namespace, samples: list[dict]
) -> list[RestOutcome]:
    """`--requests` requests over `--long-clients` connections: every 10th undecodable (415),
    every 5th with stream=true, the rest json; a process sample every 100 requests."""
    outcomes: list[RestOutcome] = []
    counter = iter(range(args.requests))
    bad = Clip("garbage.wav", GARBAGE, b"", "", 0.0)

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=600) as c:
            for n in counter:
                if n % 10 == 9:
                    outcomes.append(await rest_request(c, bad))
                elif n % 5 == 4:
                    outcomes.append(await rest_request(c, clip, {"stream": "true"}))
                else:
                    outcomes.append(await rest_request(c, clip))
                if (n + 1) % 100 == 0:
                    samples.append({"when": f"after {n + 1} requests", **process_sample(pid)})

    await asyncio.gather(*(client() for _ in range(args.long_clients)))
    return outcomes


def speech_sequence(target_s: float) -> tuple[list[bytes], str]:
    """The English testdata clips (0.5 s of silence after each) repeated until `target_s`
    seconds: (pcm_s16le 16 kHz pieces, their reference text)."""
    from app.engine.audio import decode_audio

    clips = [(decode_audio(common.TESTDATA / e["file"]), e["text"]) for e in common.english_clips()]
    gap = to_pcm16(np.zeros(common.SAMPLE_RATE // 2, np.float32))
    pieces: list[bytes] = []
    texts: list[str] = []
    total_s = 0.0
    while total_s < target_s:
        for audio, text in clips:
            pieces += [to_pcm16(audio), gap]
            texts.append(text)
            total_s += audio.shape[0] / common.SAMPLE_RATE + 0.5
            if total_s >= target_s:
                break
    return pieces, " ".join(texts)


def session_frames(pieces: list[bytes], samples: list[dict], pid: int) -> Iterator[bytes]:
    """`pieces` as 100 ms frames; a process sample every 5 minutes of audio."""
    pcm = b"".join(pieces)
    step = int(FRAME_S * common.SAMPLE_RATE) * 2
    for n, offset in enumerate(range(0, len(pcm), step), start=1):
        yield pcm[offset : offset + step]
        if n % int(300 / FRAME_S) == 0:
            samples.append({"when": f"stream {n * FRAME_S / 60:.0f} min", **process_sample(pid)})


def long_report(
    rest: list[RestOutcome],
    session: StreamOutcome,
    reference: str,
    samples: list[dict],
    args: argparse.Namespace,
    load_before: float,
    wall_s: float,
    loads: list[float],
) -> list[str]:
    statuses: dict[int, int] = {}
    for r in rest:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    good = [r for r in rest if r.status == 200]
    jfk = common.clip_reference(common.JFK) or ""
    wrong = [r for r in good if clip_wer(jfk, r.text) > 10.0]
    expected_415 = sum(1 for n in range(args.requests) if n % 10 == 9)
    first, last = samples[0], samples[-1]
    warm = next((s for s in samples if s["when"] == "after 100 requests"), first)
    session_wer = common.wer([reference], [session.text or ""]) if session.text else None
    lines = common.header(
        "Hardening: long run (REST requests, then one long WebSocket session)",
        load_before,
        [
            f"Server: uvicorn started here on {args.model}, {args.workers_line}, "
            f"STT_MAX_QUEUE={args.max_queue}, STT_THREADS={args.threads}, EP {args.ep}. "
            f"{args.requests} REST requests of jfk.wav over {args.long_clients} connections "
            "(every 10th an undecodable upload -> 415, every 5th stream=true, the rest json), "
            "then one WebSocket session: the English testdata clips, 0.5 s of silence after "
            f"each, repeated to {session.audio_s / 60:.1f} min, fed at up to "
            f"{args.speed:g}x real time and at most {args.max_lead:g} s ahead of the committed "
            f"text. Wall {wall_s / 60:.1f} min. Load average (1 min) during the run: "
            + (f"min {min(loads):.2f}, max {max(loads):.2f}, mean {np.mean(loads):.2f}"
               if loads else "-") + ". " + args.code_state,
        ],
    )  # fmt: skip
    lines += ["", "## Server process", ""]
    lines += common.table(
        ["when", "RSS MB", "open fds", "threads"],
        [[s["when"], f"{s['rss_mb']:.1f}", s["fds"], s["threads"]] for s in samples],
    )
    lines += [
        "",
        f"Growth start -> end: RSS {last['rss_mb'] - first['rss_mb']:+.1f} MB, fds "
        f"{last['fds'] - first['fds']:+d}, threads {last['threads'] - first['threads']:+d}. "
        f"After the first 100 requests (warm) -> end: RSS {last['rss_mb'] - warm['rss_mb']:+.1f} "
        f"MB, fds {last['fds'] - warm['fds']:+d}, threads {last['threads'] - warm['threads']:+d}.",
        "",
        "## REST",
        "",
        f"{len(rest)} requests: "
        + ", ".join(f"{n} x {s or 'transport error'}" for s, n in sorted(statuses.items()))
        + f" (expected {expected_415} x 415). {len(wrong)} of {len(good)} transcripts with WER "
        "> 10 % against the jfk reference.",
        "",
        "## WebSocket session",
        "",
        f"{session.audio_s:.0f} s of audio sent; close code {session.close_code}; errors "
        f"{session.errors or 'none'}; {session.exception or 'no client exception'}; "
        + (f"WER {session_wer[0]:.2f} % ({session_wer[1]} / {session_wer[2]} words); "
           if session_wer else "no transcript.text.done; ")
        + (f"commit lag (stream time) p50 {percentile(session.commit_lags_s, 0.5):.1f} s, "
           f"p95 {percentile(session.commit_lags_s, 0.95):.1f} s; "
           if session.commit_lags_s else "")
        + (f"close -> done {session.finalize_s:.2f} s." if session.finalize_s else ""),
    ]  # fmt: skip
    return lines


async def run_long(server: Server, args: argparse.Namespace, load_before: float) -> list[str]:
    assert server.process is not None
    pid = server.process.pid
    clip = next(c for c in short_clips() if c.name == "jfk.wav")
    samples = [{"when": "start (loaded, idle)", **process_sample(pid)}]
    loads: list[float] = []
    stop = asyncio.Event()

    async def load_sampler() -> None:
        while not stop.is_set():
            loads.append(common.load1())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 30)

    t0 = time.perf_counter()
    sampler = asyncio.create_task(load_sampler())
    rest = await run_long_rest(server.url, pid, clip, args, samples)
    samples.append({"when": "after the REST requests", **process_sample(pid)})
    pieces, reference = speech_sequence(args.session_minutes * 60)
    ws_url = server.url.replace("http://", "ws://") + "/v1/audio/stream"
    session = await stream_session(
        ws_url, "long", session_frames(pieces, samples, pid), speed=args.speed,
        max_lead_s=args.max_lead,
    )  # fmt: skip
    await asyncio.sleep(2)  # let the server settle (threads of the closed session end)
    samples.append({"when": "end (idle)", **process_sample(pid)})
    stop.set()
    await sampler
    wall = time.perf_counter() - t0
    return long_report(rest, session, reference, samples, args, load_before, wall, loads)


def main() -> None:
    args = parse_args()
    load_before = common.start_load(args)
    if args.mode == "load":
        clips = short_clips()
        server = launch(args)
        try:
            baseline = asyncio.run(quiet_baseline(server.url, clips))
            results = asyncio.run(run_load(server.url, clips, args))
            alive = server.process is not None and server.process.poll() is None
            health = httpx.get(server.url + "/health", timeout=10).status_code if alive else None
        finally:
            server.stop()
        lines = load_report(results, clips, baseline, args, load_before)
        lines += ["", f"After the run: server alive {alive}, /health {health}."]
        common.write(args.out_dir / "hardening_load.md", lines)
    else:
        session_limit = args.session_minutes * 60 + 300  # the last clip may pass the target
        server = launch(args, {"STT_STREAM_MAX_SESSION_S": f"{session_limit:.0f}"})
        try:
            lines = asyncio.run(run_long(server, args, load_before))
        finally:
            server.stop()
        common.write(args.out_dir / "hardening_long.md", lines)


if __name__ == "__main__":
    main()
