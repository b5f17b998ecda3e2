"""Home Assistant's view: audio-stop -> transcript over the Wyoming protocol, ours vs
wyoming-faster-whisper on the same weights and threads.

Ours: a real uvicorn server with `STT_WYOMING_PORT` and `STT_WYOMING_ENDPOINTING=false` (the
client's `audio-stop` ends the command, as the peer without `--vad-endpointing`; default
settings otherwise). The peer:
`wyoming-faster-whisper` (PyPI) in `.venv-peer` beside faster-whisper, started offline on the
CTranslate2 folder the peer benchmarks use, int8, greedy (`--beam-size 1`, as ours answers a
Wyoming utterance), the same `--cpu-threads`, English. Each utterance is sent as Home Assistant
sends a voice command: `transcribe`, `audio-start`, 100 ms chunks at real-time pace (`--pace`),
then `--silences` seconds of silence (Home Assistant's pipeline stops a command after hearing
about 0.7 s of silence; 0 = the clip ends and the client stops at once), `audio-stop`; the time
from sending `audio-stop` to receiving `transcript` is the latency.
Clips: the repo's short ones (3-11 s). Systems alternate clip by clip; `--rounds` rounds.
Then `wyoming-bench stt` (PyPI, in `.venv-peer`) runs against both servers at once on the same
clips as its corpus (16-bit WAV + reference text), non-streaming and streaming; its report is
kept as `results/wyoming_bench_<model>.txt`.

    make bench-setup      # .venv-peer with faster-whisper and wyoming-faster-whisper
    .venv/bin/python -m benchmarks.wyoming_latency --models tiny.en,base

Writes benchmarks/results/wyoming_latency.md.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe

from benchmarks import common
from benchmarks.common import REPO
from benchmarks.server import free_port, launch_server

CLIPS = common.SHORT_CLIPS
RATE = 16000
CHUNK = RATE // 10  # 100 ms


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--silences", default="0,0.7", help="trailing silence (s) before audio-stop")
    p.add_argument("--pace", type=float, default=1.0, help="x real time when sending audio")
    p.add_argument("--models-dir", type=Path, default=REPO / "models")
    p.add_argument(
        "--before",
        type=Path,
        default=None,
        metavar="DIR",
        help="also run the service from this source tree (a git worktree of an older "
        "commit), as the system 'ours before', alternating with the others",
    )
    p.add_argument(
        "--before-models-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="model folders for --before (default: --models-dir)",
    )
    common.add_args(p)
    return p.parse_args()


def pcm16(path: Path) -> bytes:
    audio, rate = sf.read(path, dtype="float32", always_2d=True)
    audio = soxr.resample(audio.mean(axis=1), rate, RATE)
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


async def utterance(port: int, pcm: bytes, pace: float) -> tuple[float, str]:
    """(seconds from audio-stop to transcript, its text)."""
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcribe(language="en").event())
        await client.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        step = CHUNK * 2
        started = time.monotonic()
        for i, offset in enumerate(range(0, len(pcm), step)):
            chunk = AudioChunk(rate=RATE, width=2, channels=1, audio=pcm[offset : offset + step])
            await client.write_event(chunk.event())
            ahead = started + (i + 1) * 0.1 / pace - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
        await client.write_event(AudioStop().event())
        stopped = time.monotonic()
        while (event := await asyncio.wait_for(client.read_event(), 120)) is not None:
            if Transcript.is_type(event.type):
                return time.monotonic() - stopped, Transcript.from_event(event).text
    raise RuntimeError("the server closed without a transcript")


async def answers(port: int) -> bool:
    try:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            return (await asyncio.wait_for(client.read_event(), 5)) is not None
    except OSError:
        return False


def wait_for_port(port: int, process: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the peer exited with {process.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0 and asyncio.run(answers(port)):
                return
        time.sleep(0.5)
    raise SystemExit(f"nothing answers on port {port}")


def start_peer(
    model: str, threads: int, data_dir: Path, extra: Sequence[str] = ()
) -> tuple[subprocess.Popen, int]:
    """wyoming-faster-whisper on `model` (`extra`: more of its arguments)."""
    python = REPO / ".venv-peer" / "bin" / "python"
    if not python.is_file():
        raise SystemExit("the peer venv is missing: run `make bench-setup`")
    port = free_port()
    process = subprocess.Popen(
        [str(python), "-m", "wyoming_faster_whisper", "--uri", f"tcp://127.0.0.1:{port}",
         "--model", str(common.peer_model_dir(model)), "--data-dir", str(data_dir),
         "--local-files-only", "--stt-library", "faster-whisper", "--compute-type", "int8",
         "--beam-size", "1", "--cpu-threads", str(threads), "--language", "en", *extra],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for_port(port, process)
    return process, port


def write_corpus(folder: Path) -> Path:
    """The clips as wyoming-bench's corpus: <stem>.wav (16-bit, 16 kHz) + <stem>.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in CLIPS:
        path = common.TESTDATA / "audio" / name
        stem = folder / Path(name).stem
        audio = np.frombuffer(pcm16(path), "<i2")
        sf.write(stem.with_suffix(".wav"), audio, RATE, subtype="PCM_16")
        stem.with_suffix(".txt").write_text(common.clip_reference(path) or "")
    return folder


