"""How figures name what was run: catalog names with dots, and series that vary a whole block."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from batchsim.plots.data import Series, _compact_labels
from batchsim.plots.style import catalog_name, describe_run
from conftest import tint_of


def test_catalog_names_keep_their_dots_and_files_lose_their_folders():
    assert catalog_name("llama-3.1-8b") == "llama-3.1-8b"
    assert catalog_name("qwen2.5-7b") == "qwen2.5-7b"
    assert catalog_name("profiles/my-gpu.v2.yaml") == "my-gpu.v2"
    assert catalog_name("/models/Qwen3-8B/config.json") == "Qwen3-8B"
    title = describe_run({"model": "llama-3.2-1b", "hardware": "h100-sxm", "scheduler": {}})
    assert title.startswith("llama-3.2-1b on h100-sxm")


def _series(value: object) -> Series:
    return Series("?", {"engine.speculative": value}, pd.DataFrame(), [])


def test_a_varied_block_is_named_by_the_keys_that_differ_and_a_missing_one_as_none():
    draft = {"method": "draft", "draft_model": "llama-3.2-1b"}
    blocks = [
        float("nan"),  # the point without the block: an empty sweep.csv cell
        json.dumps({**draft, "num_speculative_tokens": 2, "acceptance_rate": 0.6}),
        json.dumps({**draft, "num_speculative_tokens": 4, "acceptance_rate": 0.8}),
    ]
    labels = [s.label for s in _compact_labels([_series(b) for b in blocks])]
    assert labels == [
        "speculative=none",
        "speculative=num_speculative_tokens=2 acceptance_rate=0.6",
        "speculative=num_speculative_tokens=4 acceptance_rate=0.8",
    ]


def test_series_styles_give_a_policy_its_colour_and_number_its_lines():
    from batchsim.plots.style import OKABE_ITO, POLICY_COLORS, series_styles

    labels = ["a", "b", "c", "d", "e"]
    policies = {"a": "static", "b": "static", "c": "continuous", "d": "mymod:Mine", "e": "static"}
    styles = series_styles(labels, policies)
    assert styles[0].color == POLICY_COLORS["static"]
    assert styles[2].color == POLICY_COLORS["continuous"]
    # static's further lines: its hue, lighter in order, the last 55 % of the way to white
    tints = [tint_of(styles[i].color, POLICY_COLORS["static"]) for i in (0, 1, 4)]
    assert tints[0] == 0 and tints[1] == pytest.approx(0.275, abs=0.01)
    assert tints[2] == pytest.approx(0.55, abs=0.01)
    assert tint_of(styles[1].color, POLICY_COLORS["continuous"]) is None
    assert [s.variant for s in styles] == [0, 1, 0, 0, 2]
    assert len({styles[i].marker for i in (0, 1, 4)}) == 3
    assert len({str(styles[i].dashes) for i in (0, 1, 4)}) == 3
    # a series of no built-in policy takes a palette colour that no policy has
    assert styles[3].color in OKABE_ITO and styles[3].color not in POLICY_COLORS.values()
