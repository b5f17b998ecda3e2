"""Voice activity detection with Silero VAD (v5/v6 ONNX model) on onnxruntime's CPU provider.

The model (`silero_vad.onnx`, 2.3 MB, from the `silero-vad` wheel; `python -m app.export vad`
puts it at `models/silero_vad.onnx`) is a small recurrent network over 16 kHz audio:

    in:  input f32 [B, 64 + 512]   64 samples of context (the previous chunk's tail) + one
                                   chunk of 512 samples (32 ms)
         state f32 [2, B, 128]     recurrent state, zeros at the start of a stream
         sr    i64 []              16000
    out: output f32 [B, 1]         speech probability of the chunk
         stateN f32 [2, B, 128]    the state for the next chunk

`SileroVad` holds the (thread-safe, stateless) session; the per-stream state lives in
`VadState`. The network's decision depends on the input level (read speech at -50 dB is
"silence" to it), so quiet input is first lifted to a common level (never attenuated; at most
`MAX_GAIN`): whether something is speech does not depend on how loud it was recorded. A whole
clip (`probs`) gets one gain per 30 s block, from the block's loud chunks, so the levels inside a
block keep their relation (noise before speech stays below it); a stream (`VadStream`) gets a gain
that follows the loudest recent chunk (instant attack, `LEVEL_RELEASE_S` release). `VadStream`
turns audio of any length into per-chunk probabilities and speech start/end events with hysteresis;
`app.engine.vad_spans.speech_timestamps` finds the speech regions of a whole clip (the REST
`vad_filter` option). Times are in samples at 16 kHz unless a name says seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from app.engine.audio import is_narrowband, resample
from app.engine.vad_sequence import PARTS, SequencePass, sequence_file
from app.runtime.contract import SAMPLE_RATE
from app.runtime.graphs import Graph, OrtGraph

log = logging.getLogger(__name__)

NARROW_RATE = 8000  # the model's other branch: 256-sample chunks, 32 samples of context
RATES = (SAMPLE_RATE, NARROW_RATE)
CHUNK_SAMPLES = 512  # 32 ms: the model's fixed chunk at 16 kHz
CONTEXT_SAMPLES = 64  # samples of the previous chunk prepended to each chunk
STATE_SHAPE = (2, 1, 128)
VAD_FILE = "silero_vad.onnx"
CHUNK_S = CHUNK_SAMPLES / SAMPLE_RATE
# automatic gain in front of the network (level-independent decisions)
TARGET_RMS = 0.1  # quieter input is lifted until its loud chunks have this RMS
LEVEL_RELEASE_S = 3.0  # streams: time constant of the followed level's decay after a loud chunk
BLOCK_S = 30.0  # whole clips: one gain per block this long
LOUD_QUANTILE = 0.9  # whole clips: a block's level is this quantile of its chunks' RMS
MAX_GAIN = 3000.0  # +70 dB at most; digital silence stays silence
_RELEASE = float(np.exp(-CHUNK_S / LEVEL_RELEASE_S))  # per chunk


def sequence_files(path: Path) -> dict[int, tuple[Path, Path]]:
    """Where the sequence graphs of the Silero file `path` live: per rate, in `PARTS` order."""
    return {rate: tuple(sequence_file(path, rate, part) for part in PARTS) for rate in RATES}


class VadModelError(RuntimeError):
    """The VAD model file is missing or is not the expected Silero graph."""


@dataclass(frozen=True)
class VadOptions:
    """Thresholds of the speech/silence decision (seconds for durations).

    threshold: a chunk with probability >= threshold starts (or continues) speech.
    neg_threshold: while in speech, a chunk below it counts as silence (hysteresis; the default
        is threshold - 0.15, as in silero-vad). Chunks in between keep the current state.
    min_silence_s: silence needed after speech before the speech region ends.
    min_speech_s: shorter regions are dropped (clicks, coughs).
    speech_pad_s: padding added on each side of a region (kept inside the audio).
    max_speech_s: longer regions are split at their longest inner pause (whole-clip mode only).
    """

    threshold: float = 0.5
    neg_threshold: float | None = None
    min_silence_s: float = 0.5
    min_speech_s: float = 0.25
    speech_pad_s: float = 0.2
    max_speech_s: float = float("inf")

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"VAD threshold must be in (0, 1), got {self.threshold}")
        neg = self.neg_threshold
        if neg is None:
            object.__setattr__(self, "neg_threshold", max(self.threshold - 0.15, 0.01))
        elif not 0.0 < neg <= self.threshold:
            raise ValueError(f"neg_threshold must be in (0, threshold], got {neg}")
        for name in ("min_silence_s", "min_speech_s", "speech_pad_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_speech_s <= 0:
            raise ValueError(f"max_speech_s must be > 0, got {self.max_speech_s}")

    @property
    def exit_threshold(self) -> float:
        assert self.neg_threshold is not None
        return self.neg_threshold


@dataclass
class VadState:
    """The recurrent state of one audio stream (not shared between streams)."""

    state: np.ndarray = field(default_factory=lambda: np.zeros(STATE_SHAPE, np.float32))
    context: np.ndarray = field(default_factory=lambda: np.zeros((1, CONTEXT_SAMPLES), np.float32))
    level: float = 0.0  # the followed RMS level of the input (before the gain)

    def reset(self) -> None:
        self.state = np.zeros(STATE_SHAPE, np.float32)
        self.context = np.zeros((1, CONTEXT_SAMPLES), np.float32)
        self.level = 0.0

    def follow(self, chunk: np.ndarray) -> float:
        """Follow the level with `chunk` f32 [512]; the gain that lifts it to TARGET_RMS."""
        rms = float(np.sqrt(np.mean(np.square(chunk, dtype=np.float64))))
        self.level = max(rms, self.level * _RELEASE)
        return lift(self.level)


def lift(level: float) -> float:
    """The gain for input whose loud parts have RMS `level`: >= 1, at most MAX_GAIN."""
    return min(max(TARGET_RMS / level, 1.0), MAX_GAIN) if level > 0 else 1.0


def block_gains(chunks: np.ndarray) -> np.ndarray:
    """Per-chunk gain of f32 [n, chunk] audio -> f32 [n]: one gain per BLOCK_S block."""
    rms = np.sqrt(np.mean(np.square(chunks, dtype=np.float64), axis=1))  # [n]
    per_block = round(BLOCK_S / CHUNK_S)
    gains = np.empty(rms.shape[0], np.float32)
    for start in range(0, rms.shape[0], per_block):
        block = rms[start : start + per_block]
        gains[start : start + per_block] = lift(float(np.quantile(block, LOUD_QUANTILE)))
    return gains


class SileroVad:
    """The loaded Silero VAD graph; one instance serves any number of streams and threads."""

    def __init__(self, graph: Graph, path: Path, sequence: SequencePass) -> None:
        self.graph = graph
        self.path = path
        self.sequence = sequence
        self._rates = {r: np.array(r, dtype=np.int64) for r in RATES}
        names_in = set(graph.input_names)
        names_out = list(graph.output_names)
        if names_in != {"input", "state", "sr"} or names_out[:2] != ["output", "stateN"]:
            raise VadModelError(
                f"{path} is not a Silero VAD v5/v6 graph: inputs {sorted(names_in)}, "
                f"outputs {names_out}"
            )

    @classmethod
    def load(cls, path: Path | str) -> SileroVad:
        """Load `silero_vad.onnx` on ONNX Runtime's CPU provider, one thread each: the graph
        itself (it is tiny; streams call it chunk by chunk) and its sequence graphs for whole
        clips (`app.engine.vad_sequence`), built beside it at `make models`."""
        path = Path(path)
        sequence = sequence_files(path)
        for needed in (path, *(f for files in sequence.values() for f in files)):
            if not needed.is_file():
                raise VadModelError(
                    f"VAD model file {needed} not found: build it with `make models` "
                    f"(or `python -m app.export vad --models-dir {path.parent}`)"
                )
        t0 = time.perf_counter()
        try:
            graph = OrtGraph(path, threads=1)
            # one thread each: the LSTM steps chunk after chunk, and a second thread's hand-offs
            # cost more than it gives; the fronts of two blocks run side by side instead
            sequences = {
                r: (OrtGraph(front, 1), OrtGraph(lstm, 1)) for r, (front, lstm) in sequence.items()
            }
        except Exception as e:  # onnxruntime raises its own exception types
            raise VadModelError(f"could not load the VAD model {path}: {e}") from e
        vad = cls(graph, path, SequencePass(sequences))
        log.info("VAD model %s loaded in %.1f ms", path.name, 1e3 * (time.perf_counter() - t0))
        return vad

    def run(
        self, x: np.ndarray, state: np.ndarray, rate: int = SAMPLE_RATE
    ) -> tuple[np.ndarray, np.ndarray]:
        """One step of B independent streams: x f32 [B, 64 + 512] (context + chunk; at
        NARROW_RATE [B, 32 + 256], the same 32 ms), state f32 [2, B, 128] -> (speech
        probabilities f32 [B], the next state [2, B, 128])."""
        feeds = {"input": x, "state": state, "sr": self._rates[rate]}
        out, new_state = self.graph.run(("output", "stateN"), feeds)
        return out[:, 0], new_state

    def chunk_prob(self, chunk: np.ndarray, state: VadState, gain: float | None = None) -> float:
        """Speech probability of one chunk f32 [512], times `gain` (None: the gain that
        follows the stream's level); advances `state`."""
        if gain is None:
            gain = state.follow(chunk)
        chunk = chunk.reshape(1, CHUNK_SAMPLES) * np.float32(gain)
        x = np.concatenate([state.context, chunk], axis=1)  # [1, 576]
        prob, state.state = self.run(x, state.state)
        state.context = x[:, -CONTEXT_SAMPLES:]
        return float(prob[0])

    def probs(self, audio: np.ndarray, *, follow: bool = False) -> np.ndarray:
        """Speech probability of every 512-sample chunk of f32 [N] audio -> f32 [ceil(N / 512)]
        (the last chunk zero-padded).

        Quiet audio is lifted block by block (`block_gains`) and the clip runs through the
        sequence graph (`app.engine.vad_sequence`: the chunk-by-chunk probabilities).
        Narrowband audio (a telephone line: nothing above 4.2 kHz) goes through the model's
        8 kHz branch, at 8 kHz: at 16 kHz Silero rates such speech 0.04 (median; 0.97 at
        8 kHz) and drops it, while every non-speech clip of the robustness corpus stays below
        0.55 either way. With `follow`, chunk after chunk at 16 kHz with the gain a stream gets
        (what `VadStream` sees, for comparisons).
        """
        audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
        n = -(-audio.shape[0] // CHUNK_SAMPLES)
        padded = np.zeros(n * CHUNK_SAMPLES, np.float32)
        padded[: audio.shape[0]] = audio
        chunks = padded.reshape(n, CHUNK_SAMPLES)
        if not follow:
            rate, context = SAMPLE_RATE, CONTEXT_SAMPLES
            if is_narrowband(audio):
                narrow = resample(padded, SAMPLE_RATE, NARROW_RATE)
                chunks = np.zeros((n, CHUNK_SAMPLES // 2), np.float32)  # the same 32 ms chunks
                chunks.reshape(-1)[: narrow.shape[0]] = narrow[: chunks.size]
                rate, context = NARROW_RATE, CONTEXT_SAMPLES // 2
            gained = chunks * block_gains(chunks)[:, None]
            return self.sequence.probs(gained, context, rate)
        state = VadState()
        return np.array([self.chunk_prob(c, state) for c in chunks], np.float32)


# ---- streaming ------------------------------------------------------------------------------


@dataclass(frozen=True)
class VadEvent:
    """Speech began (`kind="start"`), paused (`"pause"`), came back after a pause before the
    silence became an end (`"resume"`) or ended (`"end"`) at `sample` (absolute, 16 kHz).

    An end is reported `min_silence_s` after the last speech chunk, a pause `pause_s` after it
    (when the stream watches for pauses; once per silence, before its end); the `sample` of
    both is where the silence began (not padded). A resume is at its first speech chunk.
    """

    kind: Literal["start", "pause", "resume", "end"]
    sample: int

    @property
    def seconds(self) -> float:
        return self.sample / SAMPLE_RATE


class VadStream:
    """Streaming speech detection: feed audio of any length, get start/end events.

    Audio is cut into 32 ms chunks (a remainder shorter than a chunk waits for the next call);
    each chunk's probability goes through the hysteresis of `VadOptions`: speech starts at a
    chunk >= threshold, and ends once chunks below `neg_threshold` have lasted `min_silence_s`
    (chunks between the two thresholds neither start nor end silence). Speech shorter than
    `min_speech_s` still produces a start and an end: the caller decides what to do with it.
    With `pause_s` (shorter than `min_silence_s`), a silence inside speech that lasts `pause_s`
    is reported as a pause first: the words before it are whole, though the speaker may go on;
    if they do before the silence is an end, that is reported as a resume.
    Memory is constant (at most one partial chunk is kept).
    """

    def __init__(
        self, vad: SileroVad, options: VadOptions | None = None, pause_s: float | None = None
    ) -> None:
        self.vad = vad
        self.options = options or VadOptions()
        if pause_s is not None and pause_s <= 0:
            raise ValueError(f"pause_s must be > 0, got {pause_s}")
        self.state = VadState()
        self._rest = np.zeros(0, np.float32)
        self.position = 0  # absolute samples consumed into chunks
        self.in_speech = False
        self.speech_start: int | None = None
        self._silence_start: int | None = None
        self._paused = False  # the current silence was reported as a pause
        self.last_prob = 0.0
        self._lock = threading.Lock()
        self._min_silence = round(self.options.min_silence_s * SAMPLE_RATE)
        self._pause = None if pause_s is None else round(pause_s * SAMPLE_RATE)

    def feed(self, audio: np.ndarray) -> list[VadEvent]:
        """Consume f32 [N] 16 kHz audio; return the events of the completed chunks."""
        with self._lock:
            audio = np.asarray(audio, dtype=np.float32).reshape(-1)
            if self._rest.shape[0]:
                audio = np.concatenate([self._rest, audio])
            n_chunks = audio.shape[0] // CHUNK_SAMPLES
            events: list[VadEvent] = []
            for i in range(n_chunks):
                chunk = audio[i * CHUNK_SAMPLES : (i + 1) * CHUNK_SAMPLES]
                prob = self.vad.chunk_prob(chunk, self.state)
                self.last_prob = prob
                event = self._decide(prob, self.position)
                if event is not None:
                    events.append(event)
                self.position += CHUNK_SAMPLES
            self._rest = audio[n_chunks * CHUNK_SAMPLES :].copy()
            return events

    def _decide(self, prob: float, chunk_start: int) -> VadEvent | None:
        opts = self.options
        if prob >= opts.threshold:
            resumed = self._paused
            self._silence_start = None
            self._paused = False
            if not self.in_speech:
                self.in_speech = True
                self.speech_start = chunk_start
                return VadEvent("start", chunk_start)
            return VadEvent("resume", chunk_start) if resumed else None
        if self.in_speech and prob < opts.exit_threshold:
            if self._silence_start is None:
                self._silence_start = chunk_start
            silence = chunk_start + CHUNK_SAMPLES - self._silence_start
            if silence >= self._min_silence:
                end = self._silence_start
                self.in_speech = False
                self.speech_start = None
                self._silence_start = None
                self._paused = False
                return VadEvent("end", end)
            if self._pause is not None and silence >= self._pause and not self._paused:
                self._paused = True
                return VadEvent("pause", self._silence_start)
        return None

    @property
    def silence_start(self) -> int | None:
        """Where the silence the speech is in began (None: speech, or no speech at all)."""
        return self._silence_start


# ---- whole clips ----------------------------------------------------------------------------
