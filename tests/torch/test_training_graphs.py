"""A training graph leaves PyTorch whole: batch norm in training mode
(runtime/torch/training_norm.py) and attention with the logsumexp its backward reads
(runtime/torch/attention.py) are written out, so a training step's outputs, gradients,
running statistics and batch count equal eager PyTorch's with nothing left behind;
float16 batch norm, which PyTorch normalizes in float32, stays in PyTorch with its reason.

Smooth activations only (a ReLU's gradient jumps where an output rounds across zero, and
fresh inputs would land there now and then), and no bias before a norm (its gradient is
zero but for rounding).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import runtime.torch  # noqa: F401 (registers the backend; installed, the entry point does)
from runtime.host import HostManager
from runtime.torch.compiled import collecting
from tests.support.torch_modules import fresh, fresh_weights, relative_error

# a step per batch size: the second step's weights are the optimizer's, fed to the block,
# and its new batch size makes dynamo trace again with a dynamic batch dimension
GROWTH = (0, 2)


class Attention(nn.Module):
    """Four heads over a sequence of 6, as `F.scaled_dot_product_attention` is called;
    with fewer `kv_heads`, grouped-query attention (each key and value head serves
    4 / kv_heads query heads, as a Llama, Mistral or Qwen2 config asks); `repeated`: the
    key and value heads repeated for their groups first, as transformers' `repeat_kv`
    does (a view whose head dimension, of one head, is broadcast: stride 0)."""

    def __init__(self, causal: bool = False, mask: str | None = None, kv_heads: int = 4,
                 repeated: bool = False) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(16, 16 + 8 * kv_heads), nn.Linear(16, 5)
        self.causal, self.kv_heads, self.repeated = causal, kv_heads, repeated
        self.mask = None if mask is None else torch.randn(6, 6)
        if mask == "a row hidden":
            self.mask[2] = float("-inf")  # type: ignore[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (-1, 4)).transpose(1, 2) for t in self.qkv(x).split(
            [16, 4 * self.kv_heads, 4 * self.kv_heads], -1))
        if self.repeated:
            k, v = (t[:, :, None].expand(-1, -1, 4 // self.kv_heads, -1, -1).flatten(1, 2)
                    for t in (k, v))
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask,
                                               is_causal=self.causal,
                                               enable_gqa=k.size(1) < 4)
        return self.out(heads.transpose(1, 2).flatten(2))


# name -> (the module, the shape of its input)
TRAINED: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "1d": (lambda: nn.Sequential(nn.Linear(6, 8, bias=False), nn.BatchNorm1d(8), nn.Tanh()),
           (5, 6)),
    "1d over a sequence": (lambda: nn.Sequential(nn.Conv1d(3, 8, 3, bias=False),
                                                 nn.BatchNorm1d(8), nn.GELU()), (4, 3, 9)),
    "2d": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.SiLU(),
                                 nn.Conv2d(8, 4, 3, bias=False),
                                 nn.BatchNorm2d(4, momentum=0.3)), (3, 3, 9, 9)),
    "3d without affine": (lambda: nn.Sequential(nn.Conv3d(2, 4, 2, bias=False),
                                                nn.BatchNorm3d(4, affine=False), nn.Tanh()),
                          (2, 2, 5, 5, 5)),
    "no running statistics": (lambda: nn.Sequential(
        nn.Conv2d(3, 6, 3, bias=False), nn.BatchNorm2d(6, track_running_stats=False),
        nn.Tanh()), (4, 3, 7, 7)),
    "attention": (Attention, (3, 6, 16)),
    "causal attention": (lambda: Attention(causal=True), (3, 6, 16)),
    "attention with a mask": (lambda: Attention(mask="additive"), (3, 6, 16)),
    "attention with a row masked whole": (lambda: Attention(mask="a row hidden"), (3, 6, 16)),
    "grouped-query attention, causal": (lambda: Attention(causal=True, kv_heads=2), (3, 6, 16)),
    "multi-query attention with a mask": (lambda: Attention(mask="additive", kv_heads=1),
                                          (3, 6, 16)),
    "multi-query attention, heads repeated first": (
        lambda: Attention(causal=True, kv_heads=1, repeated=True), (3, 6, 16)),
}


def _train(module: nn.Module, x: torch.Tensor,
           seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One SGD step on the output's product with random values drawn from `seed` (a loss
    a norm cannot flatten): (the output, each gradient)."""
    module.zero_grad()
    out = module(x)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    (out * probe).sum().backward()
    grads = [p.grad.clone() for p in module.parameters()]  # type: ignore[union-attr]
    with torch.no_grad():
        for p in module.parameters():
            p -= 0.1 * p.grad  # type: ignore[operator]
    return out.detach(), grads


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_a_training_step_runs_on_the_host_as_eager(name: str, host: HostManager):
    make, shape = TRAINED[name]
    fresh_weights()
    module = make().train()
    reference = copy.deepcopy(module)
    fast = torch.compile(module, backend="prism", options={"host": host})
    with collecting() as reports:
        for more in GROWTH:
            x = fresh(shape[0] + more, *shape[1:])
            seed = int(np.random.default_rng().integers(2**62))
            got, got_grads = _train(fast, x, seed)
            want, want_grads = _train(reference, x, seed)
            assert relative_error(got, want) < 1e-4
            for g, w in zip(got_grads, want_grads, strict=True):
                assert relative_error(g, w) < 1e-4
    for (buffer, b), c in zip(module.named_buffers(), reference.buffers(), strict=True):
        assert torch.allclose(b, c, rtol=1e-5, atol=1e-6), buffer
    assert reports and all(r.networks and not r.kept_nodes for r in reports), \
        "\n".join(r.table() for r in reports)


