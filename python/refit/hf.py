"""Minimal adapter for a Hugging Face `transformers` model on either side of a refit.

Engine side:
    engine = refit.hf.attach("unix:/run/refitd/refitd.sock", model)  # a PreTrainedModel
    ids = engine.generate(input_ids, max_new_tokens=16)       # each call sees one version

Trainer side:
    client.refit(model_name, refit.hf.named_weights(model))

Names are the checkpoint names (`model.layers.0.self_attn.q_proj.weight`), which is what model
specs match. Tied weights (e.g. lm_head tied to embed_tokens) appear once, under the name
named_parameters() gives them; a spec should not expect the other name. Only parameters are
registered: buffers (rotary tables) are computed, not trained.

Threading: as ModuleEngine.
"""
from __future__ import annotations

from .engine import ModuleEngine


def named_weights(model):
    """(name, tensor) of every trainable weight, once per storage, in checkpoint names."""
    return [(name, p.detach()) for name, p in model.named_parameters()]


class HFEngine(ModuleEngine):
    """A transformers model whose weights refitd updates; forward and generate run gated."""

    def forward(self, *args, **kwargs):
        import torch

        with self.serving(), torch.no_grad():
            return self.module(*args, **kwargs)

    def generate(self, *args, **kwargs):
        with self.serving():
            return self.module.generate(*args, **kwargs)


def attach(address: str, model, **kwargs) -> HFEngine:
    """Moves `model`'s parameters into shared memory and registers them with refitd."""
    return HFEngine(address, model, **kwargs)
