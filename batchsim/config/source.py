"""An experiment as read from its file (or a mapping), before overrides and validation:
read once, resolved many times (a sweep resolves one config per point)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchsim.catalog import catalog_dir
from batchsim.config.experiment import ExperimentConfig
from batchsim.config.overrides import _blame_overrides, apply_overrides
from batchsim.config.resolve import validate_experiment
from batchsim.errors import ConfigError
from batchsim.yamlio import line_of, read_mapping

STUDY_BLOCKS = ("sweep",)
"""Top-level blocks read by ``batchsim sweep`` and ``batchsim capacity``, not by one run."""


@dataclass(frozen=True)
class ExperimentSource:
    """An experiment as read, before overrides and validation: read once, resolved many times
    (a sweep resolves one config per point).

    Attributes:
        data: The raw mapping, without the study blocks (``sweep:``).
        text: The file's text (to point errors at a line), or None for a mapping.
        source: The file name for error messages, or None.
        base_dir: The directory relative paths in it are relative to.
        studies: The study blocks found in it (``{"sweep": {...}}``), raw.
    """

    data: dict[str, Any]
    text: str | None
    source: str | None
    base_dir: Path
    studies: dict[str, Any]

    @classmethod
    def read(cls, path_or_data: str | Path | Mapping[str, Any]) -> ExperimentSource:
        """Read an experiment YAML, a built-in experiment name, or a mapping."""
        if isinstance(path_or_data, Mapping):
            data, text, source, base = dict(path_or_data), None, None, Path.cwd()
        else:
            path = Path(path_or_data)
            if not path.is_file():
                builtin = catalog_dir("experiments") / f"{path_or_data}.yaml"
                if builtin.is_file() and path.suffix == "":
                    path = builtin
                else:
                    raise ConfigError(f"experiment file not found: {path_or_data}")
            data, text = read_mapping(path)
            source, base = str(path), path.parent
        studies = {key: data.pop(key) for key in STUDY_BLOCKS if key in data}
        return cls(data, text, source, base, studies)

    def load(
        self, overrides: Mapping[str, Any] | None = None, *, origin: str = "--set"
    ) -> ExperimentConfig:
        """Apply dotted-key overrides (see :func:`apply_overrides`) and validate.

        Errors caused by an override name it with ``origin``
        (``--set scheduler.max_num_seqs=0: ...``); others name the file and line.
        """
        if not overrides:
            return validate_experiment(
                self.data, source=self.source, text=self.text, base_dir=self.base_dir
            )
        changed = apply_overrides(
            self.data, overrides, origin=origin, base_dir=self.base_dir, source=self.source
        )
        try:
            return validate_experiment(
                changed, source=self.source, text=self.text, base_dir=self.base_dir
            )
        except ConfigError as exc:
            raise _blame_overrides(
                exc, self.data, changed, overrides, origin, self.base_dir
            ) from None

    def with_overrides(
        self, overrides: Mapping[str, Any], *, origin: str = "--set"
    ) -> ExperimentSource:
        """The source with ``overrides`` applied to its raw mapping (validated later)."""
        if not overrides:
            return self
        changed = apply_overrides(
            self.data, overrides, origin=origin, base_dir=self.base_dir, source=self.source
        )
        return ExperimentSource(changed, self.text, self.source, self.base_dir, self.studies)

    def block_error(self, message: str, path: Sequence[str]) -> ConfigError:
        """A ConfigError about a key of a study block, pointing at its line."""
        line = line_of(self.text, list(path)) if self.text else None
        return ConfigError(message, self.source, line)


def load_experiment(
    path_or_data: str | Path | Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    *,
    origin: str = "--set",
) -> ExperimentConfig:
    """Read, override and validate an experiment.

    Args:
        path_or_data: Path to an experiment YAML, a built-in experiment name, or a mapping.
        overrides: Dotted keys -> values, applied in order; each value replaces what is at its
            key (see :func:`apply_overrides`), e.g. ``{"scheduler.max_num_seqs": 8}``.
        origin: How the overrides were given; errors they cause name them with it
            (``--set scheduler.max_num_seqs=0: ...``).

    A ``sweep:`` block is read by ``batchsim sweep`` and ``batchsim capacity`` and left out
    here: the experiment is its base point.
    """
    return ExperimentSource.read(path_or_data).load(overrides, origin=origin)