def wyoming_bench(ports: dict[str, int], corpus: Path, rounds: int) -> str:
    """`wyoming-bench stt` against every server at once; its report (stdout)."""
    tool = REPO / ".venv-peer" / "bin" / "wyoming-bench"
    if not tool.is_file():
        return "wyoming-bench is not installed: run `make bench-setup`\n"
    servers = [f"127.0.0.1:{port}" for port in ports.values()]
    out = subprocess.run(
        [str(tool), "stt", *servers, "--corpus", str(corpus), "--rounds", str(rounds)],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    names = ", ".join(f"127.0.0.1:{p} = {name}" for name, p in ports.items())
    return f"$ wyoming-bench stt {' '.join(servers)} --corpus CLIPS --rounds {rounds}\n" + (
        f"({names})\n\n{out.stdout}{out.stderr}"
    )


def start_ours(model: str, models_dir: Path, threads: int, checkout: Path = REPO) -> tuple:
    port = free_port()
    settings = {"STT_THREADS": str(threads), "STT_WYOMING_PORT": str(port),
                "STT_WYOMING_HOST": "127.0.0.1", "STT_WYOMING_ENDPOINTING": "false"}  # fmt: skip
    return launch_server(model, models_dir, settings, checkout), port


def measure(model: str, args: argparse.Namespace) -> dict:
    ours, port = start_ours(model, args.models_dir, args.threads)
    servers = [ours]
    systems = {"ours": port}
    if args.before:
        before_dir = args.before_models_dir or args.models_dir
        before, before_port = start_ours(model, before_dir, args.threads, args.before)
        servers.append(before)
        systems["ours before"] = before_port
    with tempfile.TemporaryDirectory() as data_dir:
        peer, peer_port = start_peer(model, args.threads, Path(data_dir))
        systems["wyoming-faster-whisper"] = peer_port
        clips = {name: pcm16(common.TESTDATA / "audio" / name) for name in CLIPS}
        silences = [float(s) for s in args.silences.split(",")]
        cells = [(c, s) for s in silences for c in clips]
        samples: dict[str, dict[tuple, list[float]]] = {s: {c: [] for c in cells} for s in systems}
        texts: dict[str, dict[tuple, str]] = {s: {} for s in systems}
        load = common.load1()
        try:
            for name in systems:  # warm-up
                asyncio.run(utterance(systems[name], clips[CLIPS[0]], 8.0))
            for r in range(args.rounds):
                for i, (clip, silence) in enumerate(cells):
                    audio = clips[clip] + b"\0\0" * int(RATE * silence)
                    for name in common.rotate(list(systems), r + i):
                        seconds, text = asyncio.run(utterance(systems[name], audio, args.pace))
                        samples[name][(clip, silence)].append(seconds)
                        texts[name][(clip, silence)] = text
                        print(f"[{model}] {clip} +{silence:g} s {name}: {seconds:.3f} s",
                              file=sys.stderr)  # fmt: skip
            corpus = write_corpus(Path(data_dir) / "corpus")
            bench = wyoming_bench(systems, corpus, args.rounds)
            (args.out_dir / f"wyoming_bench_{model}.txt").write_text(bench)
            print(bench, file=sys.stderr)
        finally:
            for server in servers:
                server.stop()
            peer.terminate()
            peer.wait(15)
    return {
        "model": model, "samples": samples, "texts": texts, "load": load, "silences": silences,
    }  # fmt: skip


def main() -> None:
    args = parse_args()
    load = common.start_load(args)
    results = [measure(m, args) for m in args.models.split(",")]
    lines = common.header(
        "Wyoming: audio-stop -> transcript, ours vs wyoming-faster-whisper",
        load,
        [
            f"Same weights, {args.threads} threads each, greedy, English. Each utterance: "
            f"`transcribe`, `audio-start`, 100 ms chunks at {args.pace:g}x real time, "
            "`audio-stop`; latency = from sending `audio-stop` to receiving `transcript`. "
            f"{args.rounds} round(s) over {len(CLIPS)} clips per silence, systems alternating. "
            "WER against "
            "the clips' references (Whisper normaliser), all clips together.",
        ],
    )
    rows = []
    refs = [common.clip_reference(common.TESTDATA / "audio" / c) for c in CLIPS]
    for r in results:
        for silence in r["silences"]:
            medians = {}
            for name, per_cell in r["samples"].items():
                cells = [(c, silence) for c in CLIPS]
                all_s = [s for cell in cells for s in per_cell[cell]]
                medians[name] = statistics.median(all_s)
                wer = common.wer(refs, [r["texts"][name][cell] for cell in cells])[0]
                rows.append([r["model"], f"{silence:g}", name, f"{medians[name]:.3f}",
                             f"{min(all_s):.3f}–{max(all_s):.3f}", f"{wer:.1f}",
                             f"{r['load']:.2f}"])  # fmt: skip
            ratio = medians["ours"] / medians["wyoming-faster-whisper"]
            rows[-2].append(f"{ratio:.2f}")
            rows[-1].append("-")
    head = ["model", "silence s", "system", "median s", "min–max s", "WER %", "load"]
    lines += [
        "",
        *common.table([*head, "ours ÷ peer"], rows),
        "",
        "## Per clip (median s, ours / peer)",
        "",
    ]
    clip_rows = []
    for r in results:
        for silence in r["silences"]:
            for c in CLIPS:
                ours = statistics.median(r["samples"]["ours"][(c, silence)])
                theirs = statistics.median(r["samples"]["wyoming-faster-whisper"][(c, silence)])
                clip_rows.append([r["model"], f"{silence:g}", c, f"{ours:.3f}", f"{theirs:.3f}"])
    lines += common.table(["model", "silence s", "clip", "ours", "wyoming-faster-whisper"],
                          clip_rows)  # fmt: skip
    common.write(args.out_dir / "wyoming_latency.md", lines)


if __name__ == "__main__":
    main()
