"""State traffic per decode token, checked on Nemotron-3-Nano-4B's Mamba-2 geometry by hand."""

import dataclasses

import pytest
import transformers as tf

from replayssm_eval.models.presets import get_preset
from replayssm_eval.models.traffic import state_traffic

# Nemotron-3-Nano-4B: 21 Mamba-2 layers of 96 heads x head_dim 80 x d_state 128, 8 groups
NANO = get_preset("nemotron-3-nano-4b")
FP32, FP16 = 96 * 80 * 128 * 4, 96 * 80 * 128 * 2  # 3 932 160 (3.75 MiB), 1 966 080
NVFP4 = 96 * 80 * 128 // 2 + 96 * 80 * 128 // 16 + 96 * 4  # E2M1 nibbles + E4M3 block scales + FP32 per head: 553 344
ENTRY = 2 * (96 * 80 + 8 * 128 + 96)  # bf16 x, B, dt: 17 600


def test_conventional_fp32_is_read_plus_write_of_the_state():
    t = state_traffic(NANO, "fp32")
    assert t["bytes_per_copy"] == {"read": FP32, "recur": FP32}
    assert t["conventional"] == {"read": FP32, "write": FP32, "total": 7_864_320}
    # window 1: every token is a flush, no buffer
    assert t["replay"]["total"] == 7_864_320 and t["replay"]["buffer_read"] == 0 == t["replay"]["buffer_write"]
    assert t["per_model"]["conventional"] == 21 * 7_864_320


def test_split_nvfp4_read_fp16sr_recur_window_16():
    t = state_traffic(NANO, "nvfp4/fp16sr@16")
    assert t["bytes_per_copy"] == {"read": NVFP4, "recur": FP16} and t["buffer_entry_bytes"] == ENTRY
    r = t["replay"]
    assert r["state_read"] == (15 * 553_344 + 1_966_080) / 16 == 641_640
    assert r["state_write"] == (1_966_080 + 553_344) / 16 == 157_464  # flush writes both copies
    assert r["buffer_read"] == 15 * (7 * 17_600 + 17_600) / 16 == 132_000  # (L-1)/2 entries per token
    assert r["buffer_write"] == 15 * 17_600 / 16 == 16_500
    assert r["total"] == 947_604
    assert t["conventional"]["total"] == 2 * FP16
    assert t["per_model"]["ratio_vs_fp32"] == pytest.approx(7_864_320 / 947_604)
    assert t["per_model"]["replay"] == 21 * 947_604


def test_shared_checkpoint_writes_one_copy():
    r = state_traffic(NANO, "shared:nvfp4@16")["replay"]
    assert r["state_read"] == NVFP4 and r["state_write"] == NVFP4 / 16


def test_gdn_closed_fold_buffers_raw_inputs_too():
    # Qwen3.5-4B GDN: HV=32 value heads x V=128, K=128, 16 key heads
    geo = get_preset("qwen3.5-4b")
    assert (geo.num_ssm_layers, geo.num_heads, geo.head_dim, geo.state_dim, geo.n_groups) == (24, 32, 128, 128, 16)
    open_, closed = state_traffic(geo, "nvfp4/fp32@4"), state_traffic(geo, "nvfp4/fp32@4#closed")
    k, u, g = 16 * 128, 32 * 128, 32
    assert open_["buffer_entry_bytes"] == 2 * (k + u + g)
    assert closed["buffer_entry_bytes"] == 2 * (k + u + g + u + g)
    # non-flush tokens j = 0, 1, 2 read 0 + 1 + 2 entries of (k, u, g); the flush reads 3 of (k, v, beta, g)
    assert closed["replay"]["buffer_read"] == (3 * 2 * (k + u + g) + 3 * 2 * (k + u + g + g)) / 4 == 18_576
    assert open_["replay"]["state_write"] == (32 * 128 * 128 * 4 + open_["bytes_per_copy"]["read"]) / 4


def test_kda_buffers_a_per_channel_decay():
    # Kimi-Linear-48B-A3B: 20 KDA layers of 32 heads, K = V = 128, no head grouping
    geo = get_preset("kimi-linear-48b-a3b")
    t, closed = state_traffic(geo, "nvfp4/fp16sr@16"), state_traffic(geo, "nvfp4/fp16sr@16#closed")
    state = 32 * 128 * 128
    nvfp4 = state // 2 + state // 16 + 4 * 32  # E2M1 nibbles + E4M3 block scales + an FP32 scale per head: 295 040
    assert t["bytes_per_copy"] == {"read": nvfp4, "recur": 2 * state}
    k = u = g = 32 * 128  # g is per channel: [HV, K], not GDN's [HV]
    assert t["buffer_entry_bytes"] == 2 * (k + u + g) == 24_576
    assert closed["buffer_entry_bytes"] == 2 * (k + u + g + u + 32)
    r = t["replay"]
    assert r["state_read"] == (15 * nvfp4 + 2 * state) / 16
    assert r["state_write"] == (2 * state + nvfp4) / 16
    assert r["buffer_read"] == 15 * (7 * 24_576 + 24_576) / 16 == 184_320
    assert r["buffer_write"] == 15 * 24_576 / 16 == 23_040
    assert t["conventional_fp32"] == 2 * 4 * state
    assert t["per_model"]["replay"] == 20 * r["total"]
    assert t["per_model"]["ratio_vs_fp32"] == pytest.approx(8 * state / r["total"])


