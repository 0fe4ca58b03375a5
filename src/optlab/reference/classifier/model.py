"""The reference classifier: a small ResNet over MODEL_SIDE x MODEL_SIDE RGB, and its weights.

Sized so that a batch-1 forward pass on one or two CPU cores takes a few milliseconds with a
large share of per-operator overhead: batching then pays off, as it does on a real service.
This module imports torch; `optlab.reference.classifier` itself does not, and neither should callers
that only need the data.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from optlab.errors import OptlabError
from optlab.reference.classifier.data import MODEL_SIDE

WEIGHTS_FILE = "classifier.pt"
NUM_CLASSES = 10
# Channels of the stem and of each residual stage; each stage after the first halves the side.
STAGE_WIDTHS: tuple[int, ...] = (24, 48, 96)
BLOCKS_PER_STAGE = 1

_REGENERATE_HINT = (
    "regenerate the weights with scripts/train_reference_model.sh "
    "(python -m optlab.reference.classifier.train; a few minutes on a CPU)"
)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        result: torch.Tensor = self.relu(out + self.shortcut(x))
        return result


class DigitResNet(nn.Module):
    """Per-image standardisation, a stride-2 stem, `depth` residual blocks per stage, global
    average pool, linear head.

    Input: float32 N x 3 x MODEL_SIDE x MODEL_SIDE, normalised as `data.decode_reference` does.
    Output: N x 10 logits.
    """

    def __init__(
        self, widths: tuple[int, ...] = STAGE_WIDTHS, depth: int = BLOCKS_PER_STAGE
    ) -> None:
        super().__init__()
        # Every request has its own background colour and ink polarity. Standardising each image
        # (per channel, no learned or running statistics) removes the colour cast before the
        # first convolution, so the network learns shapes: without it training needed several
        # times the epochs to leave chance level.
        self.standardise = nn.InstanceNorm2d(3)
        # A stride-2 stem: the digit fills most of the frame, so full resolution in the first
        # stage would cost four times the compute for no accuracy.
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 2, 1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
        )
        blocks: list[nn.Module] = []
        channels = widths[0]
        for stage, width in enumerate(widths):
            for block in range(depth):
                stride = 2 if stage > 0 and block == 0 else 1
                blocks.append(BasicBlock(channels, width, stride))
                channels = width
        self.stages = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(channels, NUM_CLASSES)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.pool(self.stages(self.stem(self.standardise(x))))
        logits: torch.Tensor = self.head(torch.flatten(features, 1))
        return logits


def build_model() -> nn.Module:
    """A freshly initialised classifier (training mode); seed torch first for reproducibility."""
    return DigitResNet()


def weights_path() -> Path:
    """Where the shipped weights live: next to this module, inside the installed package."""
    return Path(__file__).resolve().parent / WEIGHTS_FILE


def load_trained(device: str = "cpu") -> nn.Module:
    """The classifier with the shipped fp32 weights, on `device`, in eval mode."""
    path = weights_path()
    if not path.is_file():
        raise OptlabError(
            f"the reference model's weights are missing: {path}", hint=_REGENERATE_HINT
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model = build_model()
        model.load_state_dict(state)
    except (RuntimeError, OSError, ValueError, KeyError) as exc:
        raise OptlabError(
            f"the reference model's weights cannot be loaded from {path}: {exc}",
            hint=_REGENERATE_HINT,
        ) from exc
    return model.to(device).eval()


__all__ = [
    "MODEL_SIDE",
    "NUM_CLASSES",
    "WEIGHTS_FILE",
    "BasicBlock",
    "DigitResNet",
    "build_model",
    "load_trained",
    "weights_path",
]
