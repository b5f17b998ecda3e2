"""Fetch the Smart Turn v3.2 end-of-turn model (Pipecat's, BSD-2-Clause) from the `pipecat-ai`
wheel: `pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx` and the wheel's licence,
checked by sha256, into `<models-dir>/turn/` (`app.engine.turn` runs it; nothing of Pipecat is
imported)."""

from __future__ import annotations

from pathlib import Path

from app.engine.turn import TURN_FILE
from app.export.sources import extract_checked, sha256_of

TURN_PACKAGE = {
    "name": "pipecat-ai",
    "version": "1.14.0",
    "sha256": "0352f504b44e78bdf524e45af4bc759601c835b9b7dc195efe5e03384b974a44",
}
MEMBERS = {  # wheel member -> (file in models/turn/, sha256)
    "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx": (
        Path(TURN_FILE).name,
        "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
    ),
    "pipecat_ai-1.14.0.dist-info/licenses/LICENSE": (
        "LICENSE",
        "e31a733ecb79cbffafd5474e964e5eca15e0a0876a42b1d7253b51b198eb61aa",
    ),
}


def fetch_turn(models_dir: Path, cache_dir: Path) -> tuple[Path, bool]:
    """Put the checked model and its licence in `models_dir/turn/`; (model path, True if
    anything was written)."""
    folder = (models_dir / TURN_FILE).parent
    written = False
    for member, (name, sha256) in MEMBERS.items():
        target = folder / name
        if target.is_file() and sha256_of(target) == sha256:
            continue
        extract_checked(TURN_PACKAGE, member, sha256, target, cache_dir)
        written = True
    return models_dir / TURN_FILE, written
