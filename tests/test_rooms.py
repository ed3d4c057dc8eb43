"""The rooms of ../shared/ARCHITECTURE.md, held by reading the imports of every module."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import dagster as dg

import moe_dag
from moe_dag.orchestration.definitions import build_definitions
from moe_dag.orchestration.pipeline import Stage, stages

PACKAGE = Path(moe_dag.__file__).parent


# The floors, lowest first: a module imports only from its own room or from rooms on lower floors.
# Curation is the graph's first group; quality and mixture read what it curated and use its library
# (dedup's cluster mates, its sentence terminators), so they stand a floor above it.
FLOORS = {
    "kernels": 1,
    "storage": 1,
    "engine": 2,
    "training": 2,
    "curation": 3,
    "quality": 4,
    "mixture": 4,
    "operations": 5,
    "config": 6,
    "settings": 7,
    "assets": 8,
    "orchestration": 9,
    "cli": 10,
}
DAGSTER_ROOMS = ("assets", "orchestration", "cli")


def imported_modules(path: Path) -> list[str]:
    """Every module `path` imports, at any depth (inside functions and `if TYPE_CHECKING:` too). Of
    `from package import name`, `package.name` where that is a module of moe_dag, else `package`."""
    modules = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            named = [f"{node.module}.{alias.name}" for alias in node.names]
            modules += [name for name in named if name in MODULES] or [node.module]
            modules += [node.module] if any(name not in MODULES for name in named) else []
    return modules


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _own_module(name: str) -> str | None:
    """The module of moe_dag that an imported name lives in (`a.b.func` -> `a.b`), if any."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _imports(module: str) -> list[str]:
    owned = {_own_module(name) for name in imported_modules(MODULES[module])}
    return sorted(owned - {None, module, "moe_dag"})


IMPORTS = {module: _imports(module) for module in MODULES}


def test_every_room_has_a_floor():
    assert {_room(module) for module in MODULES} - {None} == set(FLOORS)


def test_the_root_holds_only_the_package_init_and_the_config_loader():
    assert sorted(path.name for path in PACKAGE.glob("*.py")) == ["__init__.py", "config.py"]


def test_no_import_runs_up_a_floor_or_across_one():
    offenders = [
        f"{module} -> {target}"
        for module, targets in IMPORTS.items()
        for target in targets
        if _room(module) != _room(target) and FLOORS[_room(target)] >= FLOORS[_room(module)]
    ]
    assert offenders == []


def test_no_import_circle():
    """Tarjan's strongly connected components over the module graph: each must be one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in IMPORTS[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in IMPORTS:
        if module not in index:
            visit(module)
    assert circles == []


def test_dagster_is_imported_only_in_the_dagster_rooms():
    """The libraries below run in notebooks, scripts and torchrun workers without Dagster, not even
    `dagster_pipes` (the trainer reports to Dagster through orchestration/pipes_training.py)."""
    offenders = [
        f"{path.relative_to(PACKAGE)}: {name}"
        for module, path in MODULES.items()
        if _room(module) not in DAGSTER_ROOMS
        for name in imported_modules(path)
        if name.split(".")[0].startswith("dagster")
    ]
    assert offenders == []


def test_the_config_and_the_definitions_load_without_transformers() -> None:
    """Every Dagster process (code server, run and step workers) and the CLI import these; transformers
    (and torch._dynamo through its mask builders) costs each 2 s or more, so it is imported where a
    backbone is loaded or run (quality/heads/backbone.py)."""
    code = "import sys, moe_dag.config, moe_dag.orchestration.definitions\n"
    code += "print(sorted({'transformers', 'torch._dynamo'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_dagster_private_modules_are_imported_in_one_adapter_only():
    importers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if any(module.startswith("dagster._") for module in imported_modules(path))
    )
    assert importers == ["assets/dagster_internals.py"]


def _called_name(call: ast.Call) -> str | None:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)


def _sent_to_workers(call: ast.Call) -> list[ast.expr]:
    """What a call hands to Ray workers to run: `map_tasks`'s or `iter_tasks`'s function, a `StageSpec`'s
    `make_work`."""
    name = _called_name(call)
    if name in ("map_tasks", "iter_tasks") and call.args:
        return [call.args[0]]
    if name == "StageSpec":
        return [keyword.value for keyword in call.keywords if keyword.arg == "make_work"]
    return []


def _unwrapped(node: ast.expr) -> ast.expr:
    """The function inside `functools.partial(fn, ...)`, however deep."""
    while isinstance(node, ast.Call) and _called_name(node) == "partial":
        node = node.args[0]
    return node


def test_work_sent_to_ray_workers_is_defined_in_the_libraries():
    """A worker imports the module of the function it runs: one defined in an asset module imports Dagster
    and every asset with it (seconds a worker, paid again by each new worker process)."""
    offenders = []
    for room in ("assets", "orchestration", "cli"):
        for path in sorted((PACKAGE / room).glob("*.py")):
            tree = ast.parse(path.read_text())
            defined = {
                node.name
                for node in tree.body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            }
            offenders += [
                f"{path.relative_to(PACKAGE)}:{call.lineno}: {fn.id}"
                for call in ast.walk(tree)
                if isinstance(call, ast.Call)
                for fn in map(_unwrapped, _sent_to_workers(call))
                if isinstance(fn, ast.Name) and fn.id in defined
            ]
    assert offenders == []


def test_the_adapter_was_checked_against_the_installed_dagster_series():
    """A Dagster upgrade re-checks each private name the adapter imports (then bump the series there)."""
    from moe_dag.assets.dagster_internals import CHECKED_DAGSTER_SERIES

    installed = ".".join(dg.__version__.split(".")[:2])
    assert installed == CHECKED_DAGSTER_SERIES, (
        f"dagster {dg.__version__} installed; moe_dag/assets/dagster_internals.py was checked against "
        f"{CHECKED_DAGSTER_SERIES}.x"
    )


def test_the_run_order_is_derived_from_the_asset_graph():
    """`moe-dag run`'s stages come from the asset definitions (no list kept beside them): per-source and
    global stages alternate, each in dependency order, and the comparisons come last."""
    assert stages(build_definitions("configs/demo.yaml")) == [
        Stage(["raw_documents", "prefiltered", "minhash_signatures"], per_source=True),
        Stage(["dedup_clusters", "neutral_documents"], per_source=False),
        Stage(["deduplicated", "toxicity_filtered"], per_source=True),
        Stage(["oracle_sample", "oracle_labels", "quality_heads"], per_source=False),
        Stage(["scored_documents"], per_source=True),
        Stage(
            [
                "document_catalog",
                "tokenizer",
                "tokenized_mixture",
                "evaluation_sets",
                "moe_proxy",
                "proxy_eval",
            ],
            per_source=False,
        ),
        Stage(["moe_gain", "unfiltered_mixture", "curation_gain"], per_source=False, comparisons=True),
    ]


def test_every_asset_declares_its_stage_version_and_builds_its_settings_from_the_config():
    from moe_dag.assets.operating import operation
    from moe_dag.settings.stage import builds_per_source

    definitions = build_definitions("configs/demo.yaml")
    config = definitions.resources["pipeline"].config
    for asset in definitions.assets:
        for spec in asset.specs:
            declared = operation(spec)
            per_source = builds_per_source(declared.settings)
            assert per_source == (spec.partitions_def is not None and spec.key.path != ["candidate_proxy"])
            source = (config.source_names[0],) if per_source else ()
            assert dataclasses.is_dataclass(declared.settings(config, *source))
