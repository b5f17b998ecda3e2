"""When a live stream's next pass runs: `PassSchedule`, decisions as data (no audio, no model).

A pass decodes the whole buffer, so it costs the same whenever it runs; what it buys depends on
when. Passes run every `step_s` of new audio. With AlignAtt the last pass also says when its
first uncommitted word can be committed (its attention peak + the edge: `CommitPolicy.due_s`);
waiting for the rest of the step then only delays that word, by up to a step. So a pass runs
early, once that moment was heard, if

- at least `min_step_s` of new audio came (passes stay apart), and
- the last pass took at most `share` of the new audio's duration: early passes use the time
  the machine has to spare. A model whose pass takes longer (base on two cores), or a server
  loaded with streams (passes slow down), keeps to the step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PassSchedule:
    """step_s: new audio between regular passes; min_step_s: between an early pass and the
    last; share: most of the new audio's duration the last pass may have taken (seconds)."""

    step_s: float = 1.0
    min_step_s: float = 0.5
    share: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise ValueError(f"share must be in (0, 1], got {self.share}")

    def due(
        self, new_s: float, heard_s: float, first_due_s: float | None, last_pass_s: float
    ) -> bool:
        """new_s: audio since the last pass; heard_s: stream seconds where the audio ends;
        first_due_s: when the policy could commit the first uncommitted word (None: no
        estimate); last_pass_s: wall time the last pass took."""
        if new_s >= self.step_s:
            return True
        if first_due_s is None or heard_s < first_due_s:
            return False
        return new_s >= max(self.min_step_s, last_pass_s / self.share)
