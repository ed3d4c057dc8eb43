"""Pipeline configs for tests: configs/demo.yaml (or another test's config) with changes, written to a file.

Changes are nested dicts merged into the base section by section; a `Replace` section takes the place of
the base's section instead (a test that wants tiny training must not inherit the demo's two processes).
Under `sources`, a dict addresses each source by its name; a list replaces the sources.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from moe_dag.config import DEFAULT_CONFIG


class Replace(dict):
    """A section given whole: it replaces the base's section rather than being merged into it."""


def with_changes(raw: dict, changes: dict) -> dict:
    """`raw` with `changes` applied (neither is modified)."""
    merged = dict(raw)
    for key, change in changes.items():
        if isinstance(change, Replace):
            merged[key] = with_changes({}, change)  # plain dicts, which yaml.safe_dump writes
        elif key == "sources" and isinstance(change, dict):
            merged[key] = _sources_with_changes(raw.get("sources", []), change)
        elif isinstance(change, dict) and isinstance(raw.get(key), dict):
            merged[key] = with_changes(raw[key], change)
        else:
            merged[key] = change
    return merged


def _sources_with_changes(sources: list[dict], changes: dict[str, dict]) -> list[dict]:
    unknown = set(changes) - {source["name"] for source in sources}
    if unknown:
        raise KeyError(f"no source named {sorted(unknown)} in the base config")
    return [with_changes(source, changes.get(source["name"], {})) for source in sources]


def edited_config(base: Path, changes: dict, to: Path | None = None) -> Path:
    """The config at `base` with `changes` applied, written to `to` (by default over `base`)."""
    return _written(with_changes(_loaded(base), changes), to or Path(base))


def demo_config(folder: Path, changes: dict | None = None, name: str = "pipeline.yaml") -> Path:
    """configs/demo.yaml with its lake and catalog in `folder` (never the repository's), then `changes`,
    written to folder/name."""
    in_folder = {"lake_root": str(folder / "lake"), "catalog_path": str(folder / "catalog.duckdb")}
    raw = with_changes(with_changes(_loaded(DEFAULT_CONFIG), in_folder), changes or {})
    return _written(raw, folder / name)


def _loaded(path: Path | str) -> dict:
    return yaml.safe_load(Path(path).read_text())


def _written(raw: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    return path
