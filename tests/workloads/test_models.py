"""Built-in workloads run a real CPU training step at tiny sizes; adapters fail clearly."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from collocate.common.errors import InputError, UnknownNameError
from collocate.estimate.entrypoint import resolve, validate
from collocate.workloads import adapters, models


def _step(result: tuple[Any, ...]) -> torch.Tensor:
    work = validate(result)
    from collocate.estimate.trace import as_args, default_loss

    args, kwargs = as_args(work.inputs)
    out = work.model(*args, **kwargs)
    loss = default_loss(out, work.targets) if work.loss_fn is None else work.loss_fn(out, work.targets)
    loss.backward()
    work.optimizer.step()
    assert torch.isfinite(loss)
    return out


def test_mlp() -> None:
    out = _step(models.build_mlp(4, in_features=8, width=16, depth=2, classes=3))
    assert out.shape == (4, 3)


@pytest.mark.parametrize("arch", ["resnet18", "resnet26", "resnet50", "resnet152"])
def test_resnets_cifar_tiny(arch: str) -> None:
    out = _step(models.build_resnet(2, arch=arch, cifar=True, base=4))
    assert out.shape == (2, 100)


def test_resnet_imagenet_stem() -> None:
    out = _step(models.build_resnet(2, arch="resnet18", image_size=64, classes=10, base=4))
    assert out.shape == (2, 10)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_transformer(checkpointing: bool) -> None:
    out = _step(models.build_transformer(2, size="tiny", seq=16, vocab=50,
                                         checkpointing=checkpointing))
    assert out.shape == (2, 16, 50)


def test_dlrm_with_its_own_loss() -> None:
    result = models.build_dlrm(4, tables=3, rows=50, dim=8)
    assert len(result) == 4
    assert _step(result).shape == (4,)


def test_resnet_sizes_match_their_names() -> None:
    n = sum(p.numel() for p in models.build_resnet50(1)[0].parameters())
    assert 25.0e6 < n < 26.0e6  # ResNet-50 has 25.6 M parameters


@pytest.mark.parametrize(
    "name",
    ["build_mlp", "build_resnet18", "build_resnet26", "build_resnet50", "build_resnet152",
     "build_resnet18_cifar", "build_resnet50_cifar", "build_transformer_small",
     "build_transformer_base", "build_transformer_base_ckpt", "build_dlrm"],
)
def test_entry_points_resolve(name: str) -> None:
    assert callable(resolve(f"collocate.workloads.models:{name}"))


@pytest.mark.parametrize(("entry", "package"), [("tv_resnet50", "torchvision"),
                                                ("timm_vit_base_patch16_224", "timm"),
                                                ("hf_bert_base", "transformers")])
def test_adapter_names_missing_package(entry: str, package: str) -> None:
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    fn = resolve(f"collocate.workloads.adapters:{entry}")
    with pytest.raises(InputError, match=f"needs the '{package}' package") as info:
        fn(batch_size=2)
    assert f"pip install {package}" in str(info.value)


def test_unknown_hf_model_lists_known() -> None:
    with pytest.raises(UnknownNameError) as info:
        adapters.build_hf(2, "not_a_model")
    assert "bert_base" in info.value.valid


def test_unknown_prefix_is_attribute_error() -> None:
    with pytest.raises(InputError, match="has no attribute"):
        resolve("collocate.workloads.adapters:keras_resnet")
