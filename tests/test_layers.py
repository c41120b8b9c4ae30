"""Layers run one way: every import of every product module (including imports inside
functions) goes to the module's own layer or a lower one. The test names each module that
imports upward and what it imports, all of them at once.

Layers, lowest first: the core (`tracetrain`, but its CLI), `schemas`, the platform (`infra`,
but the stack), `producers`, `streams`, `learner`, `serving`, `examples`, the stack
(`infra.stack`, `infra.profiles`, `infra.cli`, `infra.smoke`), `demo`, `optimizer` (it scores prompts through the demo's tasks
and eval engine), and the entry points (`tracetrain.cli`,
`tracetrain.__main__`).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# (module or package prefix, layer); the longest matching prefix decides.
LAYERS = {
    "tracetrain": 0,
    "schemas": 1,
    "infra": 2,
    "producers": 3,
    "streams": 4,
    "learner": 5,
    "serving": 6,
    "examples": 7,
    "infra.stack": 8,
    "infra.profiles": 8,
    "infra.cli": 8,
    "infra.smoke": 8,
    "demo": 9,
    "optimizer": 10,
    "tracetrain.cli": 11,
    "tracetrain.__main__": 11,
}
LAYER_NAMES = {0: "core", 1: "schemas", 2: "platform", 3: "producers", 4: "streams",
               5: "learner", 6: "serving", 7: "examples", 8: "stack", 9: "demo", 10: "optimizer",
               11: "entry"}


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return LAYERS[prefix]
    return None


def product_packages() -> list[str]:
    """The top-level packages pyproject.toml installs."""
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return sorted(pattern.rstrip("*") for pattern in find["include"])


def product_modules() -> dict[str, Path]:
    modules = {}
    for package in product_packages():
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported_modules(module: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every product module `module` imports, anywhere in the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from infra import stack` imports the module infra.stack, not just infra
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if sub in known else base))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append((node.lineno, node.args[0].value))
    return sorted({(line, name) for line, name in found if layer_of(name) is not None})


def test_every_product_package_has_a_layer():
    unplaced = [p for p in product_packages() if layer_of(p) is None]
    assert not unplaced, f"installed packages with no layer in LAYERS: {unplaced}"


def test_no_module_imports_a_layer_above_its_own():
    modules = product_modules()
    known = set(modules)
    violations = []
    for module, path in modules.items():
        own = layer_of(module)
        if own is None:
            continue  # a package with no layer: test_every_product_package_has_a_layer
        for line, name in imported_modules(module, path, known):
            if layer_of(name) > own:
                violations.append(
                    f"{path.relative_to(REPO)}:{line}: {module} ({LAYER_NAMES[own]}) imports "
                    f"{name} ({LAYER_NAMES[layer_of(name)]})")
    assert not violations, f"{len(violations)} upward imports:\n" + "\n".join(violations)


def test_the_walk_sees_imports_in_functions_relative_and_by_name(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text("import json\n\ndef f():\n    from infra import stack\n    import demo.run\n"
                    "    from .. import learner\n    importlib.import_module('serving.cli')\n")
    assert imported_modules("streams.join.mod", path, {"infra.stack"}) == [
        (4, "infra.stack"), (5, "demo.run"), (6, "streams"), (7, "serving.cli")]
