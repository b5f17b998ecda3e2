"""Live speakers over the Realtime protocol at real-time pace: labels, the count, how soon a
turn's speakers come, and what they cost the server.

The seeded devcorpus conversations of `live_speakers.py` (2, 3, 4 readers none of whom the live
threshold was chosen on, 3 utterances each, 0.6-1.2 s apart) are streamed to a real server
(`/v1/realtime`, 24 kHz PCM in 100 ms frames at real-time pace, server VAD) twice, alternated:
with `transcription.speakers: true` and without (plain streaming). Per conversation:

- right: the share of speech time whose `...segment` label is its reader's under the best
  one-to-one mapping of labels to readers over the whole session (`live_speakers.mapped_share`);
  labels: how many the session used;
- delay: from the end of an item's audio (where the server VAD heard the turn stop, sent by the
  client then) to its first `...segment` event, and to its `...completed` (the transcript) for
  comparison; median and max over the items (an utterance with a long pause inside is two);
- CPU: the server process's CPU seconds (user + system) for the session, with and without
  speakers (the difference is the speaker models' cost of the session).

    .venv/bin/python -m benchmarks.live_speakers_realtime --model base --seeds 1 \
        --out benchmarks/results/live_speakers_realtime.md
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soxr
from websockets.asyncio.client import connect

from benchmarks import live_speakers
from benchmarks.common import MODELS_DIR, header, load1, report, table
from benchmarks.server import launch_server

WIRE_RATE = 24000
FRAME_S = 0.1
SEGMENT = "conversation.item.input_audio_transcription.segment"
COMPLETED = "conversation.item.input_audio_transcription.completed"


@dataclass
class Session:
    t0: float = 0.0  # when the first frame was sent
    events: list[tuple[float, dict]] = field(default_factory=list)
    cpu_s: float = 0.0

    def of(self, kind: str) -> list[tuple[float, dict]]:
        return [(t, e) for t, e in self.events if e["type"] == kind]


async def stream(url: str, audio: np.ndarray, speakers: bool, spans: int) -> Session:
    """The conversation at real-time pace, then quiet until every utterance's item completed
    (and has its segments, with speakers)."""
    pcm = (np.clip(soxr.resample(audio, 16000, WIRE_RATE), -1, 1) * 32767).astype("<i2")
    wire = pcm.tobytes() + bytes(2 * WIRE_RATE * 2)  # 2 s of quiet after the last turn
    session = Session()
    transcription = {"model": "gpt-4o-transcribe-diarize"} if speakers else {}
    update = {"type": "session.update", "session": {"type": "transcription", "audio": {
        "input": {"transcription": transcription}}}}  # fmt: skip
    async with connect(url, max_size=None) as ws:
        await ws.send(json.dumps(update))
        done = asyncio.Event()

        async def receive() -> None:
            async for message in ws:
                event = json.loads(message)
                session.events.append((time.monotonic(), event))
                spoken = {e["item_id"] for _, e in session.of(COMPLETED) if e["transcript"]}
                segmented = {e["item_id"] for _, e in session.of(SEGMENT)}
                if len(spoken) >= spans and (not speakers or spoken <= segmented):
                    done.set()

        receiver = asyncio.create_task(receive())
        step = int(FRAME_S * WIRE_RATE) * 2
        session.t0 = time.monotonic()
        for i, offset in enumerate(range(0, len(wire), step)):
            delay = session.t0 + i * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            chunk = base64.b64encode(wire[offset : offset + step]).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
        await asyncio.wait_for(done.wait(), 300)
        receiver.cancel()
    return session


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU seconds so far (/proc/PID/stat, its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_session(url: str, pid: int, talk: live_speakers.Conversation, speakers: bool) -> Session:
    ws_url = url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    before = cpu_seconds(pid)
    session = asyncio.run(stream(ws_url, talk.audio, speakers, len(talk.spans)))
    session.cpu_s = cpu_seconds(pid) - before
    return session


def utterance_of(talk: live_speakers.Conversation, start: float, end: float) -> int:
    shared = [min(end, b) - max(start, a) for a, b, _ in talk.spans]
    return int(np.argmax(shared))


def scores(talk: live_speakers.Conversation, session: Session) -> dict:
    """Labels per utterance (by the segments' times); each item's delays from the end of its
    audio (`speech_stopped`'s `audio_end_ms`, sent then at real-time pace) to its first
    segment and to its transcript."""
    said: list[dict[str, float]] = [defaultdict(float) for _ in talk.spans]
    for _, e in session.of(SEGMENT):
        k = utterance_of(talk, e["start"], e["end"])
        said[k][e["speaker"]] += e["end"] - e["start"]
    ended = {e["item_id"]: session.t0 + e["audio_end_ms"] / 1000
             for _, e in session.of("input_audio_buffer.speech_stopped")}  # fmt: skip
    first: dict[str, float] = {}
    for t, e in session.of(SEGMENT):
        first.setdefault(e["item_id"], t)
    spoken = {e["item_id"]: t for t, e in session.of(COMPLETED) if e["transcript"]}
    return {
        "right": live_speakers.mapped_share(talk, [dict(s) for s in said]),
        "labels": live_speakers.labels_used([dict(s) for s in said]),
        "segment_delays": [t - ended[item] for item, t in first.items() if item in ended],
        "text_delays": [t - ended[item] for item, t in spoken.items() if item in ended],
        "items": len(spoken),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--counts", default="2,3,4")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    load_before = load1()
    server = launch_server(args.model, MODELS_DIR, {"STT_LOG_LEVEL": "WARNING"})
    pid = server.process.pid
    pool = live_speakers.readers()
    rows, delays, texts, cpu = [], [], [], {True: 0.0, False: 0.0}
    try:
        for count in (int(c) for c in args.counts.split(",")):
            for seed in (int(s) for s in args.seeds.split(",")):
                talk = live_speakers.conversation(pool, count, seed)
                order = (True, False) if (count + seed) % 2 else (False, True)
                sessions = {speakers: run_session(server.url, pid, talk, speakers)
                            for speakers in order}  # fmt: skip
                found = scores(talk, sessions[True])
                seconds = len(talk.audio) / 16000
                delays += found["segment_delays"]
                texts += found["text_delays"]
                for speakers in (True, False):
                    cpu[speakers] += sessions[speakers].cpu_s
                row = (count, seed, f"{seconds:.0f}", found["items"], f"{found['right']:.3f}",
                       found["labels"],
                       f"{statistics.median(found['segment_delays']):.2f}",
                       f"{max(found['segment_delays']):.2f}",
                       f"{statistics.median(found['text_delays']):.2f}",
                       f"{sessions[True].cpu_s:.1f}", f"{sessions[False].cpu_s:.1f}",
                       f"{load1():.2f}")  # fmt: skip
                rows.append(row)
                print(row, flush=True)
    finally:
        server.stop()
    head = ["speakers", "seed", "seconds", "items", "right", "labels", "segment delay median s",
            "segment delay max s", "transcript delay median s", "CPU s with speakers",
            "CPU s plain", "load after"]  # fmt: skip
    lines = header(f"Live speakers over Realtime at real-time pace ({args.model})", load_before)
    lines += ["", *table(head, rows), ""]
    lines.append(
        f"- Over all turns: a turn's first segment {statistics.median(delays):.2f} s (median), "
        f"{max(delays):.2f} s (max) after its audio ended; its transcript "
        f"{statistics.median(texts):.2f} s. Server CPU with speakers {cpu[True]:.1f} s, plain "
        f"{cpu[False]:.1f} s: +{100 * (cpu[True] / cpu[False] - 1):.0f} %."
    )
    report(args.out, lines, rows)


if __name__ == "__main__":
    main()
