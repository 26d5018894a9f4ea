"""One real training job of the issue-16 GPU trace, on synthetic data (no downloads).

The model families are not collocate's built-in workloads (``collocate.workloads.models``):
timm ConvNeXt-nano and EfficientNet-B0, torchvision MobileNetV3-large and ResNet-34, transformers
BERT and GPT-2 from small configs, a LLaMA-style 8-layer decoder trained in bf16, and plain
PyTorch LSTM, U-Net (dense (N, C, H, W) logits) and MLP. Models whose names end in ``-tiny`` are
plain PyTorch and small enough for a CPU dry run; timm, torchvision and transformers are imported
only when their model is built, so this file imports on a machine without them.

Two faces, the same code:

* **an entry point for ``collocate estimate``**, as a user would write one:
  ``first_run_job:build_<name>`` (``-`` written ``_``), e.g.
  ``PYTHONPATH=benchmarks/gpu collocate estimate first_run_job:build_convnext_nano -b 64``;
  it returns ``(model, (inputs, targets), optimizer, loss_fn)`` on the CPU;
* **the training script** the daemon runs:
  ``python first_run_job.py --model convnext-nano --batch-size 64 --steps 300 --lr 1e-3``
  trains on CUDA when there is one, else on the CPU, exactly the iteration the estimator traced
  (forward, loss, backward, optimizer step; bf16 autocast where the model says so).

``--calibrate name:batch,...`` times a few steps of each model in one process (one CUDA start
for all) and prints JSON: the driver (``first_run_gpu.py``) sizes each job's steps from it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Spec:
    """How to build one model: ``make(batch_size)`` -> (model, inputs, targets, loss_fn)."""

    make: Callable[[int], tuple[Any, Any, Any, Any]]
    precision: str = "fp32"  # fp32 or bf16 (autocast), as `collocate estimate --precision`
    optimizer: str = "adamw"


def _ce(out: Any, targets: torch.Tensor) -> torch.Tensor:
    logits = getattr(out, "logits", out)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def _ce_dense(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.float(), targets)  # (N, C, H, W) logits, (N, H, W) classes


# ---------------------------------------------------------------- plain PyTorch families


class LstmLM(nn.Module):
    """Embedding, stacked LSTM, vocabulary head: a word-level language model."""

    def __init__(self, vocab: int, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim, layers, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out)


def _conv_block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """A small U-Net for segmentation: per-pixel class logits (N, classes, H, W)."""

    def __init__(self, base: int, depth: int, classes: int) -> None:
        super().__init__()
        widths = [base * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList([_conv_block(3 if i == 0 else widths[i - 1], widths[i]) for i in range(depth)])
        self.bottom = _conv_block(widths[depth - 1], widths[depth])
        self.up = nn.ModuleList([nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in reversed(range(depth))])
        self.merge = nn.ModuleList([_conv_block(2 * widths[i], widths[i]) for i in reversed(range(depth))])
        self.head = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.bottom(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips), strict=True):
            x = merge(torch.cat([up(x), skip], dim=1))
        return self.head(x)


def _mlp(in_features: int, width: int, depth: int, classes: int) -> nn.Module:
    layers: list[nn.Module] = []
    dim = in_features
    for _ in range(depth):
        layers += [nn.Linear(dim, width), nn.GELU()]
        dim = width
    return nn.Sequential(*layers, nn.Linear(dim, classes))


def lstm(vocab: int, dim: int, layers: int, seq: int) -> Callable[[int], tuple]:
    def make(b: int) -> tuple:
        return (LstmLM(vocab, dim, layers), torch.randint(0, vocab, (b, seq)),
                torch.randint(0, vocab, (b, seq)), _ce)
    return make


def unet(base: int, depth: int, size: int, classes: int) -> Callable[[int], tuple]:
    def make(b: int) -> tuple:
        return (UNet(base, depth, classes), torch.randn(b, 3, size, size),
                torch.randint(0, classes, (b, size, size)), _ce_dense)
    return make


def mlp(in_features: int, width: int, depth: int) -> Callable[[int], tuple]:
    def make(b: int) -> tuple:
        return (_mlp(in_features, width, depth, 100), torch.randn(b, in_features),
                torch.randint(0, 100, (b,)), _ce)
    return make


# ---------------------------------------------------------------- timm, torchvision, transformers


def image(family: str, name: str, size: int = 224, classes: int = 1000) -> Callable[[int], tuple]:
    def make(b: int) -> tuple:
        if family == "timm":
            import timm

            model = timm.create_model(name, pretrained=False, num_classes=classes)
        else:
            import torchvision

            model = torchvision.models.get_model(name, weights=None, num_classes=classes)
        return model, torch.randn(b, 3, size, size), torch.randint(0, classes, (b,)), _ce
    return make


def bert(seq: int = 128, **config: Any) -> Callable[[int], tuple]:
    def make(b: int) -> tuple:
        from transformers import BertConfig, BertForSequenceClassification

        model = BertForSequenceClassification(BertConfig(num_labels=4, **config))
        tokens = torch.randint(0, model.config.vocab_size, (b, seq))
        return model, {"input_ids": tokens, "attention_mask": torch.ones_like(tokens)}, torch.randint(0, 4, (b,)), _ce
    return make


def causal_lm(kind: str, seq: int, **config: Any) -> Callable[[int], tuple]:
    """GPT-2 or LLaMA from a config; the loss is next-token cross-entropy on the logits."""
    def make(b: int) -> tuple:
        import transformers

        if kind == "gpt2":
            model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config))
        else:
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
        tokens = torch.randint(0, model.config.vocab_size, (b, seq))
        return model, {"input_ids": tokens}, torch.roll(tokens, -1, dims=1), _ce
    return make


# Batch sizes and step counts for the GPU are the driver's (first_run_gpu.TRACE); these only build.
MODELS: dict[str, Spec] = {
    "convnext-nano": Spec(image("timm", "convnext_nano")),
    "efficientnet-b0": Spec(image("timm", "efficientnet_b0")),
    "mobilenet-v3-large": Spec(image("torchvision", "mobilenet_v3_large")),
    "resnet34": Spec(image("torchvision", "resnet34"), optimizer="sgd"),
    "bert-small": Spec(bert(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=2048)),
    "gpt2-small": Spec(causal_lm("gpt2", 256, n_layer=6, n_embd=512, n_head=8, n_positions=256)),
    "llama-8l": Spec(causal_lm("llama", 256, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                               num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                               max_position_embeddings=256), precision="bf16"),
    "lstm": Spec(lstm(vocab=16000, dim=1024, layers=2, seq=128)),
    "unet": Spec(unet(base=32, depth=4, size=256, classes=21)),
    "mlp": Spec(mlp(in_features=2048, width=8192, depth=4)),
    # plain PyTorch and small: the CPU dry run
    "lstm-tiny": Spec(lstm(vocab=200, dim=32, layers=1, seq=16)),
    "unet-tiny": Spec(unet(base=4, depth=2, size=32, classes=3)),
    "mlp-tiny": Spec(mlp(in_features=64, width=64, depth=2)),
}


def build(name: str, batch_size: int, lr: float = 1e-3) -> tuple[Any, ...]:
    """``(model, (inputs, targets), optimizer, loss_fn)`` on the CPU: the estimator's contract."""
    if name not in MODELS:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    spec = MODELS[name]
    model, inputs, targets, loss_fn = spec.make(batch_size)
    if spec.optimizer == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    return model, (inputs, targets), optimizer, loss_fn


