"""Read a torch checkpoint (`torch.save` zip format) into numpy, without torch and running nothing.

The file is a zip holding `<prefix>/data.pkl`, a pickle of the saved object whose tensors name
storages kept beside it as `<prefix>/data/<key>` (raw little-endian bytes). The pickle is read
with an unpickler that resolves only the handful of globals a state dict needs (the tensor
rebuild function, storage types, `OrderedDict`) to numpy stand-ins and refuses every other
global, so a malicious checkpoint cannot run code: it fails with `BuildError` before any of its
objects is made.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import zipfile
from pathlib import Path

import numpy as np

from app.export.errors import BuildError

_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "DoubleStorage": np.float64,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


_MAX_ELEMENTS = 1 << 31  # per tensor: a shape beyond this is corrupt or hostile, not weights


class _Frozen:
    """What a permitted global is to the pickle: a fresh object per reference that refuses
    BUILD (the opcode that sets attributes), so a pickle cannot alter this module's objects."""

    __slots__ = ()

    def __setstate__(self, _state) -> None:
        raise BuildError("the checkpoint tries to modify a global it names: refused")


class _StorageType(_Frozen):
    """Stands for `torch.<X>Storage`: only its dtype is kept."""

    __slots__ = ("dtype",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "dtype", np.dtype(_STORAGE_DTYPES[name]))


class _Function(_Frozen):
    """Stands for a permitted callable (REDUCE calls it with the pickle's arguments)."""

    __slots__ = ("_function",)

    def __init__(self, function) -> None:
        object.__setattr__(self, "_function", function)

    def __call__(self, *args):
        return self._function(*args)


def _index(value, what: str) -> int:
    if type(value) is not int or value < 0:
        raise BuildError(f"a tensor's {what} is {value!r}, not a non-negative integer")
    return value


def _rebuild_tensor(storage, offset, size, stride, *_ignored) -> np.ndarray:
    """`torch._utils._rebuild_tensor_v2`: a view of `storage` with torch's (element) strides."""
    if not isinstance(storage, np.ndarray) or not isinstance(size, tuple | list):
        raise BuildError("a tensor without a storage or a shape: the checkpoint is corrupt")
    offset = _index(offset, "offset")
    size = tuple(_index(n, "size") for n in size)
    stride = tuple(_index(n, "stride") for n in stride)
    if len(size) != len(stride):
        raise BuildError("a tensor's shape and strides differ in length: the checkpoint is corrupt")
    if not size:
        if offset >= storage.size:
            raise BuildError("a tensor lies beyond its storage: the checkpoint is corrupt")
        return storage[offset : offset + 1].reshape(()).copy()
    if min(size) == 0:
        return np.zeros(size, storage.dtype)
    if math.prod(size) > _MAX_ELEMENTS:
        raise BuildError(f"a tensor of shape {size} is too large for a weights file")
    needed = offset + 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if needed > storage.size:
        raise BuildError("a tensor reaches beyond its storage: the checkpoint is corrupt")
    item = storage.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=size, strides=[s * item for s in stride], writeable=False
    )
    return np.ascontiguousarray(view)


def _rebuild_parameter(data, _requires_grad, _backward_hooks, *_ignored) -> np.ndarray:
    """`torch._utils._rebuild_parameter`: an `nn.Parameter` is its data."""
    return data


_FUNCTIONS = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, storages: dict[str, bytes]) -> None:
        super().__init__(io.BytesIO(data))
        self._storages = storages

    def find_class(self, module: str, name: str):
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        try:
            return _Function(_FUNCTIONS[(module, name)])
        except KeyError:
            raise BuildError(
                f"the checkpoint names {module}.{name}, which a weights file does not need: "
                "refused (only tensors, storages and dicts are read)"
            ) from None

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise BuildError(f"unknown persistent id {pid!r} in the checkpoint")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _StorageType):
            raise BuildError("a storage of unknown type in the checkpoint")
        try:
            raw = self._storages[str(key)]
        except KeyError:
            raise BuildError(f"the checkpoint lacks storage {key}") from None
        array = np.frombuffer(raw, storage_type.dtype)
        if array.size < numel:
            raise BuildError(f"storage {key} is truncated ({array.size} of {numel} elements)")
        return array[:numel]


def read_torch_checkpoint(source: Path | bytes) -> object:
    """The object saved in a torch zip checkpoint (a file or its bytes), tensors as numpy arrays."""
    name = source.name if isinstance(source, Path) else "checkpoint"
    try:
        archive = zipfile.ZipFile(source if isinstance(source, Path) else io.BytesIO(source))
    except (OSError, zipfile.BadZipFile) as e:
        raise BuildError(f"{name} is not a torch zip checkpoint ({e})") from e
    with archive:
        pickles = [m for m in archive.namelist() if m.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise BuildError(f"{name} is not a torch zip checkpoint (no single */data.pkl)")
        prefix = pickles[0][: -len("data.pkl")]
        byteorder = f"{prefix}byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder) != b"little":
            raise BuildError(f"{name} is a big-endian checkpoint: unsupported")
        storages = {
            member[len(prefix) + len("data/") :]: archive.read(member)
            for member in archive.namelist()
            if member.startswith(f"{prefix}data/")
        }
        data = archive.read(pickles[0])
    try:
        return _RestrictedUnpickler(data, storages).load()
    except BuildError as e:
        raise BuildError(f"{name}: {e}") from e
    except (pickle.UnpicklingError, EOFError, TypeError, ValueError, AttributeError) as e:
        raise BuildError(f"{name}: cannot read the checkpoint's pickle ({e})") from e


def state_dict(source: Path | bytes, key: str | None = None) -> dict[str, np.ndarray]:
    """The tensors of a checkpoint holding a state dict (at `key` of the saved dict, if given)."""
    saved = read_torch_checkpoint(source)
    if key is not None:
        saved = saved.get(key) if isinstance(saved, dict) else None
    if not isinstance(saved, dict) or not all(isinstance(v, np.ndarray) for v in saved.values()):
        raise BuildError(f"the checkpoint holds no state dict{f' at {key!r}' if key else ''}")
    return dict(saved)
