"""What a CUDA graph capture needs of the formats' torch code: no host-to-device copy (checked on the meta device)."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from replayssm_eval.formats.formats import div_rn
from replayssm_eval.formats.rotation import hadamard


class Ops(TorchDispatchMode):
    """Records each op and whether any of its tensor arguments lives on the host."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        leaves = torch.utils._pytree.tree_leaves((args, kwargs or {}))
        self.ops.append((str(func), any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in leaves)))
        return func(*args, **(kwargs or {}))


def test_scalar_division_fills_its_operand_on_the_device():
    x = torch.ones(3, device="meta")
    for make in (lambda: div_rn(x, 127.0), lambda: div_rn(2688.0, x)):
        with Ops() as mode:
            make()
        # a scalar copied from the host (torch.as_tensor) reaches no op; one filled on the device is aten.full
        assert mode.ops == [("aten.full.default", False), ("aten.div.Tensor", False)]


def test_hadamard_is_built_on_the_device():
    with Ops() as mode:
        h = hadamard(16, device="meta")
    assert h.device.type == "meta" and h.shape == (16, 16)
    assert mode.ops and not any(host for _, host in mode.ops)
    assert torch.equal(hadamard(16, device="cpu"), hadamard(16))  # the device changes nothing