def entry_point(name: str) -> str:
    """What to pass to ``collocate estimate`` for ``name``."""
    return f"first_run_job:build_{name.replace('-', '_')}"


def __getattr__(attr: str) -> Callable[..., tuple[Any, ...]]:
    """``build_<name>(batch_size)`` for every model: the entry points ``collocate estimate`` takes."""
    name = attr.removeprefix("build_").replace("_", "-")
    if not attr.startswith("build_") or name not in MODELS:
        raise AttributeError(attr)

    def entry(batch_size: int) -> tuple[Any, ...]:
        return build(name, batch_size)

    entry.__qualname__ = attr
    return entry


# ---------------------------------------------------------------- training


def _to(x: Any, device: torch.device) -> Any:
    if isinstance(x, dict):
        return {k: v.to(device) for k, v in x.items()}
    return x.to(device)


def _call(model: nn.Module, inputs: Any) -> Any:
    return model(**inputs) if isinstance(inputs, dict) else model(inputs)


class Trainer:
    """The iteration the estimator traces, on ``device``."""

    def __init__(self, name: str, batch_size: int, lr: float, device: torch.device) -> None:
        model, (inputs, targets), self.optimizer, self.loss_fn = build(name, batch_size, lr)
        self.model = model.to(device).train()
        # the optimizer was built on the CPU parameters; .to() moves them in place, so it holds the same ones
        self.inputs, self.targets = _to(inputs, device), targets.to(device)
        self.bf16 = MODELS[name].precision == "bf16"
        self.device = device

    def step(self) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.loss_fn(_call(self.model, self.inputs), self.targets)
        loss.backward()
        self.optimizer.step()
        return loss.detach()  # no .item(): a sync per step would slow the job

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def hold_emulated_memory() -> Callable[[], None]:
    """CPU dry runs only: hold ``FIRST_RUN_EMULATED_MIB`` on the emulated GPUs the daemon gave this
    job, as a CUDA job holds real memory, so the daemon measures a peak and keeps it as history.
    Imports collocate only then; returns the release (a no-op without the variable)."""
    mib = os.environ.get("FIRST_RUN_EMULATED_MIB")
    if not mib:
        return lambda: None
    from collocate.gpus.emulated import state_dir_from_env
    from collocate.gpus.emulated_state import StateStore, process_start_time
    from collocate.node.emulate_job import oom_message, resolve_devices

    store = StateStore.open_existing(state_dir_from_env())
    pid = os.getpid()
    for ordinal, dev in enumerate(resolve_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), store.devices())):
        refusal = store.claim(dev.uuid, pid, process_start_time(pid) or 0.0, float(mib), 0.5, 0.2)
        if refusal is not None:
            store.release(pid)
            raise SystemExit(oom_message(refusal, ordinal, pid))
    return lambda: store.release(pid)


