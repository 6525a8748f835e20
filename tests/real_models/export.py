"""Export small real PyTorch / Hugging Face networks to ONNX for Prism's regression tests.

NOT run by the test suite (the project venv has no torch). To regenerate:

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch==2.13.0
    /tmp/torchenv/bin/pip install transformers onnx onnxruntime onnxscript numpy networkx rich
    /tmp/torchenv/bin/python tests/real_models/export.py          # from the repo root

Writes, next to this file, for each model NAME: NAME.onnx, NAME.inputs.npz (one input
set, keyed by input name) and NAME.outputs.npz (torch's outputs for it, keyed by output
name). Weights are random (seeded): no hub access is needed.
Models (exporter in brackets):
  bert      HF BertModel, tiny config              [dynamo, torch.export + onnxscript]
  gpt2      HF GPT2LMHeadModel, tiny, no cache     [dynamo]
  resnet    ResNet-18-style CNN in torch.nn        [legacy TorchScript, dynamo=False]
  gru       GRU + scripted loop over time (If/Loop) [legacy TorchScript, dynamo=False]
  digits_qdq  small CNN trained on scikit-learn's digits, quantization-aware: fake-quant
            activations (uint8) and per-channel weights (int8) [TorchScript, -> QDQ pairs]
            (also needs scikit-learn in the venv)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
VOCAB = 1000


def _save(name: str, path: Path, inputs: dict[str, torch.Tensor],
          outputs: dict[str, torch.Tensor]) -> None:
    model = onnx.load(str(path))
    # a single self-contained file, no external data
    onnx.save_model(model, str(path), save_as_external_data=False)
    for extra in path.parent.glob(path.name + ".data"):
        extra.unlink()
    # inputs alone, keyed by input name, so `prism run MODEL --inputs NAME.inputs.npz` works
    np.savez(HERE / f"{name}.inputs.npz", **{k: v.detach().numpy() for k, v in inputs.items()})
    np.savez(HERE / f"{name}.outputs.npz", **{k: v.detach().numpy() for k, v in outputs.items()})
    ops = sorted({n.op_type for n in model.graph.node})
    opset = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    print(f"{name}: {path.stat().st_size / 1e6:.2f} MB, IR {model.ir_version}, opsets {opset}, "
          f"{len(model.graph.node)} nodes, ops {ops}")
    # sanity: onnxruntime agrees with torch on the saved inputs
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {k: v.numpy() for k, v in inputs.items()})
    for (k, want), have in zip(outputs.items(), got, strict=True):
        err = np.max(np.abs(want.detach().numpy() - have))
        print(f"   ort vs torch {k}: max abs err {err:.2e}")


def _export(module, args, path, *, input_names, output_names, dynamic, dynamo: bool,
            opset: int | None = None):
    if dynamo:
        # dynamic_shapes: one {axis: Dim} per positional input
        dims = {0: torch.export.Dim("batch", max=1024), 1: torch.export.Dim("seq", max=128)}
        shapes = tuple({ax: dims[ax] for ax in dynamic.get(k, ())} for k in input_names)
        prog = torch.onnx.export(module, args, dynamo=True, input_names=input_names,
                                 output_names=output_names, dynamic_shapes=shapes,
                                 opset_version=opset, optimize=True)
        prog.save(str(path))
    else:
        axes = {k: {ax: f"{k}_{ax}" if ax else "batch" for ax in v} for k, v in dynamic.items()}
        for o in output_names:
            axes.setdefault(o, {0: "batch"})
        torch.onnx.export(module, args, str(path), dynamo=False, input_names=input_names,
                          output_names=output_names, dynamic_axes=axes,
                          opset_version=opset or 17, do_constant_folding=True)


class BertWrap(nn.Module):
    """Positional args -> HF kwargs, tuple of tensors out (torch.export wants named args)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         token_type_ids=token_type_ids)
        return out["last_hidden_state"], out["pooler_output"]


class Gpt2Wrap(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)["logits"]


def text_inputs(names, batch=2, seq=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    feeds = {"input_ids": torch.randint(0, VOCAB, (batch, seq), generator=g),
             "attention_mask": torch.ones(batch, seq, dtype=torch.int64),
             "token_type_ids": torch.zeros(batch, seq, dtype=torch.int64)}
    return {k: feeds[k] for k in names}


def export_bert(dynamo=True):
    import transformers
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=VOCAB,
                                  max_position_embeddings=128)
    model = transformers.BertModel(cfg).eval()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    outs = ["last_hidden_state", "pooler_output"]
    wrap = BertWrap(model).eval()
    inputs = text_inputs(names)
    with torch.no_grad():
        expected = dict(zip(outs, wrap(*inputs.values()), strict=True))
    path = HERE / "bert.onnx"
    _export(wrap, tuple(inputs.values()), path, input_names=names, output_names=outs,
            dynamic={k: (0, 1) for k in names}, dynamo=dynamo)
    _save("bert", path, inputs, expected)


def export_gpt2(dynamo=True):
    import transformers
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                  vocab_size=VOCAB, use_cache=False)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    names = ["input_ids", "attention_mask"]
    wrap = Gpt2Wrap(model).eval()
    inputs = text_inputs(names, seed=1)
    with torch.no_grad():
        expected = {"logits": wrap(*inputs.values())}
    path = HERE / "gpt2.onnx"
    _export(wrap, tuple(inputs.values()), path, input_names=names, output_names=["logits"],
            dynamic={k: (0, 1) for k in names}, dynamo=dynamo)
    _save("gpt2", path, inputs, expected)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """ResNet-18 layout (2-2-2-2 basic blocks), narrow widths (16..128)."""

    def __init__(self, widths=(16, 32, 64, 128), classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], widths[0]
        for i, w in enumerate(widths):
            layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


