"""``model: org/name``: a Hugging Face repo id, read from the local Hugging Face cache.

:func:`cached_config` finds the repo's ``config.json`` where ``huggingface_hub`` keeps
downloads (``HF_HUB_CACHE``, by default ``~/.cache/huggingface/hub``), without any network
access: batchsim never downloads. ``huggingface_hub`` is an optional dependency
(``pip install huggingface_hub``); without it, or when the file is not in the cache, the error
says what to do in one line.

Imports nothing from batchsim but :mod:`batchsim.errors`.
"""

from __future__ import annotations

import re
from pathlib import Path

from batchsim.errors import ConfigError

__all__ = ["cached_config", "looks_like_repo_id"]

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def looks_like_repo_id(value: str) -> bool:
    """``org/name`` with one slash, no file suffix and no path that exists."""
    return (
        _REPO_ID.fullmatch(value) is not None
        and not value.endswith(_FILE_SUFFIXES)
        and ".." not in value
        and not Path(value).exists()
    )


def cached_config(repo_id: str, key: str = "model") -> Path:
    """The cached ``config.json`` of the Hugging Face repo ``repo_id`` (revision ``main``).

    Raises:
        ConfigError: ``huggingface_hub`` is not installed, or the file is not in the local
            cache; one line saying how to install it or how to download the config.
    """
    try:
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:
        raise ConfigError(
            f"{key}: {repo_id!r} is neither a built-in model nor a file; reading a Hugging Face "
            "repo id from the local Hugging Face cache needs huggingface_hub: pip install "
            "huggingface_hub (or give the path of the model's config.json)"
        ) from None
    cache = constants.HF_HUB_CACHE  # HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/...
    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache)
    if isinstance(found, str):
        return Path(found)
    raise ConfigError(
        f"{key}: {repo_id} is not in the local Hugging Face cache ({cache}); "
        f"download its config.json first: hf download {repo_id} config.json "
        "(older huggingface_hub: huggingface-cli download ...), or give the path of a "
        "config.json"
    )
