"""How one live stream is decoded: `StreamingOptions`, validated once; the server's defaults
every live session starts from (`LiveDefaults`, the one place the default VAD is decided); and
the one bound on the rate of client audio (`pcm_rate`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from app.engine.vad import VadOptions
from app.runtime.contract import N_SAMPLES_PER_WINDOW, SAMPLE_RATE
from app.service.errors import Rejected
from app.service.live.bounds import EDGE_S, PAUSE_S, POLICIES, PREROLL_S, STEP_S, PolicyName
from app.service.live.policy import CommitPolicy, make_policy
from app.service.live.turns import TurnRules

WINDOW_S = N_SAMPLES_PER_WINDOW / SAMPLE_RATE  # 30.0
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
        first pass (then fixed) for multilingual ones, among `languages` when set.
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
    turn: semantic turn detection (`app.service.live.turns`): the VAD's end of speech is a
        candidate the turn model judges; None: the VAD's end of speech ends the turn.
    word_timestamps: measure word times (an aligner call per pass) instead of estimating them;
        always on with AlignAtt, which needs the attention.
    """

    language: str | None = None
    languages: tuple[str, ...] = ()
    task: str = "transcribe"
    step_s: float = STEP_S.default
    trim_s: float = 10.0
    max_buffer_s: float = 20.0
    policy: PolicyName = "alignatt"
    edge_s: float = EDGE_S.default
    vad: VadOptions | None = field(default_factory=VadOptions)
    pause_s: float | None = PAUSE_S.default
    preroll_s: float = PREROLL_S.default
    context_gap_s: float = 3.0
    prompt: str | None = None
    condition_on_committed: bool = False
    no_speech_threshold: float | None = 0.6
    log_prob_threshold: float = -1.0
    kv_cache: str = "concat"
    word_timestamps: bool = False
    turn: TurnRules | None = None

    def __post_init__(self) -> None:
        STEP_S.check("step_s", self.step_s)
        if not 0 < self.trim_s <= self.max_buffer_s <= WINDOW_S - 2:
            raise ValueError(
                f"need 0 < trim_s <= max_buffer_s <= {WINDOW_S - 2:g} s, got "
                f"{self.trim_s} and {self.max_buffer_s}"
            )
        if self.pause_s is not None:  # None: off
            PAUSE_S.check("pause_s", self.pause_s)
            if self.pause_s == 0:
                raise ValueError("pause_s must be > 0 (None: off)")
        PREROLL_S.check("preroll_s", self.preroll_s)
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', got {self.task!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        EDGE_S.check("edge_s", self.edge_s)
        if self.turn is not None and self.vad is None:
            raise ValueError("semantic turn detection needs the VAD (its pauses are judged)")

    @property
    def aligned(self) -> bool:
        """Passes are aligned (attention per word)."""
        return self.word_timestamps or self.commit_policy.reads_attention

    @cached_property
    def commit_policy(self) -> CommitPolicy:
        """The policy `policy` names, with this stream's edge."""
        return make_policy(self.policy, self.edge_s)


@dataclass(frozen=True)
class LiveDefaults:
    """The server's settings every live session starts from; a protocol's configuration sets the
    rest (`options`).

    vad: the default speech detection of a session (None: no VAD model, or STT_VAD_FILTER off);
    vad_installed: the VAD model is loaded, so a session may ask for it; turn_installed: the
    turn model is installed, so a session may ask for semantic turn detection.
    """

    step_s: float
    policy: PolicyName
    edge_s: float
    pause_s: float | None
    no_speech_threshold: float | None
    kv_cache: str
    vad: VadOptions | None
    vad_installed: bool
    turn_installed: bool = False

    def options(
        self,
        *,
        language: str | None,
        languages: tuple[str, ...] = (),
        task: str = "transcribe",
        pace: tuple[float, float] | None = None,
        vad: VadOptions | Literal["default"] | None = "default",
        preroll_s: float = PREROLL_S.default,
        pause_s: float | Literal["default"] | None = "default",
        prompt: str | None = None,
        word_timestamps: bool = False,
        turn: TurnRules | None = None,
    ) -> StreamingOptions:
        """A session's options: the session's own choices on these defaults ("default": the
        server's speech detection or pause; `pace`: (step_s, edge_s), None: the server's)."""
        step_s, edge_s = pace or (self.step_s, self.edge_s)
        return StreamingOptions(
            language=language,
            languages=languages,
            task=task,
            step_s=step_s,
            policy=self.policy,
            edge_s=edge_s,
            vad=self.vad if vad == "default" else vad,
            pause_s=self.pause_s if pause_s == "default" else pause_s,
            preroll_s=preroll_s,
            prompt=prompt,
            no_speech_threshold=self.no_speech_threshold,
            kv_cache=self.kv_cache,
            word_timestamps=word_timestamps,
            turn=turn,
        )
