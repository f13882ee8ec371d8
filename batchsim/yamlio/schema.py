"""The YAML 1.2 core schema of batchsim's YAML: which plain scalars are booleans, nulls,
integers and floats (no YAML 1.1 ``yes``/``no``, no timestamps), as patterns, as the resolver
that tags them, and as the conversions to Python numbers. The patterns also match YAML 1.1's
``_`` digit separators and the resolver tags ``<<`` merge keys, so that the reader can refuse
them by name (a number with ``_`` would otherwise read as a string) and the dumper quotes
such strings. The reader
(:mod:`~batchsim.yamlio.reading`) and the dumper (:func:`~batchsim.yamlio.plain.dump`) share it,
so that what is written reads back as the same data.
"""

from __future__ import annotations

import math
import re

from yaml.resolver import BaseResolver

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
_MERGE = "tag:yaml.org,2002:merge"

_DIGITS = r"[0-9](?:_?[0-9])*"
_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL_RE = re.compile(r"^(?:~|null|Null|NULL|)$")
_INT_RE = re.compile(rf"^[-+]?(?:{_DIGITS}|0o[0-7](?:_?[0-7])*|0x[0-9a-fA-F](?:_?[0-9a-fA-F])*)$")
_FLOAT_RE = re.compile(
    rf"^(?:[-+]?(?:\.{_DIGITS}|{_DIGITS}(?:\.(?:{_DIGITS})?)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_MAX_INT_CHARS = 1000  # longer integer literals are refused (Python parses at most 4300 digits)
_SCALAR_RULES = {_BOOL: _BOOL_RE, _NULL: _NULL_RE, _INT: _INT_RE, _FLOAT: _FLOAT_RE}
_SCALAR_WORDS = {_BOOL: "true or false", _NULL: "null", _INT: "an integer", _FLOAT: "a number"}


def _to_int(text: str) -> int:
    if re.match(r"^[-+]?0[xo]", text):
        return int(text, 0)
    return int(text, 10)


def _to_float(text: str) -> float:
    lower = text.lower()
    if lower.endswith(".inf"):
        return -math.inf if lower.startswith("-") else math.inf
    if lower == ".nan":
        return math.nan
    return float(text)


class _Resolver(BaseResolver):
    """YAML 1.2 core schema scalars (plus ``_`` digit separators and ``<<`` merge keys, which
    the reader refuses)."""


# Own tables, so PyYAML's YAML 1.1 resolvers (yes/no booleans, 1.1 floats, timestamps) are gone.
_Resolver.yaml_implicit_resolvers = {}
_Resolver.yaml_path_resolvers = {}

_Resolver.add_implicit_resolver(_BOOL, _BOOL_RE, list("tTfF"))
_Resolver.add_implicit_resolver(_NULL, _NULL_RE, ["~", "n", "N", ""])
_Resolver.add_implicit_resolver(_INT, _INT_RE, list("-+0123456789"))
_Resolver.add_implicit_resolver(_FLOAT, _FLOAT_RE, list("-+.0123456789"))
_Resolver.add_implicit_resolver(_MERGE, re.compile(r"^(?:<<)$"), ["<"])
