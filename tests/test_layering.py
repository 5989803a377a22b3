"""The layering, checked on the source: the FUSE layer and the modules under it reach the
backend only through the catalog (one door: timeouts, accounting and cache bookkeeping in one
place), the core never names a backend, and backends never touch pyfuse3."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: The modules that own a backend's lifecycle or are the door itself.
DOOR = {"catalog.py", "daemon.py", "registry.py", "backend.py", "identities.py"}


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), str(path))


def test_the_core_reaches_the_backend_only_through_the_catalog():
    offenders = []
    for path in sorted((REPO / "rucio_fs").rglob("*.py")):
        if path.name in DOOR or "testing" in path.parts:
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Attribute) and node.attr == "backend":
                owner = node.value  # catalog.backend, self.catalog.backend, wb.catalog.backend
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if name == "catalog":
                    offenders.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and any(
                    alias.name in ("open_backend", "load") for alias in node.names):
                offenders.append(f"{path.name}:{node.lineno} opens a backend of its own")
    assert not offenders, f"reaching around the catalog: {offenders}"


def test_the_core_never_names_a_backend_and_backends_never_touch_pyfuse3():
    for path in sorted((REPO / "rucio_fs").rglob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert "backends" not in node.module.split("."), f"{path.name} imports a backend"
    for path in sorted((REPO / "backends").rglob("*.py")):
        text = path.read_text()
        assert "pyfuse3" not in text, f"{path.name} touches pyfuse3"


#: The core modules a backend (built-in or plugin) may import: the plugin API (docs/plugins.md).
PLUGIN_API = {"rucio_fs.backend", "rucio_fs.errors", "rucio_fs.http", "rucio_fs.identity",
              "rucio_fs.kept_file", "rucio_fs.options", "rucio_fs.tasks", "rucio_fs.xroot"}


def test_backends_use_only_the_plugin_api():
    for path in sorted((REPO / "backends").rglob("*.py")):
        for node in ast.walk(_tree(path)):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if module and module.startswith("rucio_fs.") and ".backends" not in module:
                assert module in PLUGIN_API, f"{path}: imports {module}"


def _modules() -> dict[str, Path]:
    """Every module of the installed package by dotted name (``backends/`` installs as
    ``rucio_fs.backends``)."""
    found = {}
    for root, package in ((REPO / "rucio_fs", "rucio_fs"),
                          (REPO / "backends", "rucio_fs.backends")):
        for path in root.rglob("*.py"):
            parts = [p for p in path.relative_to(root).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the package ``name`` imports anywhere (typing-only imports too)."""
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                keep = len(base) - node.level + (path.name == "__init__.py")
                module = ".".join(base[:keep] + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def test_no_import_circles():
    """A lower module that needs something of a higher one owns a Protocol (or takes a
    callback) instead of importing it: every import points down."""
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    circles = []
    state: dict[str, str] = {}  # "open" while on the path, "done" after

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                circles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles:\n" + "\n".join(circles)


#: The core's packages, lowest first: each may import the top-level modules and the packages
#: before it (docs/architecture.md); the top-level modules (the plugin API, the mount's
#: configuration, background tasks, the Redis client) import no package.
LAYERS = ["observe", "cache", "data", "catalog", "write", "users", "fuse", "cli"]


def test_each_package_imports_only_the_packages_below_it():
    modules = _modules()
    offenders = []
    for name, path in modules.items():
        parts = name.split(".")
        if len(parts) < 2 or parts[1] in ("backends", "testing", "__main__"):
            continue
        rank = LAYERS.index(parts[1]) if len(parts) > 2 else -1
        for target in _imports(name, path, modules):
            tparts = target.split(".")
            if len(tparts) > 2 and tparts[1] in LAYERS and LAYERS.index(tparts[1]) > rank:
                offenders.append(f"{name} -> {target}")
    assert not offenders, offenders


def test_the_package_installs_every_package_of_the_tree():
    """pyproject.toml lists the packages (backends/ installs as rucio_fs.backends): a package
    left out would be missing from a non-editable install."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert found == listed, (sorted(found - listed), sorted(listed - found))