REPORT_EVERY = 5  # steps between two reports of the step counter


def step_reporter() -> Callable[[int], None]:
    """Under the daemon, log the step every ``REPORT_EVERY`` steps as a training loop logs its
    loss (``collocate.monitor.log_metric``): the daemon measures the job's slowdown from its pace.
    Elsewhere nothing (and collocate is not imported)."""
    if not os.environ.get("COLLOCATE_METRICS_FILE"):
        return lambda n: None
    from collocate.monitor import log_metric

    return lambda n: None if n % REPORT_EVERY else log_metric("step", n, step=n)


def train(name: str, batch_size: int, steps: int, lr: float) -> dict[str, Any]:
    dev = device()
    t0 = time.monotonic()
    release = hold_emulated_memory()
    report = step_reporter()
    try:
        trainer = Trainer(name, batch_size, lr, dev)
        t_start = time.monotonic()
        loss = torch.zeros(())
        for n in range(1, steps + 1):
            loss = trainer.step()
            report(n)
        trainer.sync()
    finally:
        release()
    if not torch.isfinite(loss):  # synthetic data should never give one
        raise SystemExit(f"{name}: the loss is not finite after {steps} steps")
    t_end = time.monotonic()
    peak = torch.cuda.max_memory_reserved(dev) / 2**20 if dev.type == "cuda" else None
    return {"model": name, "batch_size": batch_size, "steps": steps, "device": dev.type,
            "setup_s": round(t_start - t0, 2), "train_s": round(t_end - t_start, 2), "torch_reserved_peak_mib": peak}


def calibrate(pairs: list[tuple[str, int]], warmup: int, timed: int) -> list[dict[str, Any]]:
    """Seconds per step of each model alone, one after the other in this process."""
    dev = device()
    rows = []
    for name, batch in pairs:
        trainer = Trainer(name, batch, 1e-3, dev)
        for _ in range(warmup):
            trainer.step()
        trainer.sync()
        t = time.monotonic()
        for _ in range(timed):
            trainer.step()
        trainer.sync()
        step_s = (time.monotonic() - t) / timed
        peak = torch.cuda.max_memory_reserved(dev) / 2**20 if dev.type == "cuda" else None
        rows.append({"model": name, "batch_size": batch, "step_s": step_s, "torch_reserved_peak_mib": peak})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        del trainer
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", help="also write the result here (an output path: a resubmission "
                        "with another is the same job to collocate's history)")
    parser.add_argument("--calibrate", help="name:batch,...: time each model alone, print JSON")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--timed", type=int, default=10)
    args = parser.parse_args(argv)
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True  # what most training recipes set
        torch.backends.cudnn.allow_tf32 = True
    if args.calibrate:
        pairs = [(p.split(":")[0], int(p.split(":")[1])) for p in args.calibrate.split(",")]
        print(json.dumps(calibrate(pairs, args.warmup, args.timed)))
        return 0
    if not args.model:
        parser.error("--model or --calibrate is required")
    result = json.dumps(train(args.model, args.batch_size, args.steps, args.lr))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(result + "\n")
    print(result, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
