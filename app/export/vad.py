"""Fetch the Silero VAD model: `silero_vad/data/silero_vad.onnx` from the `silero-vad` wheel.

The wheel is downloaded once with `pip download --no-deps` into the weights cache, checked by
sha256 (wheel and model file), and the model copied to `<models-dir>/silero_vad.onnx`; its
sequence graphs (`vad_sequence`) are written beside it.
"""

from __future__ import annotations

from pathlib import Path

from app.engine.vad import VAD_FILE, sequence_files
from app.export.errors import BuildError
from app.export.sources import extract_checked, sha256_of
from app.export.vad_sequence import SequenceGraphError, write_sequence_graphs

VAD_PACKAGE = {
    "name": "silero-vad",
    "version": "6.2.3",
    "sha256": "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
}
VAD_MEMBER = "silero_vad/data/silero_vad.onnx"
VAD_SHA256 = "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"


def fetch_vad(models_dir: Path, cache_dir: Path, *, force: bool = False) -> tuple[Path, bool]:
    """Put the checked model at `models_dir/silero_vad.onnx`; (path, True if it was written)."""
    target = models_dir / VAD_FILE
    if target.is_file() and not force and sha256_of(target) == VAD_SHA256:
        return target, bool(ensure_sequence_graphs(models_dir))
    extract_checked(VAD_PACKAGE, VAD_MEMBER, VAD_SHA256, target, cache_dir)
    write_sequence_graphs(target)
    return target, True


def ensure_sequence_graphs(models_dir: Path) -> list[Path]:
    """The sequence graphs of `models_dir/silero_vad.onnx` written where they are missing (a
    folder made before they were built at `make models`); those written. Nothing without the
    model file; `BuildError` for a file that is not Silero's."""
    target = models_dir / VAD_FILE
    graphs = [f for files in sequence_files(target).values() for f in files]
    if not target.is_file() or all(graph.is_file() for graph in graphs):
        return []
    try:
        return write_sequence_graphs(target)
    except SequenceGraphError as e:
        raise BuildError(f"{target} is not a Silero VAD v5/v6 graph: {e}") from e
