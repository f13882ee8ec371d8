"""Where the built-in catalogs live, and how a name or a path becomes a file.

The catalogs (``hardware_profiles/``, ``models/``, ``workloads/``, ``experiments/``,
``frameworks/``) sit at the
repository top level and are copied into ``batchsim/_data/`` when a wheel is built, so they are
found both from a source checkout (editable install) and after a plain ``pip install``.
This module imports nothing else from batchsim but :mod:`batchsim.errors`.
"""

from __future__ import annotations

from pathlib import Path

from batchsim.errors import ConfigError

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
KINDS = ("hardware_profiles", "models", "workloads", "experiments", "frameworks")


def catalog_dir(kind: str) -> Path:
    """Directory of a built-in catalog (``hardware_profiles``, ``models``, ...)."""
    assert kind in KINDS, f"unknown catalog kind {kind!r}"
    installed = _PACKAGE_DIR / "_data" / kind
    if installed.is_dir():
        return installed
    return _PACKAGE_DIR.parent / kind


def catalog_names(kind: str) -> list[str]:
    """Sorted names of the YAML entries of a built-in catalog."""
    directory = catalog_dir(kind)
    if not directory.is_dir():
        return []
    return sorted(p.stem for p in directory.glob("*.yaml") if not p.name.startswith("_"))


def resolve(kind: str, name_or_path: str, key: str) -> Path:
    """Turn a built-in name or a file path into an existing file.

    Args:
        kind: Catalog to look in for a bare name.
        name_or_path: ``a100-80gb`` or ``path/to/profile.yaml``.
        key: Config key that held the value, for the error message.

    Raises:
        ConfigError: Neither a built-in name nor an existing file; lists the built-in names.
    """
    candidate = Path(name_or_path).expanduser()
    looks_like_path = candidate.suffix in {".yaml", ".yml", ".json"} or "/" in name_or_path
    if looks_like_path:
        if candidate.is_file():
            return candidate
        raise ConfigError(f"{key}: file not found: {name_or_path}")
    builtin = catalog_dir(kind) / f"{name_or_path}.yaml"
    if builtin.is_file():
        return builtin
    names = ", ".join(catalog_names(kind)) or "(none)"
    raise ConfigError(f"{key}: unknown name {name_or_path!r}; built-in names: {names}")
