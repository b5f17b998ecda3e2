"""The live settings' defaults and ranges, defined once: the server's settings (`app.config`),
`StreamingOptions`, AlignAtt and both protocols' turn-detection parsers read them here.

Durations in seconds; the protocols speak milliseconds (`Bound.ms`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.engine.vad import VadOptions


@dataclass(frozen=True)
class Bound:
    """A setting's default and its closed range [low, high]."""

    default: float
    low: float
    high: float

    def problem(self, value: float) -> str | None:
        """Why `value` is out of range, or None (NaN is out of range too)."""
        if not self.low <= value <= self.high:
            return f"must be in [{self.low:g}, {self.high:g}], got {value}"
        return None

    def check(self, name: str, value: float) -> None:
        """ValueError naming `name` when `value` is out of range."""
        if (problem := self.problem(value)) is not None:
            raise ValueError(f"{name} {problem}")

    @property
    def ms(self) -> Bound:
        """The same bound in milliseconds."""
        return Bound(round(self.default * 1000), round(self.low * 1000), round(self.high * 1000))


PolicyName = Literal["local_agreement", "alignatt"]  # when a decoded word is committed
POLICIES: tuple[str, ...] = ("local_agreement", "alignatt")
STEP_S = Bound(1.0, 0.1, 10.0)  # new audio between two passes
# AlignAtt: attention this far before the buffer's end commits (benchmarks/results/live_edge.md)
EDGE_S = Bound(0.5, 0.0, 5.0)
PAUSE_S = Bound(0.3, 0.0, 10.0)  # a pause inside speech that commits the words before it; 0 off
PREROLL_S = Bound(0.3, 0.0, 2.0)  # audio kept before detected speech (prefix_padding_ms)
SPEECH_THRESHOLD = Bound(VadOptions.threshold, 0.0, 1.0)  # the VAD's speech probability
TURN_SILENCE_S = Bound(VadOptions.min_silence_s, 0.1, 10.0)  # silence that ends a turn
