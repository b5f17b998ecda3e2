"""The robustness corpus: real-world conditions made from the repository's own clips.

Deterministic (every random draw comes from a seeded generator), so a re-run writes the same
samples. Speech: the English test clips (jfk.wav, five LibriSpeech utterances, the 60 s earnings
clip) in each condition below, one file per clip and condition, with the clip's reference text.
Non-speech: 20 s clips that must give no text at all.

    speech conditions   original; level -20 / -40 / -50 dB; clipped (+12 dB, hard clip);
                        white and pink noise at SNR 20 / 10 / 5 dB; telephone band (300-3400 Hz
                        at 8 kHz); stereo with one channel silent; DC offset (+0.2); m4a, webm
                        and mp4 encodes (PyAV); and one file with 20 s of silence between the
                        sentences (all clips in a row)
    non-speech          digital silence; hiss (-60 dBFS); white, pink and brown noise (-20 dBFS);
                        mains hum; clicks; kitchen-like clatter; music (chords; a drum pattern);
                        the repository's no-speech clip (picovoice_empty.wav)

    .venv/bin/python -m benchmarks.robustness_corpus [--out .cache/bench/robustness]

At SNR 20 and 10 dB (the conditions the noise target covers) each clip gets `NOISE_DRAWS`
independent noise draws: the corpus has ~207 words per condition, so one word is 0.48 points of
a cell's WER — coarser than the +0.3 point target; three draws make it 0.16.

Writes the audio files and `manifest.jsonl` (file, kind "speech" | "nonspeech", condition, clip,
text) into the folder; `benchmarks/robustness.py` builds it when missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import soundfile as sf

from app.engine.audio import decode_audio
from benchmarks.common import AUDIO, CACHE, SPEECH_CLIPS, english_clips
from tests.media import (
    CONTAINERS,
    RATE,
    at_snr,
    chords,
    clatter,
    clicks,
    coloured,
    db,
    drums,
    encode_container,
    hum,
    telephone,
    white,
)

SEED = 20261127
OUT = CACHE / "robustness"
NONSPEECH_S = 20.0
GAP_S = 20.0  # silence between sentences in the "long silences" file
NOISE_DRAWS = 3  # noise realisations per clip at SNR >= 10 dB (the first is the shared stream's)
VERSION = 3  # bump when the corpus changes: a cached corpus of another version is rebuilt


# ---- the corpus ---------------------------------------------------------------------------------


def speech_conditions(rng: np.random.Generator) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """name -> transform of f64 [N] speech at 16 kHz (mono; "stereo" gives [N, 2])."""
    conditions: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "original": lambda x: x,
        "level -20 dB": lambda x: x * db(-20),
        "level -40 dB": lambda x: x * db(-40),
        "level -50 dB": lambda x: x * db(-50),
        "clipped +12 dB": lambda x: np.clip(x * db(12), -1.0, 1.0),
        "telephone 8 kHz": telephone,
        "stereo, one channel silent": lambda x: np.stack([x, np.zeros_like(x)], axis=1),
        "DC offset +0.2": lambda x: x + 0.2,
    }
    for snr in (20, 10, 5):
        conditions[f"white noise SNR {snr}"] = lambda x, s=snr: at_snr(x, white(rng, x.shape[0]), s)
        conditions[f"pink noise SNR {snr}"] = lambda x, s=snr: at_snr(
            x, coloured(rng, x.shape[0], 1.0), s
        )
    return conditions


def nonspeech(rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = int(NONSPEECH_S * RATE)
    return {
        "digital silence": np.zeros(n),
        "hiss -60 dBFS": db(-60) * white(rng, n),
        "white noise -20 dBFS": db(-20) * white(rng, n),
        "pink noise -20 dBFS": db(-20) * coloured(rng, n, 1.0),
        "brown noise -20 dBFS": db(-20) * coloured(rng, n, 2.0),
        "mains hum": hum(n),
        "clicks": clicks(rng, n),
        "kitchen clatter": clatter(rng, n),
        "music: chords": chords(n),
        "music: drums": drums(rng, n),
        "no-speech clip": decode_audio(AUDIO / "picovoice_empty.wav").astype(np.float64),
    }


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")


def build(out: Path = OUT) -> Path:
    """Write the corpus into `out` (once per VERSION); returns its manifest path."""
    manifest = out / "manifest.jsonl"
    stamp = out / "VERSION"
    if manifest.is_file() and stamp.is_file() and stamp.read_text().strip() == str(VERSION):
        return manifest
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    texts = {e["file"].removeprefix("audio/"): e["text"] for e in english_clips()}
    clips = {name: decode_audio(AUDIO / name).astype(np.float64) for name in SPEECH_CLIPS}
    entries: list[dict] = []

    def write(name: str, audio: np.ndarray, **fields: str) -> None:
        path = out / name
        sf.write(path, np.asarray(audio, np.float32), RATE, subtype="FLOAT")
        entries.append({"file": name, **fields})

    for condition, transform in speech_conditions(rng).items():
        for clip, audio in clips.items():
            name = f"{slug(condition)}__{Path(clip).stem}.wav"
            write(name, transform(audio), kind="speech", condition=condition, clip=clip,
                  text=texts[clip])  # fmt: skip
    for draw in range(1, NOISE_DRAWS):  # own generators: the files above stay as they were
        extra = speech_conditions(np.random.default_rng([SEED, draw]))
        for condition, transform in extra.items():
            if "noise" not in condition or condition.endswith("SNR 5"):
                continue
            for clip, audio in clips.items():
                name = f"{slug(condition)}__{Path(clip).stem}__draw{draw}.wav"
                write(name, transform(audio), kind="speech", condition=condition, clip=clip,
                      text=texts[clip])  # fmt: skip
    for kind in ("m4a", "webm", "mp4"):
        for clip, audio in clips.items():
            name = f"{kind}__{Path(clip).stem}{CONTAINERS[kind][2]}"
            (out / name).write_bytes(encode_container(audio.astype(np.float32), RATE, kind))
            entries.append({"file": name, "kind": "speech", "condition": f"{kind} encode",
                            "clip": clip, "text": texts[clip]})  # fmt: skip
    gap = np.zeros(int(GAP_S * RATE))
    joined = np.concatenate([piece for a in clips.values() for piece in (a, gap)][:-1])
    write("long_silences__all.wav", joined, kind="speech", condition="20 s silences between",
          clip="all", text=" ".join(texts[c] for c in clips))  # fmt: skip
    for condition, audio in nonspeech(rng).items():
        write(f"nonspeech__{slug(condition)}.wav", audio, kind="nonspeech", condition=condition,
              clip="", text="")  # fmt: skip

    manifest.write_text("".join(json.dumps(e) + "\n" for e in entries))
    stamp.write_text(f"{VERSION}\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    manifest = build(args.out)
    lines = manifest.read_text().splitlines()
    print(f"{len(lines)} files -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
