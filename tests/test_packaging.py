"""What a user installing batchsim gets: supported Pythons, license, version, type hints."""

from __future__ import annotations

import pytest

from batchsim.validation import _as_model


class _GenericAliasOn310:
    """Behaves like ``tuple[int, ...]`` on Python 3.10, where ``isinstance(alias, type)`` is
    True because the alias forwards ``__class__`` to its origin, yet ``issubclass(alias, X)``
    raises TypeError."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type


@pytest.mark.parametrize(
    "annotation", [tuple[int, ...], list[str], dict[str, int], _GenericAliasOn310()]
)
def test_error_location_walk_treats_generic_aliases_as_non_models(annotation):
    assert isinstance(_GenericAliasOn310(), type)  # the 3.10 behaviour being imitated
    assert _as_model(annotation) is None
