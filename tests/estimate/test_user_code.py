"""A user's own code: an entry point beside the user in the current directory, and models whose
outputs are dense predictions (the default loss must fit them, or say how to pass one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from collocate.common.errors import InputError
from collocate.estimate.api import estimate_memory

MYMOD = textwrap.dedent("""
    import torch
    from torch import nn

    def build(batch_size: int):
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        batch = (torch.randn(batch_size, 16), torch.randint(0, 4, (batch_size,)))
        return model, batch, torch.optim.SGD(model.parameters(), lr=0.1)
""")


def test_estimate_imports_the_entry_point_from_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "mymod.py").write_text(MYMOD)
    # Started as the console script is: its own folder first on sys.path, not the cwd.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "collocate").write_text("from collocate.cli import main\nmain()\n")
    out = subprocess.run([sys.executable, str(tmp_path / "bin" / "collocate"), "estimate", "mymod:build",
                          "-b", "8", "--format", "json", "--fallback", "none"],
                         cwd=tmp_path / "project", capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTORCH_CUDA_ALLOC_CONF": ""}, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["method"] == "traced"


class TinySegmenter(nn.Module):
    """A U-Net in miniature: (N, 3, H, W) images to (N, classes, H, W) per-pixel outputs."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.head = nn.Conv2d(8 + 3, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.up(torch.relu(self.down(x))), x], dim=1))


def _entry(classes: int, targets):
    def build(batch_size: int):
        model = TinySegmenter(classes)
        batch = (torch.randn(batch_size, 3, 16, 16), targets(batch_size))
        return model, batch, torch.optim.Adam(model.parameters())
    return build


@pytest.mark.parametrize("classes,targets", [
    (5, lambda n: torch.randint(0, 5, (n, 16, 16))),  # segmentation: class per pixel
    (1, lambda n: torch.rand(n, 1, 16, 16)),          # dense regression: a value per pixel
    (1, lambda n: torch.rand(n, 16, 16)),             # ... its target without the channel
], ids=["cross-entropy-per-pixel", "mse-same-shape", "mse-same-size"])
def test_dense_outputs_get_a_default_loss(classes, targets) -> None:
    est = estimate_memory(_entry(classes, targets), batch_size=4, fallbacks=())
    assert est.method == "traced" and est.mib > 0


def test_targets_no_default_loss_fits_name_the_fix() -> None:
    with pytest.raises(InputError) as err:
        estimate_memory(_entry(5, lambda n: torch.randint(0, 5, (n,))), batch_size=4, fallbacks=())
    assert "(4, 5, 16, 16)" in str(err.value) and "loss_fn" in str(err.value)
