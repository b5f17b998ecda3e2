"""Client half of the Docker smoke test (docker/ci-smoke.sh): the official openai SDK against the
container. Not collected by pytest (no `test_` prefix); run it against a live server:

    .venv/bin/python tests/docker_smoke.py --base-url http://127.0.0.1:8000/v1 --model tiny.en \
        --expect "ask not what your country can do for you" tests/data/audio/jfk.wav
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from openai import OpenAI


def normalise(text: str) -> str:
    """Lower case, punctuation dropped, single spaces: `"Ask not, what"` -> `"ask not what"`."""
    return " ".join(re.sub(r"[^a-z0-9']+", " ", text.lower()).split())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("audio", type=Path)
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--expect", required=True, help="phrase the text must contain")
    parser.add_argument("--api-key", default="x")
    parser.add_argument("--wyoming", type=int, help="also transcribe over Wyoming on this port")
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key=args.api_key, timeout=300, max_retries=0)
    served = [m.id for m in client.models.list().data if m.loaded]  # type: ignore[attr-defined]
    print(f"models served: {served}")
    if args.model not in served:
        print(f"FAIL: model {args.model!r} is not served", file=sys.stderr)
        return 1

    start = time.perf_counter()
    with args.audio.open("rb") as f:
        result = client.audio.transcriptions.create(model=args.model, file=f)
    elapsed = time.perf_counter() - start
    print(f"transcription ({elapsed:.2f} s): {result.text!r}")

    if normalise(args.expect) not in normalise(result.text):
        print(f"FAIL: the text does not contain {args.expect!r}", file=sys.stderr)
        return 1
    print("transcription OK")

    # The page's static files are package data: they must be in the image's install too.
    root = args.base_url.removesuffix("/").removesuffix("/v1")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for path in ("/health", "/", "/static/app.js"):
        try:
            with opener.open(root + path, timeout=30) as r:
                body = r.read()
                print(f"GET {path}: {r.status}, {len(body)} bytes")
                if path == "/health":
                    print(f"  {body.decode()[:400]}")
        except urllib.error.HTTPError as e:
            print(f"FAIL: GET {path}: {e.code}", file=sys.stderr)
            return 1
    if args.wyoming:
        text = asyncio.run(wyoming_transcript(args.wyoming, args.audio))
        print(f"Wyoming transcript: {text!r}")
        if normalise(args.expect) not in normalise(text):
            print(f"FAIL: the Wyoming text does not contain {args.expect!r}", file=sys.stderr)
            return 1
    return 0


async def wyoming_transcript(port: int, audio: Path) -> str:
    """The audio (16-bit WAV) sent over the Wyoming protocol, as Home Assistant does."""
    import wave

    from wyoming.asr import Transcript
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient

    with wave.open(str(audio)) as w:
        rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
        pcm = w.readframes(w.getnframes())
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(AudioStart(rate=rate, width=width, channels=channels).event())
        step = rate // 10 * width * channels
        for offset in range(0, len(pcm), step):
            chunk = AudioChunk(rate=rate, width=width, channels=channels,
                               audio=pcm[offset : offset + step])  # fmt: skip
            await client.write_event(chunk.event())
        await client.write_event(AudioStop().event())
        while (event := await asyncio.wait_for(client.read_event(), 120)) is not None:
            if Transcript.is_type(event.type):
                return Transcript.from_event(event).text
    return ""


if __name__ == "__main__":
    sys.exit(main())
