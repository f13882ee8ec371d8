"""Named links a disaggregated cluster moves KV caches over (``hardware_profiles/_links.yaml``).

Each entry gives one GPU's link in one direction: ``bandwidth_gb_s`` (GB/s, 1e9 bytes/s, the
datasheet's peak after line encoding) and ``latency_us`` (the fixed time of one transfer), with
its ``sources``. ``cluster.disaggregation.kv_transfer.link`` names one of them or gives
``{bandwidth_gb_s, latency_us}`` itself (:mod:`batchsim.cluster.config`).

This module imports only :mod:`batchsim.catalog`, :mod:`batchsim.errors`,
:mod:`batchsim.validation` and :mod:`batchsim.yamlio`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from batchsim.catalog import catalog_dir
from batchsim.errors import ConfigError
from batchsim.validation import number_problem
from batchsim.yamlio import read_mapping

LINKS_FILE = "_links.yaml"
"""The catalog's file in ``hardware_profiles/`` (its name starts with ``_``: not a GPU)."""
MAX_LINK_GB_S = 1e6
"""Highest link bandwidth accepted, GB/s."""
MAX_LINK_LATENCY_US = 1e9
"""Highest fixed latency of one transfer accepted, us (1,000 s)."""


@dataclass(frozen=True)
class Link:
    """One GPU's link, one direction, in SI units."""

    name: str
    bandwidth: float
    """Bytes per second."""
    latency: float
    """Seconds added to every transfer."""
    description: str = ""


@functools.lru_cache(maxsize=1)
def builtin_links() -> dict[str, Link]:
    """The catalog's links by name.

    Raises:
        ConfigError: The catalog file is malformed (a broken installation).
    """
    path = catalog_dir("hardware_profiles") / LINKS_FILE
    data, _ = read_mapping(path)
    out = {}
    for name, entry in data.items():
        where = f"{path.name}: {name}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a mapping")
        values = {}
        for key, most in (("bandwidth_gb_s", MAX_LINK_GB_S), ("latency_us", MAX_LINK_LATENCY_US)):
            value = entry.get(key)
            floor = 0 if key == "bandwidth_gb_s" else None
            problem = number_problem(value, gt=floor, ge=0, le=most)
            if problem is not None:
                raise ConfigError(f"{where}.{key} {problem}")
            values[key] = float(value)  # type: ignore[arg-type]
        if not entry.get("sources"):
            raise ConfigError(f"{where}: every link gives its sources")
        out[name] = Link(
            name,
            values["bandwidth_gb_s"] * 1e9,
            values["latency_us"] * 1e-6,
            str(entry.get("description", "")),
        )
    return out


def load_link(name: str, key: str = "cluster.disaggregation.kv_transfer.link") -> Link:
    """A built-in link by name.

    Raises:
        ConfigError: Unknown name; the message lists the built-in ones.
    """
    links = builtin_links()
    if name not in links:
        raise ConfigError(
            f"{key}: unknown link {name!r}; built-in links: {', '.join(sorted(links))} "
            "(or give {bandwidth_gb_s: ..., latency_us: ...})"
        )
    return links[name]
