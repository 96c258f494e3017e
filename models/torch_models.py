"""PyTorch definitions of the registry's models. Each builder takes its validated argument model and
the dataset's description (`input_shape`, `num_classes`, or `vocab_size`, `seq_len`)."""
from __future__ import annotations

import math

import torch
from torch import nn

from .registry import CNNArgs, MLPArgs, ResNetArgs, TransformerArgs


class MLP(nn.Module):
    """Input: float tensor (N, *input_shape), flattened. Output: class logits (N, num_classes)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: list[int], dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """Input: images (N, C, H, W), H and W from 8 up. Output: class logits (N, num_classes).

    Each stage is conv3x3 + BatchNorm + ReLU, halving the resolution while it is above 4x4."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, channels: list[int], hidden: int,
                 dropout: float = 0.0):
        super().__init__()
        c_in, size = input_shape[0], input_shape[-1]
        stages: list[nn.Module] = []
        for c in channels:
            stages += [nn.Conv2d(c_in, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU()]
            if size > 4:
                stages.append(nn.MaxPool2d(2))
                size //= 2
            c_in = c
        self.features = nn.Sequential(*stages, nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(c_in * 4, hidden), nn.ReLU(), nn.Dropout(dropout),
                                  nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class _BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
            nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out))
        self.shortcut = nn.Identity() if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet (He et al. 2016, sec. 4.2): depth = 6n + 2, three stages of n basic blocks
    with 16, 32, 64 (x width) channels. Input: images (N, C, H, W). Output: logits (N, num_classes)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, depth: int, width: int = 1):
        super().__init__()
        n = (depth - 2) // 6
        widths = [16 * width, 32 * width, 64 * width]
        layers: list[nn.Module] = [nn.Conv2d(input_shape[0], widths[0], 3, 1, 1, bias=False),
                                   nn.BatchNorm2d(widths[0]), nn.ReLU()]
        c_in = widths[0]
        for stage, c in enumerate(widths):
            for block in range(n):
                layers.append(_BasicBlock(c_in, c, 2 if stage > 0 and block == 0 else 1))
                c_in = c
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(c_in, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


class TransformerLM(nn.Module):
    """Decoder-only language model (pre-norm, causal self-attention, learned positions, tied output).

    Input: token ids (N, T) with T <= max_len. Output: next-token logits (N, T, vocab_size)."""

    def __init__(self, vocab_size: int, d_model: int, heads: int, layers: int, d_ff: int, dropout: float,
                 max_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Parameter(torch.zeros(max_len, d_model))
        nn.init.normal_(self.pos, std=0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, d_ff, dropout, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.pos.shape[0]:
            raise ValueError(f"sequence length {t} exceeds max_len {self.pos.shape[0]}")
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        h = self.blocks(self.embed(tokens) + self.pos[:t], mask=mask, is_causal=True)
        return self.head(self.norm(h))


def build_mlp(args: MLPArgs, *, input_shape, num_classes, **_) -> MLP:
    return MLP(tuple(input_shape), num_classes, args.hidden, args.dropout)


def build_cnn(args: CNNArgs, *, input_shape, num_classes, **_) -> CNN:
    return CNN(tuple(input_shape), num_classes, args.channels, args.hidden, args.dropout)


def build_resnet(args: ResNetArgs, *, input_shape, num_classes, **_) -> ResNet:
    return ResNet(tuple(input_shape), num_classes, args.depth, args.width)


def build_transformer(args: TransformerArgs, *, vocab_size, seq_len, **_) -> TransformerLM:
    if seq_len > args.max_len:
        raise ValueError(f"model.args.max_len ({args.max_len}) is below the dataset's sequence length ({seq_len})")
    return TransformerLM(vocab_size, args.d_model, args.heads, args.layers, args.d_ff, args.dropout, args.max_len)
