"""Entry points for torchvision, timm and Hugging Face transformers models, built from configs.

Why: the estimator must be validated on the models people actually train, without downloading
weights. Names resolve lazily through module ``__getattr__``, so any model of those libraries can
be named on the command line:

    collocate estimate collocate.workloads.adapters:tv_resnet50 -b 64
    collocate estimate collocate.workloads.adapters:timm_vit_base_patch16_224 -b 32
    collocate estimate collocate.workloads.adapters:hf_bert_base -b 16

The libraries are optional (installed on the GPU machine, not in CI); naming a model whose
library is missing raises an ``InputError`` saying which package to install.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from collocate.common.errors import InputError, UnknownNameError

#: Hugging Face configurations: name -> (config class, config kwargs, model class, seq length).
HF_MODELS: dict[str, tuple[str, dict[str, Any], str, int]] = {
    "bert_base": ("BertConfig", {}, "BertForMaskedLM", 512),
    "bert_large": ("BertConfig", {"hidden_size": 1024, "num_hidden_layers": 24,
                                  "num_attention_heads": 16, "intermediate_size": 4096},
                   "BertForMaskedLM", 512),
    "gpt2": ("GPT2Config", {}, "GPT2LMHeadModel", 1024),
    "gpt2_medium": ("GPT2Config", {"n_embd": 1024, "n_layer": 24, "n_head": 16},
                    "GPT2LMHeadModel", 1024),
    "roberta_base": ("RobertaConfig", {"vocab_size": 50265, "max_position_embeddings": 514},
                     "RobertaForMaskedLM", 512),
    "t5_small": ("T5Config", {}, "T5ForConditionalGeneration", 512),
}


def require(package: str) -> Any:
    """Import an optional model library or say exactly what to install."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        pip = {"transformers": "transformers", "timm": "timm", "torchvision": "torchvision"}[package]
        raise InputError(
            f"this model needs the {package!r} package, which is not installed",
            hint=f"pip install {pip}  (or pick a built-in model from collocate.workloads.models)",
        ) from exc


def _classifier_batch(batch_size: int, image_size: int, classes: int) -> tuple[Any, Any]:
    import torch

    return (torch.randn(batch_size, 3, image_size, image_size),
            torch.randint(0, classes, (batch_size,)))


def build_torchvision(batch_size: int, name: str, *, image_size: int = 224) -> tuple[Any, ...]:
    """A torchvision classification model with random weights (``weights=None``)."""
    tv = require("torchvision")
    import torch

    try:
        model = tv.models.get_model(name, weights=None)
    except ValueError as exc:
        raise UnknownNameError("torchvision model", name, tv.models.list_models()) from exc
    if name.startswith("inception"):
        image_size = max(image_size, 299)
        model.aux_logits, model.AuxLogits = False, None
    return model, _classifier_batch(batch_size, image_size, 1000), torch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.9)


def build_timm(batch_size: int, name: str) -> tuple[Any, ...]:
    """A timm model with random weights at its default input size."""
    timm = require("timm")
    import torch

    if name not in timm.list_models():
        raise UnknownNameError("timm model", name, timm.list_models()[:50])
    model = timm.create_model(name, pretrained=False)
    _, h, _ = model.pretrained_cfg.get("input_size", (3, 224, 224))
    return model, _classifier_batch(batch_size, h, model.num_classes), torch.optim.AdamW(
        model.parameters(), lr=1e-3)


def build_hf(batch_size: int, name: str, *, seq: int | None = None) -> tuple[Any, ...]:
    """A Hugging Face transformers model built from a config (no download)."""
    if name not in HF_MODELS:
        raise UnknownNameError("transformers model", name, list(HF_MODELS))
    tf = require("transformers")
    import torch

    cfg_cls, kwargs, model_cls, default_seq = HF_MODELS[name]
    config = getattr(tf, cfg_cls)(**kwargs)
    model = getattr(tf, model_cls)(config)
    s = seq or default_seq
    ids = torch.randint(0, config.vocab_size, (batch_size, s))
    inputs: dict[str, Any] = {"input_ids": ids, "labels": ids.clone()}
    if model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = ids.clone()
    return model, inputs, torch.optim.AdamW(model.parameters(), lr=1e-4)


_PREFIXES: dict[str, Callable[..., tuple[Any, ...]]] = {
    "tv_": build_torchvision,
    "timm_": build_timm,
    "hf_": build_hf,
}


def entry(name: str) -> Callable[..., tuple[Any, ...]]:
    """The entry point for ``tv_<model>``, ``timm_<model>`` or ``hf_<model>``."""
    for prefix, builder in _PREFIXES.items():
        if name.startswith(prefix):
            fn = functools.partial(builder, name=name[len(prefix):])
            fn.__qualname__ = name  # type: ignore[attr-defined]
            return fn
    raise AttributeError(name)


def __getattr__(name: str) -> Callable[..., tuple[Any, ...]]:
    if name.startswith("__"):
        raise AttributeError(name)
    return entry(name)
