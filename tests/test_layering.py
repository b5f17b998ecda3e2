"""Imports go one way: api → service → engine → runtime, with `export` apart.

Every module under `app/` is parsed (not imported) and each `import` / `from … import` that names
an `app` package, at module level or inside a function, is checked against the layer table below.
`main`, `cli` and `__main__` are the composition roots and may wire anything together; nothing
below them imports them. `config` is read by the roots and the api layer only; it reads the
service's definitions of the settings it exposes (the live bounds). The inference runtimes
(`onnxruntime`, `openvino`) and `onnx` are imported only in `app/runtime` and `app/export`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[1] / "app"

# layer -> the app packages its modules may import (besides their own)
ALLOWED: dict[str, frozenset[str]] = {
    "runtime": frozenset(),
    "engine": frozenset({"runtime"}),
    "service": frozenset({"engine", "runtime"}),
    "api": frozenset({"service", "config"}),
    # the ONNX I/O contract it writes graphs against; the engine's audio decoding and log-mel,
    # to calibrate the encoder's int8 inputs on what the service will feed it
    "export": frozenset({"engine", "runtime"}),
    "config": frozenset({"service"}),  # the live settings' one schema (service/live/bounds)
    "static": frozenset(),
}
ROOTS = frozenset({"main", "cli", "__main__", "__init__"})


@dataclass(frozen=True)
class Violation:
    module: str  # path relative to the app folder
    line: int
    imported: str  # the dotted module named by the import

    def __str__(self) -> str:
        return f"app/{self.module}:{self.line} imports {self.imported}"


def _layer(path: Path, root: Path) -> str:
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else path.stem


def _imported_modules(tree: ast.AST, path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every app import in the module, relative imports resolved."""
    package = ["app", *path.relative_to(root).parts[:-1]]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            # `from app import service` names the package through its alias
            if name == "app":
                found += [(node.lineno, f"app.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, name))
    return [(line, name) for line, name in found if name == "app" or name.startswith("app.")]


def violations(root: Path = APP) -> list[Violation]:
    """Every import under `root` (an `app` folder) that goes against the layer table."""
    bad: list[Violation] = []
    for path in sorted(root.rglob("*.py")):
        layer = _layer(path, root)
        if layer in ROOTS:
            continue
        if layer not in ALLOWED:
            raise AssertionError(f"app/{path.relative_to(root)}: layer {layer!r} has no rule")
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, name in _imported_modules(tree, path, root):
            target = name.split(".")[1] if "." in name else "app"
            if target != layer and target not in ALLOWED[layer]:
                bad.append(Violation(str(path.relative_to(root)), line, name))
    return bad


RUNTIMES = frozenset({"onnxruntime", "openvino", "onnx"})  # the inference runtimes, ONNX itself
RUNTIME_LAYERS = frozenset({"runtime", "export"})  # the only layers that may import them


def runtime_imports(root: Path = APP) -> list[Violation]:
    """Every import of an inference runtime (or of `onnx`) outside `app/runtime` and
    `app/export`: graphs are built in export and run behind runtime."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        if _layer(path, root) in RUNTIME_LAYERS:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in RUNTIMES:
                    bad.append(Violation(str(path.relative_to(root)), node.lineno, name))
    return bad


def test_only_runtime_and_export_import_the_inference_runtimes() -> None:
    found = runtime_imports()
    assert not found, "runtime imports outside app/runtime, app/export:\n" + "\n".join(
        map(str, found)
    )


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("engine/vad.py", "import onnxruntime as ort\n"),
        ("service/x.py", "def f():\n    from openvino import Core\n"),
        ("engine/speakers/y.py", "from onnx import helper\n"),
    ],
)
def test_a_runtime_import_outside_runtime_is_caught(
    tmp_path: Path, module: str, source: str
) -> None:
    root = tmp_path / "app"
    (root / module).parent.mkdir(parents=True)
    (root / module).write_text(source)
    (root / "runtime").mkdir()
    (root / "runtime" / "ok.py").write_text("import onnxruntime\nimport openvino\n")
    assert [v.module for v in runtime_imports(root)] == [module]


def test_imports_go_one_way() -> None:
    found = violations()
    assert not found, "imports against the layering (DESIGN.md):\n" + "\n".join(map(str, found))


def test_every_layer_is_checked() -> None:
    """The table covers every package that exists (an unknown one makes `violations` raise)."""
    layers = {_layer(p, APP) for p in APP.rglob("*.py")} - ROOTS
    assert {"api", "service", "engine", "runtime", "export", "config"} <= layers <= set(ALLOWED)


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("engine/mel.py", "from app.service.transcription.transcriber import Transcriber\n"),
        ("runtime/sessions.py", "def f():\n    import app.engine.decoding\n"),
        ("api/routes/x.py", "from ...engine import audio\n"),
        ("api/deps.py", "from app import runtime\n"),
        ("service/pool.py", "from app.api.errors import ApiError\n"),
        ("export/build.py", "from app.service.transcription.transcriber import Transcriber\n"),
        ("engine/vad.py", "from app.config import Settings\n"),
    ],
)
def test_an_upward_import_is_caught(tmp_path: Path, module: str, source: str) -> None:
    root = tmp_path / "app"
    (root / module).parent.mkdir(parents=True)
    (root / module).write_text(source)
    (root / "service").mkdir(exist_ok=True)
    (root / "service" / "ok.py").write_text("from app.engine import mel\nfrom . import pool\n")
    found = violations(root)
    assert [v.module for v in found] == [module], found


def import_graph(root: Path = APP) -> dict[str, set[str]]:
    """Module -> the app modules it imports (any import, TYPE_CHECKING and function ones too)."""
    modules = {
        ".".join(["app", *p.relative_to(root).with_suffix("").parts]).removesuffix(".__init__"): p
        for p in root.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
                edges |= subs or ({node.module} & modules.keys())
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names} & modules.keys()
        graph[name] = edges - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: one path per strongly connected group of modules."""
    cycles: list[list[str]] = []
    seen: set[str] = set()
    for start in sorted(graph):
        if start in seen:
            continue
        stack, path, on_path = [(start, iter(sorted(graph[start])))], [start], {start}
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                seen.add(node)
            elif child in on_path:
                cycles.append([*path[path.index(child) :], child])
            elif child not in seen:
                stack.append((child, iter(sorted(graph.get(child, ())))))
                path.append(child)
                on_path.add(child)
    return cycles


def test_the_api_layer_has_no_import_circles() -> None:
    """(service/models/leases <-> models/manager still import each other for type hints.)"""
    graph = {m: edges for m, edges in import_graph().items() if m.startswith("app.api")}
    found = import_cycles(graph)
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_an_import_circle_is_caught(tmp_path: Path) -> None:
    root = tmp_path / "app"
    (root / "api").mkdir(parents=True)
    (root / "api" / "auth.py").write_text("from app.api.deps import get_settings\n")
    (root / "api" / "deps.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.api.metrics import M\n"
    )
    (root / "api" / "metrics.py").write_text("from app.api import auth\n")
    assert import_cycles(import_graph(root)) == [
        ["app.api.auth", "app.api.deps", "app.api.metrics", "app.api.auth"]
    ]