def test_geometry_from_an_hf_config_or_a_preset_name():
    config = tf.NemotronHConfig(
        layers_block_type=["mamba", "attention", "mamba", "mlp", "mamba"], mamba_num_heads=96, mamba_head_dim=80,
        ssm_state_size=128, n_groups=8, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
    )
    t = state_traffic(config, "fp32")
    assert t["geometry"]["num_ssm_layers"] == 3 and t["geometry"]["state"] == [96, 80, 128]
    assert state_traffic("nemotron-3-nano-4b", "fp32") == state_traffic(NANO, "fp32")
    with pytest.raises(ValueError, match="num_heads, head_dim, state_dim, n_groups unknown"):
        state_traffic("qwen3.5-122b-a10b", "fp32")


def test_speculative_schedule_is_refused():
    with pytest.raises(ValueError, match="speculative"):
        state_traffic(NANO, "nvfp4/fp16sr@16#spec=4:0.7")


def test_mixed_config_sums_its_layers():
    t = state_traffic(NANO, "nvfp4/fp16sr@16+3,7=fp32")
    fp32, split = state_traffic(NANO, "fp32"), state_traffic(NANO, "nvfp4/fp16sr@16")
    assert t["per_layer"]["3"]["replay"]["total"] == 7_864_320 == t["per_layer"]["7"]["conventional"]["total"]
    assert t["per_model"]["replay"] == 19 * split["replay"]["total"] + 2 * fp32["replay"]["total"]
    assert t["bytes_per_copy"] == {"read": NVFP4, "recur": FP16}  # the default's
    assert t["replay"]["total"] == pytest.approx(t["per_model"]["replay"] / 21, rel=1e-15)


def test_head_parts_store_their_heads_and_keep_their_own_ring():
    layer = state_traffic(NANO, "nvfp4/fp16sr@16+0.h0-11=fp32@1")["per_layer"]["0"]
    # heads 0-11 (group 0) conventional FP32, heads 12-95 (groups 1-7) split at window 16, as two smaller layers
    fp32_part = state_traffic(dataclasses.replace(NANO, num_heads=12, n_groups=1), "fp32")
    split_part = state_traffic(dataclasses.replace(NANO, num_heads=84, n_groups=7), "nvfp4/fp16sr@16")
    assert layer["bytes_per_copy"] == {"read": FP32 // 8 + 84 * 80 * 128 // 2 + 84 * 80 * 128 // 16 + 84 * 4,
                                       "recur": FP32 // 8 + 84 * 80 * 128 * 2}
    assert split_part["buffer_entry_bytes"] == 2 * (84 * 80 + 7 * 128 + 84)  # x, B of the 7 groups read, dt
    for kind in ("conventional", "replay"):
        assert layer[kind]["total"] == fp32_part[kind]["total"] + split_part[kind]["total"]
    # each part's own figures, as the traffic of its heads alone
    fields = ("bytes_per_copy", "buffer_entry_bytes", "conventional", "conventional_fp32", "replay")
    assert [(p["config"], p["heads"]) for p in layer["parts"]] == [("fp32", list(range(12))),
                                                                   ("nvfp4/fp16sr", list(range(12, 96)))]
    for part, alone in zip(layer["parts"], (fp32_part, split_part)):
        assert {k: part[k] for k in fields} == {k: alone[k] for k in fields}
    one_head = state_traffic(NANO, "fp32+5.h7=nvfp4/fp16sr@16")["per_layer"]["5"]["parts"][1]
    assert one_head["heads"] == [7] and one_head["replay"] == state_traffic(
        dataclasses.replace(NANO, num_heads=1, n_groups=1), "nvfp4/fp16sr@16")["replay"]
    assert "parts" not in state_traffic(NANO, "nvfp4/fp16sr@16+3,7=fp32")["per_layer"]["3"]
    agree = state_traffic(NANO, "nvfp4/fp16sr@16+0.h0-11=nvfp4/fp16sr@16")
    assert agree["per_model"] == state_traffic(NANO, "nvfp4/fp16sr@16")["per_model"]


@pytest.mark.parametrize("config", ["nvfp4/fp16sr@16", "fp8/fp16sr@7", "fp32"])
def test_a_part_costs_at_most_its_heads_alone(config):
    # the budget prices heads one by one; a part of several heads shares its groups' buffered B rows
    rest = "nvfp4/fp16sr@16" if config == "fp32" else "fp32"  # the other heads' config
    part = state_traffic(NANO, f"{rest}+0.h0-6={config}")["per_layer"]["0"]["parts"][0]
    alone = [state_traffic(NANO, f"{rest}+0.h{h}={config}")["per_layer"]["0"]["parts"][h > 0] for h in range(7)]
    assert [p["heads"] for p in alone] == [[h] for h in range(7)] and part["heads"] == list(range(7))
    total = sum(p["replay"]["total"] for p in alone)
    if config == "fp32":  # no ring at window 1: heads add exactly
        assert part["replay"]["total"] == total == 7 * alone[0]["conventional_fp32"]
    else:  # heads 0-6 read group 0 (12 heads per group): its B row once, not 7 times
        assert part["replay"]["total"] < total
        assert part["replay"]["state_read"] == pytest.approx(sum(p["replay"]["state_read"] for p in alone), rel=1e-12)
