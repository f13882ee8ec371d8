"""Reading YAML/JSON files and data files: the one reader every input file goes through.

Experiment, workload, hardware-profile and model files (YAML, or a Hugging Face
``config.json``) are read by :func:`read_mapping`; trace and data files by :func:`read_text`.
Both apply the same rules, and break them with a one-line :class:`~batchsim.errors.ConfigError`
naming the file (and the line, where there is one):

- **Size**: at most :data:`MAX_CONFIG_BYTES` (64 MiB) for YAML/JSON files, at most
  :data:`MAX_DATA_BYTES` (512 MiB) for trace and data files. An empty file is an error.
- **Encoding**: UTF-8 (a UTF-8 byte-order mark is skipped). UTF-16/UTF-32 text, NUL bytes
  (binary files) and invalid UTF-8 are errors.
- **Shape** (YAML/JSON): at most :data:`MAX_DEPTH` levels of nesting and :data:`MAX_NODES`
  values, both counted after expanding YAML aliases (a "billion laughs" document is refused
  before anything expands it); no alias inside its own anchor; mapping keys are strings and
  appear once per mapping; only the standard tags (``!!str``, ``!!int``, ``!!float``,
  ``!!bool``, ``!!null``, ``!!seq``, ``!!map``). YAML 1.1's merge keys (``<<``) are errors.
- **Scalars** follow the YAML 1.2 core schema: ``true``/``false`` are booleans (``yes``,
  ``no``, ``on``, ``off`` are strings), ``8e1``, ``1e3`` and ``.5e-1`` are numbers (PyYAML's
  YAML 1.1 rules read them as strings), ``012`` is twelve, ``0x1f`` and ``0o17`` are integers,
  there are no timestamps, and ``1:30`` is a string (not YAML 1.1's sexagesimal 90). YAML
  1.1's digit separators (``1_000``) are errors naming the line. Every number must be finite:
  ``.nan``, ``.inf``, JSON ``NaN``/``Infinity`` and overflowing literals like ``1e400`` are
  errors naming the key path.

:func:`data_problem` applies the shape and number rules to values that did not come from a file
(mappings given to the Python API, free-form ``scheduler.options``).

Modules:

- :mod:`~batchsim.yamlio.reading`: the reader (files, YAML and JSON documents, key lines);
- :mod:`~batchsim.yamlio.plain`: the shape and number rules of plain data, and :func:`dump`;
- :mod:`~batchsim.yamlio.schema`: the YAML 1.2 core schema the reader and the dumper share.

This package imports nothing from batchsim but :mod:`batchsim.errors`.
"""

from __future__ import annotations

from batchsim.yamlio.plain import MAX_DEPTH, MAX_NODES, check_plain_data, data_problem, dump
from batchsim.yamlio.reading import (
    MAX_CONFIG_BYTES,
    MAX_DATA_BYTES,
    line_of,
    loads,
    read_mapping,
    read_text,
)

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_DATA_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "check_plain_data",
    "data_problem",
    "dump",
    "line_of",
    "loads",
    "read_mapping",
    "read_text",
]
