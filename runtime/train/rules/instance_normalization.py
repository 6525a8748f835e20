"""InstanceNormalization (what PyTorch's GroupNorm and InstanceNorm export as): each
sample's channel normalized over its own space, as in inference; the node is rewritten
into ai.onnx ops whose rules give its gradient."""

from __future__ import annotations

from runtime.train.registry import Rewriting, rewrite
from runtime.train.rules._normalize import normalize


@rewrite("InstanceNormalization")
def instance_normalization(r: Rewriting) -> dict[str, str]:
    normalize(r, list(range(2, len(r.shape(r.node.input[0])))))
    return {}
