"""The package's layer order (docs/architecture.md): a package imports only packages below it, never a peer or
anything above, at module level or inside a function; and no module imports another folder's private names."""

import ast
from pathlib import Path

import pytest

import replayssm_eval

# top to bottom; packages on one line are peers (neither imports the other)
LAYERS = (
    ("__main__",),
    ("commands",),
    ("cli",),
    ("regress",),
    ("accuracy", "kl"),
    ("reports",),
    ("generate",),
    ("models",),
    ("kernels",),
    ("results",),
    ("replay",),
    ("data", "options"),
    ("formats",),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
PACKAGE_DIR = Path(replayssm_eval.__file__).parent


def imported_names(path: Path) -> list[tuple[str, list[str]]]:
    """(replayssm_eval module or package, the names taken from it) of every import in a source file, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "replayssm_eval":
            if node.module == "replayssm_eval":
                found += [(f"replayssm_eval.{alias.name}", []) for alias in node.names]
            else:
                found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name.startswith("replayssm_eval.")]
    return found


def imports(path: Path) -> list[str]:
    """The replayssm_eval modules (and packages) that a source file imports."""
    return [module for module, _ in imported_names(path)]


def layer_of(module: str) -> str:
    """The top-level package (or module) of replayssm_eval that `module` belongs to."""
    return module.split(".")[1]


SOURCES = sorted(p for p in PACKAGE_DIR.rglob("*.py") if p.parent != PACKAGE_DIR or p.stem != "__init__")


def test_every_top_level_package_has_a_layer():
    names = {p.stem if p.is_file() else p.name for p in PACKAGE_DIR.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert names == set(RANK)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_imports_go_down_the_layers(path):
    source = layer_of(".".join(("replayssm_eval",) + path.relative_to(PACKAGE_DIR).with_suffix("").parts))
    upward = [module for module in imports(path)
              if layer_of(module) != source and RANK[layer_of(module)] <= RANK[source]]
    assert not upward, f"{source} (layer {RANK[source]}) imports a peer or a layer above: {upward}"


def test_an_import_inside_a_function_is_seen_and_upward_is_refused(tmp_path):
    module = tmp_path / "fake.py"
    module.write_text("import replayssm_eval.replay.config\n\n\ndef f():\n    from replayssm_eval.kl.driver import run_kl\n")
    assert imports(module) == ["replayssm_eval.replay.config", "replayssm_eval.kl.driver"]
    assert RANK[layer_of("replayssm_eval.kl.driver")] < RANK["kernels"] < RANK[layer_of("replayssm_eval.replay.config")]


def private_imports(path: Path, folder: tuple[str, ...]) -> list[str]:
    """The private names that `path`, a module in `folder` of the package, imports from modules of other folders."""
    return [f"{module}.{name}" for module, names in imported_names(path) for name in names
            if name.startswith("_") and not name.startswith("__")
            and folder not in (tuple(module.split(".")[1:-1]), tuple(module.split(".")[1:]))]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_no_private_names_from_another_folder(path):
    private = private_imports(path, path.relative_to(PACKAGE_DIR).parent.parts)
    assert not private, f"private names imported across folders: {private}"


def test_a_private_name_from_another_folder_is_seen(tmp_path):
    module = tmp_path / "fake.py"
    module.write_text("from replayssm_eval.formats.rounding import _hidden, visible\n"
                      "from replayssm_eval.kernels.mamba2.triton_step import _own_folder\n")
    assert private_imports(module, ("kernels", "mamba2")) == ["replayssm_eval.formats.rounding._hidden"]
