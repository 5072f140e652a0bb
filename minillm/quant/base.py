"""The quantization seam: what a linear backend is (lesson 09).

The model's forward calls `self.q_proj(x)` and whatever module sits there answers, so a
quantized linear is any nn.Module that computes `y = x @ W.T + b` from its own stored
form of W, and knows how to build itself from a float linear (nn.Linear or PanelLinear:
anything with `weight` [out, in] and `bias`). Each registers its name once in
`minillm.utils.registry.LINEAR_BACKENDS`; the engine option `quantization=`, the CLI and
the server flags read that registry, so a learner's class plugs in with one call:

    register_linear_backend(MyInt8Linear)      # then LLM(..., quantization="my-int8")
"""
from __future__ import annotations

import abc

import torch
from torch import nn


class LinearBackend(nn.Module, abc.ABC):
    """A linear layer with weights stored its own way. Subclasses set `name`."""

    name: str = ""

    @classmethod
    @abc.abstractmethod
    def from_linear(cls, linear: nn.Module, **options) -> "LinearBackend":
        """A module computing the same x @ W.T + b as `linear` (its weight [out, in], its bias)."""

    @abc.abstractmethod
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> [..., out_features]."""
