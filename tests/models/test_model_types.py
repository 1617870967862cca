"""The model-type table: every row names a registered kernel family; lookups and their errors."""

from types import SimpleNamespace

import pytest

from replayssm_eval.kernels.family import family_names
from replayssm_eval.models.model_types import MODEL_TYPES, model_type_of


def test_every_model_type_runs_on_a_registered_family():
    assert {row.family for row in MODEL_TYPES.values()} == set(family_names())
    for name, row in MODEL_TYPES.items():
        assert row.model_type == name and row.kernels.name == row.family
        assert row.module == f"transformers.models.{name}.modeling_{name}"


def test_lookup_by_config():
    assert model_type_of(SimpleNamespace(model_type="olmo_hybrid")).family == "gdn"
    assert model_type_of(SimpleNamespace(model_type="nemotron_h")).scans == (
        "mamba2_chunk_scan", "mamba2_selective_state_update")
    assert model_type_of(SimpleNamespace(model_type="qwen3_5_text")) is MODEL_TYPES["qwen3_5"]
    with pytest.raises(ValueError, match="unsupported model type 'llama'; supported: nemotron_h, mamba2"):
        model_type_of(SimpleNamespace(model_type="llama"))
