"""How one live stream is decoded: `StreamingOptions`, validated once; the server's defaults
every live session starts from (`LiveDefaults`, the one place the default VAD is decided); and
the one bound on the rate of client audio (`pcm_rate`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from app.engine.vad import VadOptions
from app.runtime.contract import N_SAMPLES_PER_WINDOW, SAMPLE_RATE
from app.service.errors import Rejected

WINDOW_S = N_SAMPLES_PER_WINDOW / SAMPLE_RATE  # 30.0
PolicyName = Literal["local_agreement", "alignatt"]
POLICIES: tuple[str, ...] = ("local_agreement", "alignatt")
MIN_RATE, MAX_RATE = 8000, 192000  # Hz of the raw audio a live client may send


def rate_problem(rate: object) -> str | None:
    """Why `rate` cannot be the sample rate of a live stream's raw audio, or None when it can
    (a whole number of Hz from MIN_RATE to MAX_RATE)."""
    if isinstance(rate, bool) or not isinstance(rate, int):
        return f"must be a whole number of Hz, not {rate!r}"
    if not MIN_RATE <= rate <= MAX_RATE:
        return f"must be between {MIN_RATE} and {MAX_RATE} Hz, not {rate}"
    return None


def pcm_rate(rate: object, param: str) -> int:
    """`rate` as a live stream's sample rate; `Rejected` (invalid_value, naming `param`) unless
    `rate_problem` finds none."""
    problem = rate_problem(rate)
    if problem is not None:
        raise Rejected("invalid_value", f"{param} {problem}", param=param)
    assert isinstance(rate, int)
    return rate


@dataclass(frozen=True)
class StreamingOptions:
    """How one stream is decoded (seconds for durations). Validated once (ValueError).

    language: fixed for the session; None = English for English-only models, detected on the
        first pass (then fixed) for multilingual ones.
    step_s: new audio between two passes. trim_s: the buffer is cut at a committed segment end
        once longer than this. max_buffer_s: beyond it a pass commits up to its last closed
        segment without waiting for the policy (the buffer never exceeds one 30 s window).
    policy: when a decoded word is committed (`app.service.live.policy`): "local_agreement"
        (two passes agree on it) or "alignatt" (the alignment heads looked at audio at least
        `edge_s` before the buffer's end while it was read).
    vad: speech detection options; None = no VAD (every step decodes, nothing finalizes at
        pauses). pause_s: a silence this long inside speech (shorter than the VAD's
        `min_silence_s`, which ends the turn) commits every word before it; None = the words
        wait for the policy or the turn's end. preroll_s: audio kept before detected speech.
        context_gap_s: finalized audio is kept as context for the next words until a silence
        this long.
    prompt: text that conditions every pass (names, spelling). condition_on_committed: also
        prompt with the last committed text (off: it feeds repetition loops).
    word_timestamps: measure word times (an aligner call per pass) instead of estimating them;
        always on with AlignAtt, which needs the attention.
    """

    language: str | None = None
    task: str = "transcribe"
    step_s: float = 1.0
    trim_s: float = 10.0
    max_buffer_s: float = 20.0
    policy: PolicyName = "alignatt"
    edge_s: float = 0.7
    vad: VadOptions | None = field(default_factory=VadOptions)
    pause_s: float | None = 0.3
    preroll_s: float = 0.3
    context_gap_s: float = 3.0
    prompt: str | None = None
    condition_on_committed: bool = False
    no_speech_threshold: float | None = 0.6
    log_prob_threshold: float = -1.0
    kv_cache: str = "concat"
    word_timestamps: bool = False

    def __post_init__(self) -> None:
        if not 0.1 <= self.step_s <= 10.0:
            raise ValueError(f"step_s must be in [0.1, 10] seconds, got {self.step_s}")
        if not 0 < self.trim_s <= self.max_buffer_s <= WINDOW_S - 2:
            raise ValueError(
                f"need 0 < trim_s <= max_buffer_s <= {WINDOW_S - 2:g} s, got "
                f"{self.trim_s} and {self.max_buffer_s}"
            )
        if self.pause_s is not None and not 0 < self.pause_s <= 10.0:
            raise ValueError(f"pause_s must be in (0, 10] seconds, got {self.pause_s}")
        if not 0 <= self.preroll_s <= 2.0:
            raise ValueError(f"preroll_s must be in [0, 2], got {self.preroll_s}")
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', got {self.task!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if not 0.0 <= self.edge_s <= 5.0:
            raise ValueError(f"edge_s must be in [0, 5] seconds, got {self.edge_s}")

    @property
    def aligned(self) -> bool:
        """Passes are aligned (attention per word)."""
        return self.word_timestamps or self.policy == "alignatt"


@dataclass(frozen=True)
class LiveDefaults:
    """The server's settings every live session starts from; a protocol's configuration sets the
    rest (`options`).

    vad: the default speech detection of a session (None: no VAD model, or STT_VAD_FILTER off);
    vad_installed: the VAD model is loaded, so a session may ask for it.
    """

    step_s: float
    policy: PolicyName
    edge_s: float
    pause_s: float | None
    no_speech_threshold: float | None
    kv_cache: str
    vad: VadOptions | None
    vad_installed: bool

    def options(self, **session: Any) -> StreamingOptions:
        """A session's options: these defaults, then the session's own fields (language, vad,
        prompt, ...); a field it leaves out keeps the default."""
        fields: dict[str, Any] = {
            "step_s": self.step_s,
            "policy": self.policy,
            "edge_s": self.edge_s,
            "pause_s": self.pause_s,
            "no_speech_threshold": self.no_speech_threshold,
            "kv_cache": self.kv_cache,
            "vad": self.vad,
        }
        return StreamingOptions(**(fields | session))
