"""KDA families through the adapter: FP32 equivalence with HF, quantized runs vs the slow path, padding."""

import pytest
from adapter_checks import (
    QUANT_CONFIGS,
    check_fp32_matches_hf,
    check_left_padding_does_not_leak,
    check_quantized_matches_slow_path,
)
from hf_tiny import KDA_FAMILIES


@pytest.mark.parametrize("name", KDA_FAMILIES)
def test_fp32_matches_hugging_face(name):
    check_fp32_matches_hf(name)


@pytest.mark.parametrize("config", QUANT_CONFIGS)
@pytest.mark.parametrize("name", KDA_FAMILIES)
def test_quantized_run_equals_token_by_token_reference(name, config):
    check_quantized_matches_slow_path(name, config)


@pytest.mark.parametrize("name", KDA_FAMILIES)
def test_left_padding_does_not_leak_into_the_state(name):
    check_left_padding_does_not_leak(name)


def test_closed_fold_equals_the_slow_path():
    check_quantized_matches_slow_path("kimi_linear", "nvfp4/fp16sr@4#closed")
