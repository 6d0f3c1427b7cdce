"""Small models written with torch.nn only (``builtin:*``), for collection on machines without
torchvision / timm / transformers and for the CPU smoke preset.

They cover the same kernel families as the zoo (GEMMs, convolutions with batch norm or group
norm, fused attention, layer norm, GELU, residual adds, embeddings, cross-entropy) at sizes a CPU
runs in milliseconds; the GPU presets scale them by batch size and sequence length.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UnknownModelError


class MLP(nn.Module):
    def __init__(self, width: int = 1024, depth: int = 4, in_features: int = 784,
                 classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(in_features, width), nn.GELU()]
        for _ in range(depth - 1):
            layers += [nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        skip = x if self.down is None else self.down(x)
        return F.relu(out + skip)


class ConvNet(nn.Module):
    """A small ResNet: stem, four stages of basic blocks, global pool, classifier."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128, 256), classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        blocks: list[nn.Module] = []
        cin = widths[0]
        for i, w in enumerate(widths):
            blocks.append(_Block(cin, w, 1 if i == 0 else 2))
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class _PreActBlock(nn.Module):
    """A pre-activation bottleneck with group norm (timm's ResNetV2 / BiT block)."""

    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        mid = cout // 4
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.norm2 = nn.GroupNorm(groups, mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False)
        self.norm3 = nn.GroupNorm(groups, mid)
        self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
        self.down = (nn.Conv2d(cin, cout, 1, stride, bias=False)
                     if stride != 1 or cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.norm1(x))
        skip = x if self.down is None else self.down(pre)
        out = self.conv1(pre)
        out = self.conv2(F.relu(self.norm2(out)))
        out = self.conv3(F.relu(self.norm3(out)))
        return out + skip


class GNNet(nn.Module):
    """A small pre-activation ResNet with GroupNorm(8): under CUDA autocast, group_norm is on
    the fp32 list, so every norm upcasts its fp16 input and every following convolution casts
    back: the kernels whose cost the timm ResNetV2-GN / BiT rows put in question."""

    def __init__(self, widths: tuple[int, ...] = (64, 128, 256, 512), groups: int = 8,
                 classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 7, 2, 3, bias=False), nn.MaxPool2d(3, 2, 1))
        blocks: list[nn.Module] = []
        cin = 32
        for i, w in enumerate(widths):
            blocks.append(_PreActBlock(cin, w, 1 if i == 0 else 2, groups))
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.norm = nn.GroupNorm(groups, cin)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm(self.blocks(self.stem(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class _DecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (y.view(shape).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    """A decoder-only transformer; forward(input_ids, labels) returns the LM loss with labels."""

    def __init__(self, vocab: int = 4096, dim: int = 384, layers: int = 4, heads: int = 6,
                 max_len: int = 2048) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.layers = nn.ModuleList(_DecoderLayer(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor,
                labels: torch.Tensor | None = None) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.tok(input_ids) + self.pos(torch.arange(t, device=input_ids.device))
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.ln(x))
        if labels is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


@dataclass(frozen=True)
class Builtin:
    name: str
    family: str
    kind: str  # "vision" | "text" | "vector"
    builder: Callable[[], nn.Module]
    image_size: int = 0
    in_features: int = 0
    vocab_size: int = 0
    default_seq_len: int = 0
    max_seq_len: int = 0


BUILTINS: dict[str, Builtin] = {b.name: b for b in (
    Builtin("builtin:mlp", "mlp", "vector", MLP, in_features=784),
    Builtin("builtin:convnet", "convnet", "vision", ConvNet, image_size=128),
    Builtin("builtin:gnnet", "gnnet", "vision", GNNet, image_size=128),
    Builtin("builtin:gpt", "gpt-builtin", "text", GPT, vocab_size=4096, default_seq_len=128,
            max_seq_len=2048),
)}


def is_builtin(name: str) -> bool:
    return name.startswith("builtin:")


def get_builtin(name: str) -> Builtin:
    if name not in BUILTINS:
        raise UnknownModelError(f"unknown builtin model {name!r}; known: {', '.join(BUILTINS)}")
    return BUILTINS[name]


def input_specs(name: str, batch_size: int, seq_len: int | None, float_dtype: torch.dtype,
                *, with_labels: bool) -> dict[str, tuple[tuple[int, ...], torch.dtype, int]]:
    """name -> (shape, dtype, upper bound for integer inputs) of a builtin model's inputs."""
    b = get_builtin(name)
    if b.kind == "vision":
        return {"x": ((batch_size, 3, b.image_size, b.image_size), float_dtype, 0)}
    if b.kind == "vector":
        return {"x": ((batch_size, b.in_features), float_dtype, 0)}
    t = seq_len or b.default_seq_len
    out = {"input_ids": ((batch_size, t), torch.long, b.vocab_size)}
    if with_labels:
        out["labels"] = ((batch_size, t), torch.long, b.vocab_size)
    return out
