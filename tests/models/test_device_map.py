"""Loading by path, accelerate device maps, and layer discovery on the meta device.

Tested here (CPU): `load_model` on a saved folder and on the bundled fixtures by name; an explicit device_map that keeps the first
half of the model on the CPU and offloads the rest to disk (accelerate's AlignDevicesHook then
moves weights in for each forward, the path `device_map="auto"` takes for a model bigger than
the GPUs), with logits and states checked against the plain model; and a full-size
Nemotron-3-Nano-4B-shaped model built on the meta device, where the hooks must find every SSM
layer without allocating it. On a GPU machine the model is also split across two GPUs (or, with
one, between cuda:0 and CPU-offloaded weights) and every layer's state must live on the device
its layer runs on.
"""

import pytest
import torch
import transformers as tf

from replayssm_eval.models import ReplayModel, load_model
from replayssm_eval.models.tokenizer import save_byte_tokenizer

from tests.helpers.compare import rel_err
from tests.helpers.hf_tiny import VOCAB, build, cuts, forward_calls

CALLS = cuts(12, (20, 1, 1))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-nemotron-h")
    build("nemotron_h").save_pretrained(path)
    save_byte_tokenizer(path)
    return path


def _plain_logits(path, ids):
    rm = load_model(str(path), dtype="fp32", device="cpu")
    return forward_calls(rm, ids, CALLS, rm.new_session("fp32"))


def test_load_model_by_path(saved):
    rm = load_model(str(saved), dtype=torch.float32, device="cpu", config="nvfp4/fp16sr@4")
    assert rm.model_type.model_type == "nemotron_h" and list(rm.layers) == [0, 2]
    assert rm.config.name == "nvfp4/fp16sr@4" and rm.tokenizer is not None
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        load_model(str(saved), dtype="fp8", device="cpu")


@pytest.mark.parametrize("name", ["tiny-nemotron-h", "tiny-qwen3.5"])
def test_bundled_fixture_by_name_matches_hugging_face(name):
    rm = load_model(name, dtype="fp32", device="cpu")
    ids = rm.tokenizer(["O brave new world, that has such people in't!", "Full fathom five thy father lies;"],
                       return_tensors="pt", padding=True).input_ids[:, :34]
    with torch.no_grad():
        full = rm.model(ids).logits  # a forward without cache is HF's own FP32 scan throughout
    assert rel_err(forward_calls(rm, ids, CALLS, rm.new_session("fp32")), full) < 1e-5


def test_cpu_and_disk_offload_device_map(saved, tmp_path):
    device_map = {"model.embeddings": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu",
                  "model.layers.2": "disk", "model.layers.3": "disk", "model.norm_f": "disk", "lm_head": "disk"}
    ids = torch.randint(0, VOCAB, (2, CALLS[-1][1]))
    rm = load_model(str(saved), dtype="fp32", device_map=device_map, offload_folder=str(tmp_path))
    assert hasattr(rm.model.model.layers[2], "_hf_hook")  # accelerate's hooks are in place
    assert list(rm.layers) == [0, 2]
    session = rm.new_session("fp32")
    assert rel_err(forward_calls(rm, ids, CALLS, session), _plain_logits(saved, ids)) < 1e-5
    assert {layer: s.device.type for layer, s in session.states.items()} == {0: "cpu", 2: "cpu"}


def test_full_size_architecture_on_the_meta_device():
    config = tf.NemotronHConfig(
        layers_block_type=["mamba", "mlp", "mamba", "attention", "mlp"] * 4, mamba_num_heads=96, mamba_head_dim=80,
        ssm_state_size=128, n_groups=8, hidden_size=3072, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=12288,
    )
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(config)
    rm = ReplayModel(model)
    assert list(rm.layers) == [0, 2, 5, 7, 10, 12, 15, 17]
    assert all(m.A_log.is_meta for m in rm.layers.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_split_across_devices(saved):
    """Two GPUs: half the layers on each, and each layer's state on its own GPU. One GPU: the second
    half's weights are offloaded to the CPU and accelerate runs them on cuda:0, so do the states."""
    second = 1 if torch.cuda.device_count() > 1 else "cpu"
    device_map = {"model.embeddings": 0, "model.layers.0": 0, "model.layers.1": 0, "model.layers.2": second,
                  "model.layers.3": second, "model.norm_f": second, "lm_head": second}
    ids = torch.randint(0, VOCAB, (2, CALLS[-1][1]))
    rm = load_model(str(saved), dtype="fp32", device_map=device_map)
    session = rm.new_session("nvfp4/fp16sr@4")
    assert torch.isfinite(forward_calls(rm, ids.cuda(), CALLS, session)).all()
    expected = {0: "cuda:0", 2: "cuda:1" if second == 1 else "cuda:0"}
    assert {layer: str(s.hi.device) for layer, s in session.states.items()} == expected
    session32 = rm.new_session("fp32")
    assert rel_err(forward_calls(rm, ids.cuda(), CALLS, session32).cpu(), _plain_logits(saved, ids)) < 1e-4
