"""Factories for transformers models, returning logits only (a plain tensor output)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class LogitsOnly(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model(*args).logits  # type: ignore[no-any-return]


def bert(**overrides: Any) -> nn.Module:
    """BertForMaskedLM with bert-base's config (random init); kwargs override config fields."""
    from transformers import BertConfig, BertForMaskedLM

    return LogitsOnly(BertForMaskedLM(BertConfig(**overrides)))


def gpt2(**overrides: Any) -> nn.Module:
    """GPT2LMHeadModel with gpt2's config, no KV cache. Export needs attn_implementation set
    (without it, export fails on a view of a non-contiguous tensor)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(use_cache=False, **overrides)
    config._attn_implementation = "sdpa"
    return LogitsOnly(GPT2LMHeadModel(config))
