"""One long-form transcription's state across its 30 s windows (`Transcriber` reads and advances
it window by window)."""

from __future__ import annotations

import threading
from dataclasses import InitVar, dataclass, field

import numpy as np

from app.engine.mel import HOP_LENGTH
from app.engine.tokenizer import Tokenizer
from app.runtime.contract import SAMPLE_RATE
from app.service.transcription.options import TranscriptionOptions
from app.service.transcription.results import TranscriptionStats
from app.service.transcription.text_stream import TextStream

PROMPT_TOKENS = 223  # the previous text a window is prompted with: n_text_ctx // 2 - 1
MAX_HOTWORD_TOKENS = PROMPT_TOKENS // 2  # the rest stays for the previous text


@dataclass
class LongForm:
    """One transcription's state across its windows: what it reads (the mel, its options and
    language), where it is (`seek`, in mel frames) and what it carries from window to window
    (the text that prompts the next window, segment ids, the last word's end)."""

    mel: np.ndarray  # [n_mels, content_frames + N_FRAMES]
    content_frames: int
    options: TranscriptionOptions
    language: str
    stats: TranscriptionStats
    cancel: threading.Event | None
    tok: InitVar[Tokenizer]  # encodes the options' initial prompt and hotwords
    first_cross: list[np.ndarray] | None = None  # window 0's, when language detection made it
    stream: TextStream | None = None
    seek: int = 0
    segment_id: int = 0
    all_tokens: list[int] = field(default_factory=list)
    prompt_reset_since: int = 0
    hotwords: list[int] = field(init=False)
    last_speech: float = 0.0  # end of the last word, for word timing
    rng: np.random.Generator = field(init=False)

    def __post_init__(self, tok: Tokenizer) -> None:
        self.rng = np.random.default_rng(self.options.seed)
        prompt, hotwords = self.options.initial_prompt, self.options.hotwords
        if prompt:  # the initial prompt and the hotwords prompt every window
            self.all_tokens.extend(
                tok.encode(" " + prompt.strip()) if isinstance(prompt, str) else prompt
            )
        self.hotwords = tok.encode(" " + hotwords)[:MAX_HOTWORD_TOKENS] if hotwords else []

    @property
    def duration(self) -> float:
        return self.content_frames * HOP_LENGTH / SAMPLE_RATE
