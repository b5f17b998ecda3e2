"""The diarization benchmark's peer: the `senko` pipeline on CPU, and pyannote.metrics' DER.

Runs in the peer's own venv (`python3.11 -m venv /work/peers/senko`, then `pip install
torch==2.13.0 senko==0.2.2 pyannote.metrics`), never in the service's; `benchmarks/diarization.py
--peer /work/peers/senko/bin/python` starts it and speaks JSON lines over its stdin/stdout
(`worker_protocol`):

- `{"op": "diarize", "audio": "<file.npy: f32 16 kHz mono>"}` -> `{"turns": [[start, end,
  speaker], ...], "seconds": s}`: senko's `merged_segments`. Senko on CPU finds speech with Silero
  VAD; `--vad pyannote` swaps in senko's own segmentation-3.0 speech detector (its CUDA backend is
  plain torch, run here on the CPU), so the peer runs the same weights as ours: segmentation-3.0
  and CAM++. Senko keeps no overlap: one speaker at a time. Senko's CPU feature library
  (`libfbank_extractor.so`) is built with AVX-512 and dies with SIGILL on an AVX2-only CPU; the
  peer then computes the same Kaldi fbank (80 bins, 25/10 ms, povey window, no dither) with
  `kaldi-native-fbank` through senko's own GPU-path feature function (`--fbank knf`).
- `{"op": "der", "reference": [[start, end, speaker], ...], "hypothesis": [...]}` ->
  pyannote.metrics' `DiarizationErrorRate(collar=0, skip_overlap=False)` components (seconds),
  the check of the benchmark's own scorer.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from worker_protocol import serve


class KaldiFbank:
    """kaldifeat's call shape (a list of 1-D waveforms -> a list of [frames, 80] log fbanks)
    over kaldi-native-fbank, for senko's GPU-path feature function."""

    def __init__(self) -> None:
        import kaldi_native_fbank as knf

        self.knf = knf
        self.options = knf.FbankOptions()
        self.options.frame_opts.dither = 0.0
        self.options.mel_opts.num_bins = 80

    def __call__(self, waves: list) -> list:
        import torch

        found = []
        for wave in waves:
            fbank = self.knf.OnlineFbank(self.options)
            fbank.accept_waveform(16000, wave.numpy().tolist())
            fbank.input_finished()
            rows = [fbank.get_frame(i) for i in range(fbank.num_frames_ready)]
            found.append(torch.tensor(np.array(rows, np.float32).reshape(-1, 80)))
        return found


def senko_diarizer(vad: str, fbank: str):
    import senko
    import torch
    from senko import config
    from senko.vad_local_pyannote import LocalSegmentationVADCuda

    diarizer = senko.Diarizer(device="cpu", vad="silero", warmup=True, quiet=True)
    if vad == "pyannote":
        paths = config.resolve_model_paths(
            None, required_fields=config.RUNTIME_PYANNOTE_CUDA_MODEL_FIELDS
        )
        diarizer.vad_backend = LocalSegmentationVADCuda(
            checkpoint_path=paths.pyannote_segmentation_senko_model_path,
            torch_device=torch.device("cpu"),
        )
        diarizer.vad_model_type = "pyannote"
    if fbank == "knf":
        diarizer.use_gpu_fbank = True
        diarizer.kaldifeat_fbank = KaldiFbank()
    return diarizer


def annotation(turns: list[list]):
    from pyannote.core import Annotation, Segment

    found = Annotation()
    for i, (start, end, speaker) in enumerate(turns):
        found[Segment(float(start), float(end)), i] = str(speaker)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vad", choices=("silero", "pyannote"), default="pyannote")
    parser.add_argument("--fbank", choices=("senko", "knf"), default="knf")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch
    from pyannote.metrics.diarization import DiarizationErrorRate

    torch.set_num_threads(args.threads)
    diarizer = senko_diarizer(args.vad, args.fbank)

    def diarize(audio: str) -> dict:
        samples = np.load(audio).astype(np.float32)
        started = time.perf_counter()
        result = diarizer.diarize_samples(samples, 16000)
        seconds = time.perf_counter() - started
        turns = (
            [[s["start"], s["end"], s["speaker"]] for s in result["merged_segments"]]
            if result
            else []
        )
        return {"turns": turns, "seconds": seconds}

    def der(reference: list[list], hypothesis: list[list]) -> dict:
        metric = DiarizationErrorRate(collar=0.0, skip_overlap=False)
        parts = metric(annotation(reference), annotation(hypothesis), detailed=True)
        return {k: float(v) for k, v in parts.items()}

    serve({"diarize": diarize, "der": der})


if __name__ == "__main__":
    main()
