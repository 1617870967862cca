import pytest

from replayssm_eval.replay.config import ReplayConfig, SpeculativeFlush


@pytest.mark.parametrize(
    "text, read, recur, window, shared",
    [
        ("fp32", "fp32", "fp32", 1, True),
        ("fp16", "fp16", "fp16", 1, True),
        ("shared:nvfp4", "nvfp4", "nvfp4", 16, True),
        ("nvfp4/fp16sr", "nvfp4", "fp16sr", 16, False),
        ("nvfp4/fp8sr@4", "nvfp4", "fp8sr", 4, False),
        ("fp32/fp32@16", "fp32", "fp32", 16, False),
        ("shared:fp8@1", "fp8", "fp8", 1, True),
    ],
)
def test_parse_fields(text, read, recur, window, shared):
    config = ReplayConfig.parse(text)
    assert (config.read, config.recur, config.window, config.shared) == (read, recur, window, shared)


@pytest.mark.parametrize(
    "text",
    ["fp32", "fp16", "shared:nvfp4", "nvfp4/fp16sr", "nvfp4/fp8sr@4", "fp32/fp32@16", "shared:nvfp4@1",
     "nvfp4/fp16sr@16#seed=7#closed#spec=3:0.75#skip=0.0001", "nvfp4:axis=headdim,scale=head/fp16sr@8"],
)
def test_name_round_trips(text):
    config = ReplayConfig.parse(text)
    assert ReplayConfig.parse(config.name) == config


def test_shared_window_one_is_conventional():
    assert ReplayConfig.parse("shared:nvfp4@1") == ReplayConfig.parse("nvfp4")
    assert ReplayConfig.parse("shared:nvfp4@1").name == "nvfp4"


def test_tags():
    config = ReplayConfig.parse("nvfp4/fp32@16#seed=5#closed#spec=3:0.5#skip=1e-3")
    assert config.seed == 5 and config.gdn_fold == "closed"
    assert config.speculative == SpeculativeFlush(3, 0.5)
    assert config.skip_read_below == 1e-3


def test_reference():
    assert ReplayConfig.parse("fp32").is_reference
    assert ReplayConfig.parse("fp32/fp32@16").is_reference
    assert not ReplayConfig.parse("nvfp4/fp32").is_reference


@pytest.mark.parametrize(
    "text, match",
    [
        ("nvfp5/fp32", "nvfp5"),
        ("nvfp4/fp32@x", "bad window 'x'"),
        ("nvfp4/fp32@0", "window must be an integer >= 1"),
        ("nvfp4#wat", "bad option #wat"),
        ("nvfp4#spec=0:0.5", "drafts per step must be >= 1"),
        ("nvfp4#spec=2:1.5", r"acceptance rate must be in \[0, 1\]"),
        ("nvfp4#skip=2", r"skip_read_below must be in \(0, 1\)"),
        ("", "empty replay config"),
    ],
)
def test_bad_input(text, match):
    with pytest.raises(ValueError, match=match):
        ReplayConfig.parse(text)


def test_shared_needs_one_format():
    with pytest.raises(ValueError, match="shared checkpoint has one format"):
        ReplayConfig(read="nvfp4", recur="fp32", shared=True)
