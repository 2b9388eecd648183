"""``resnet50_pytorch``: a ResNet-50 (He et al. 2015, "Deep Residual Learning for Image
Recognition", table 1: bottleneck blocks [3, 4, 6, 3], widths 256..2048, 25.6 M weights) as a
Triton ``pytorch_libtorch`` model, for the cold-start benchmark of a framework model of real
size (``model.pt`` ≈ 98 MB). The weights are random (seed 0): nothing is fetched from a hub,
and a cold start's cost is the file's size and the graph, not what the weights learned.

Input ``input__0`` FP32 [3, 224, 224] (batch dimension implicit, ``max_batch_size: 8``),
output ``output__0`` FP32 [1000] (logits), Triton's ``<name>__<index>`` naming.
"""

from __future__ import annotations

import warnings
from pathlib import Path

CONFIG = """\
name: "resnet50_pytorch"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "input__0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 1000 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

#: Bottleneck blocks per stage and each stage's inner width (the paper's table 1, 50-layer).
STAGES = ((3, 64), (4, 128), (6, 256), (3, 512))
EXPANSION = 4


def resnet50():
    """The network as a ``torch.nn.Module`` in eval mode (batch norm with its init statistics)."""
    import torch  # noqa: PLC0415
    from torch import nn  # noqa: PLC0415

    def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list:
        return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * EXPANSION
            self.body = nn.Sequential(*conv_bn(cin, width, 1), nn.ReLU(), *conv_bn(width, width, 3, stride),
                                      nn.ReLU(), *conv_bn(width, cout, 1))  # fmt: skip
            self.skip = nn.Sequential(*conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout else None

        def forward(self, x):
            return torch.relu(self.body(x) + (x if self.skip is None else self.skip(x)))

    layers, cin = [*conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 64
    for index, (blocks, width) in enumerate(STAGES):
        for block in range(blocks):
            layers.append(Bottleneck(cin, width, 2 if block == 0 and index > 0 else 1))
            cin = width * EXPANSION
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    torch.manual_seed(0)
    return nn.Sequential(*layers).eval()


def build(repository: Path) -> None:
    """Write ``resnet50_pytorch/{config.pbtxt,1/model.pt}`` (traced TorchScript) under ``repository``."""
    import torch  # noqa: PLC0415

    folder = repository / "resnet50_pytorch"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.inference_mode():  # TorchScript: deprecated upstream
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(resnet50(), torch.zeros(1, 3, 224, 224))
    torch.jit.save(traced, str(folder / "1" / "model.pt"))
    (folder / "config.pbtxt").write_text(CONFIG)