def test_gradients_through_batch_norm_out_of_training_leave_pytorch_whole(host: HostManager):
    """Fine-tuning around frozen batch norms (or an input's saliency): the forward graph
    saves for the backward the empty statistics PyTorch's batch norm out of training
    makes, where torch.onnx's makes the running ones, and the whole block fell back."""
    fresh_weights()
    module = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.SiLU(),
                           nn.Conv2d(8, 4, 3), nn.BatchNorm2d(4)).eval()
    for norm in (module[1], module[4]):
        norm.running_mean.normal_()
        norm.running_var.uniform_(0.5, 2.0)
    reference = copy.deepcopy(module)
    fast = torch.compile(module, backend="prism", options={"host": host})
    with collecting() as reports:
        x, seed = fresh(3, 3, 9, 9), int(np.random.default_rng().integers(2**62))
        got, got_grads = _train(fast, x, seed)
        want, want_grads = _train(reference, x, seed)
    assert relative_error(got, want) < 1e-4
    for g, w in zip(got_grads, want_grads, strict=True):
        assert relative_error(g, w) < 1e-4
    assert reports and all(r.networks and not r.kept_nodes for r in reports), \
        "\n".join(r.table() for r in reports)


def test_float16_batch_norm_in_training_stays_in_pytorch(host: HostManager):
    fresh_weights()
    module = nn.BatchNorm1d(8).half().train()
    reference = copy.deepcopy(module)
    fast = torch.compile(module, backend="prism", options={"host": host})
    x = fresh(6, 8).half()
    with collecting() as reports:
        got = fast(x)
    assert torch.equal(got, reference(x))
    kept = {n.op: n.reason for r in reports for n in r.kept_nodes}
    assert any("batch norm in training mode" in why for why in kept.values()), kept


def test_the_backward_runs_pytorchs_own_kernels(host: HostManager):
    """The backward graph runs in PyTorch: its batch norm, pooling and activation
    gradients are PyTorch's fused kernels, not the exporter's decompositions of them."""
    fresh_weights()
    module = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.GELU(),
                           nn.MaxPool2d(2)).train()
    fast = torch.compile(module, backend="prism", options={"host": host})
    loss = fast(fresh(2, 3, 10, 10)).sum()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as ran:
        loss.backward()
    kernels = {event.key for event in ran.key_averages()}
    assert {"aten::native_batch_norm_backward", "aten::max_pool2d_with_indices_backward",
            "aten::gelu_backward"} <= kernels, sorted(kernels)