def _randomise_bn(model):
    g = torch.Generator().manual_seed(3)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)


def export_resnet(dynamo=False):
    model = ResNet().eval()
    _randomise_bn(model)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = {"logits": model(x)}
    path = HERE / "resnet.onnx"
    _export(model, (x,), path, input_names=["pixels"], output_names=["logits"],
            dynamic={"pixels": (0,)}, dynamo=dynamo)
    _save("resnet", path, {"pixels": x}, expected)


class GruLoop(nn.Module):
    """A GRU encoder, then a data-dependent scripted loop and branch (-> Loop, If)."""

    def __init__(self, dim=16, hidden=32):
        super().__init__()
        self.gru = nn.GRU(dim, hidden, batch_first=True)
        self.step = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, 4)

    def forward(self, x, steps):
        out, h = self.gru(x)
        state = h[0]
        for _ in range(int(steps)):
            state = torch.tanh(self.step(state)) + state
        if bool(state.sum() > 0):  # noqa: SIM108 (a statement If, exported as ONNX If)
            state = state * 2.0
        else:
            state = state - 1.0
        return self.head(state), out


def export_gru():
    model = GruLoop().eval()
    scripted = torch.jit.script(model)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 5, 16, generator=g)
    steps = torch.tensor(3, dtype=torch.int64)
    with torch.no_grad():
        head, out = model(x, steps)
    path = HERE / "gru_loop.onnx"
    torch.onnx.export(scripted, (x, steps), str(path), dynamo=False,
                      input_names=["x", "steps"], output_names=["head", "seq"],
                      dynamic_axes={"x": {0: "batch", 1: "time"}, "head": {0: "batch"},
                                    "seq": {0: "batch", 1: "time"}}, opset_version=17)
    _save("gru_loop", path, {"x": x, "steps": steps}, {"head": head, "seq": out})


class QdqDigits(nn.Module):
    """Conv-Conv-Pool-Linear on 8x8 digits. Every conv/linear input is fake-quantized to
    uint8 per tensor (ranges from the training data), every weight to int8 per output
    channel: TorchScript exports each as a QuantizeLinear/DequantizeLinear pair."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, 10)
        self.ranges: dict[str, tuple[float, float]] | None = None  # None: train in float

    def _act(self, name, x):
        if self.ranges is None:
            return x
        lo, hi = min(self.ranges[name][0], 0.0), max(self.ranges[name][1], 1e-6)
        scale = (hi - lo) / 255
        return torch.fake_quantize_per_tensor_affine(x, scale, round(-lo / scale), 0, 255)

    def _weight(self, w):
        if self.ranges is None:
            return w
        # scales as constants (not computed in the graph), so the export folds them
        scale = torch.tensor((w.detach().abs().flatten(1).amax(1).clamp(min=1e-8) / 127)
                             .tolist())
        return torch.fake_quantize_per_channel_affine(
            w, scale, torch.zeros_like(scale, dtype=torch.int32), 0, -128, 127)

    def forward(self, x, observe: dict | None = None):
        def seen(name, t):
            if observe is not None:
                lo, hi = observe.get(name, (np.inf, -np.inf))
                observe[name] = (min(lo, t.min().item()), max(hi, t.max().item()))
            return self._act(name, t)

        f = nn.functional
        x = f.relu(f.conv2d(seen("x", x), self._weight(self.conv1.weight), self.conv1.bias,
                            padding=1))
        x = f.relu(f.conv2d(seen("h1", x), self._weight(self.conv2.weight), self.conv2.bias,
                            padding=1))
        x = torch.flatten(f.max_pool2d(x, 2), 1)
        return f.linear(seen("h2", x), self._weight(self.fc.weight), self.fc.bias)


def export_digits_qdq():
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images[:, None] / 16.0, dtype=torch.float32)
    labels = torch.tensor(digits.target)
    train = slice(0, 1400)  # the rest is the test split
    model = QdqDigits()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(images[train]), labels[train])
        loss.backward()
        opt.step()
    ranges: dict = {}
    with torch.no_grad():
        model(images[train], observe=ranges)
    model.ranges = ranges
    for _ in range(50):  # quantization-aware fine-tuning through the fake quantizers
        opt.zero_grad()
        nn.functional.cross_entropy(model(images[train]), labels[train]).backward()
        opt.step()
    model.eval()
    x = images[1400:1408]
    with torch.no_grad():
        expected = {"logits": model(x)}
        test = images[1400:]
        accuracy = (model(test).argmax(1) == labels[1400:]).float().mean().item()
    print(f"digits_qdq: test accuracy {accuracy:.3f} on {len(test)} images")
    path = HERE / "digits_qdq.onnx"
    _export(model, (x,), path, input_names=["image"], output_names=["logits"],
            dynamic={"image": (0,)}, dynamo=False)
    _save("digits_qdq", path, {"image": x}, expected)


EXPORTS = {"bert": export_bert, "gpt2": export_gpt2, "resnet": export_resnet,
           "gru_loop": export_gru, "digits_qdq": export_digits_qdq}

if __name__ == "__main__":
    torch.manual_seed(0)
    for name in sys.argv[1:] or EXPORTS:
        torch.manual_seed(0)
        EXPORTS[name]()
