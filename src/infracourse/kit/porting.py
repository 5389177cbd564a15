"""Porting the course's GPT to another device (the Cambricon track, weeks 22-24): the judge's side, frozen.

No MLU exists where the course is graded, so what the track can check is checked on the CPU against this
module:

    reference_run(config, seed, batch)       the reference: every layer's output of one seeded forward pass
    device_run(config, seed, batch, ...)     a stand-in "device": the same layers computed another way (float64
                                             rounded to the device dtype, or bfloat16), optionally with a
                                             seeded perturbation in chosen layers that only the judge knows
    layer_metrics(reference, device)         the judge's own max abs error and cosine similarity of one layer
    traced_ops(config, batch)                the aten ops (and how many of each) of the model's exported graph
    cpu_kernel_key(op) / resolve_op(name)    where an aten op's CPU kernel is registered in the dispatcher
    measured_bytes(config, batch, dtype)     weights, KV cache and layer outputs counted from real tensors

A "layer" is a leaf module of the model (no children: embeddings, norms, linears), named as in
`model.named_modules()`, in the order the forward pass calls it.
"""
from __future__ import annotations

import collections
import copy
from dataclasses import dataclass

import torch
import torch.nn as nn

from infracourse.kit.gpt import GPT, GPTConfig, synthetic_batch

# the project's model: the course GPT at its CPU size
CONFIG = dict(vocab_size=256, seq_len=64, d_model=64, n_head=4, n_layer=2, mlp_ratio=4, n_kv_head=None)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KINDS = ("noise", "bf16", "fp16")  # a perturbation: seeded noise, or the layer computed in bfloat16 / float16
MODES = ("isolated", "chained")
# the CPU backend's order of precedence when the dispatcher picks a kernel for a CPU tensor
CPU_KEYS = ("CPU", "CompositeExplicitAutogradNonFunctional", "CompositeExplicitAutograd", "CompositeImplicitAutograd")


def model_config(config: dict | None = None) -> GPTConfig:
    """GPTConfig from a plain dict (unknown keys refused: a config is data a learner's file may carry)."""
    merged = dict(CONFIG, **(config or {}))
    unknown = set(merged) - set(CONFIG)
    if unknown:
        raise ValueError(f"unknown model config keys {sorted(unknown)} (known: {sorted(CONFIG)})")
    return GPTConfig(**merged)


def build(config: dict | None, seed: int, batch: int) -> tuple[GPT, torch.Tensor]:
    """The seeded model (eval mode) and its seeded input ids (batch, seq_len)."""
    cfg = model_config(config)
    model = GPT(cfg, seed=seed).eval()
    idx, _ = synthetic_batch(cfg, batch, seed=seed)
    return model, idx


def leaf_layers(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if name and not any(True for _ in m.children())}


def _traced(model: GPT, idx: torch.Tensor, edit=None):
    """Run the model once; returns ({layer: output} in call order, {layer: inputs}). `edit(name, module,
    inputs, output)` may replace a layer's output (the perturbed backend)."""
    outputs: dict[str, torch.Tensor] = {}
    inputs: dict[str, tuple] = {}
    handles = []
    for name, module in leaf_layers(model).items():
        def hook(mod, args, out, name=name):
            if edit is not None:
                out = edit(name, mod, args, out)
            inputs[name] = tuple(a.detach() for a in args)
            outputs[name] = out.detach()
            return out
        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(idx)
    finally:
        for h in handles:
            h.remove()
    return outputs, inputs


def reference_run(config: dict | None, seed: int, batch: int) -> dict[str, torch.Tensor]:
    """Every layer's output (float32) of one forward pass of the seeded model on its seeded batch."""
    model, idx = build(config, seed, batch)
    return layer_outputs(model, idx)


def layer_outputs(model: GPT, idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every leaf layer's output of one forward pass of `model` (on any device) on `idx`, in call order."""
    return _traced(model, idx)[0]


@dataclass(frozen=True)
class Perturbation:
    """What the judge breaks in a device run: `layers` computed wrongly, the same way each.

    noise: output + scale * rms(output) * N(0, 1) (a generator seeded with `seed`);
    bf16 / fp16: the layer computed in that dtype (weights and inputs rounded), its output cast back."""

    layers: tuple[str, ...]
    kind: str = "noise"
    scale: float = 1e-2
    seed: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"perturbation kind {self.kind!r}: one of {KINDS}")

    def apply(self, name: str, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
        if name not in self.layers:
            return out
        if self.kind == "noise":
            gen = torch.Generator().manual_seed(self.seed * 1009 + self.layers.index(name))
            rms = out.double().pow(2).mean().sqrt().item()
            return out + (self.scale * rms * torch.randn(out.shape, generator=gen, dtype=torch.float64)).to(out.dtype)
        return _compute_in(module, args, DTYPES["bfloat16" if self.kind == "bf16" else "float16"]).to(out.dtype)


def _compute_in(module: nn.Module, args: tuple, dtype: torch.dtype) -> torch.Tensor:
    """The layer computed in `dtype`: a copy of its weights and its floating-point inputs cast first."""
    clone = copy.deepcopy(module)
    clone._forward_hooks.clear()  # the copy would carry the judge's hooks (and call the perturbation again)
    clone = clone.to(dtype)
    cast = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
    with torch.no_grad():
        return clone(*cast)


def device_run(config: dict | None, seed: int, batch: int, *, dtype: str = "float32", mode: str = "isolated",
               perturb: Perturbation | None = None) -> dict[str, torch.Tensor]:
    """The stand-in device's outputs per layer, in `dtype` (a port that works computes the same model with
    other kernels: here float64 arithmetic rounded to float32, or bfloat16 arithmetic).

    isolated: each layer is fed the reference's inputs to that layer (an error stays in its layer);
    chained: the whole model runs on the device (an error flows into every later layer)."""
    if dtype not in ("float32", "bfloat16") or mode not in MODES:
        raise ValueError(f"device_run: dtype float32 or bfloat16 (got {dtype!r}), mode one of {MODES} (got {mode!r})")
    want = DTYPES[dtype]
    compute = torch.float64 if dtype == "float32" else torch.bfloat16
    model, idx = build(config, seed, batch)
    if mode == "chained":
        device_model = copy.deepcopy(model).to(compute)
        edit = (lambda n, m, a, o: perturb.apply(n, m, a, o)) if perturb else None
        outputs, _ = _traced(device_model, idx, edit)
        return {name: out.to(want) for name, out in outputs.items()}
    _, inputs = _traced(model, idx)
    layers = leaf_layers(model)
    result = {}
    for name, args in inputs.items():
        out = _compute_in(layers[name], args, compute)
        if perturb is not None:
            out = perturb.apply(name, layers[name], tuple(a.to(compute) if a.is_floating_point() else a
                                                          for a in args), out)
        result[name] = out.to(want)
    return result


def layer_metrics(reference: torch.Tensor, device: torch.Tensor) -> dict[str, float]:
    """The judge's own figures for one layer: max |device - reference| and their cosine similarity (float64)."""
    ref, dev = reference.double().flatten(), device.double().flatten()
    diff = (dev - ref).abs().max().item() if ref.numel() else 0.0
    norm = ref.norm() * dev.norm()
    cosine = 1.0 if norm == 0 else float(torch.dot(ref, dev) / norm)
    return {"max_abs": diff, "cosine": cosine}


# ------------------------------------------------------------------ the graph and the dispatcher
def traced_ops(config: dict | None, batch: int, seed: int = 0) -> collections.Counter:
    """aten op overloads of `torch.export.export(model, (ids,))`'s graph (no decompositions), with counts:
    every call_function node whose target is an OpOverload, named like 'aten.linear.default'."""
    model, idx = build(config, seed, batch)
    graph = torch.export.export(model, (idx,)).graph
    return collections.Counter(str(node.target) for node in graph.nodes
                               if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload))


def resolve_op(name: str):
    """'aten.linear.default' -> the OpOverload, or None if torch has no such op or overload."""
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return None
    packet = getattr(torch.ops.aten, parts[1], None)
    try:
        return getattr(packet, parts[2]) if packet is not None else None
    except AttributeError:
        return None


def dispatch_keys() -> set[str]:
    return set(torch._C.DispatchKey.__members__)


def has_kernel(op, key: str) -> bool:
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key))


def cpu_kernel_key(op) -> str | None:
    """The dispatch key whose kernel runs this op for a CPU tensor (a backend kernel before composites)."""
    return next((key for key in CPU_KEYS if has_kernel(op, key)), None)


def python_callable(path: str):
    """'torch.nn.functional.linear' or 'torch.Tensor.view' -> the object, or None if it does not resolve."""
    parts = path.split(".")
    if not parts or parts[0] != "torch":
        return None
    obj = torch
    for part in parts[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if callable(obj) else None


# ------------------------------------------------------------------ memory, counted
def measured_bytes(config: dict | None, batch: int, dtype: str = "float32") -> dict[str, int]:
    """Bytes counted from real tensors of the model in `dtype` at `batch` x seq_len tokens:
    weights (each parameter once: the head shares the embedding's matrix), the KV cache of every layer (the
    k and v that qkv_heads produces), and activations (every layer's output of one forward pass)."""
    model, idx = build(config, 0, batch)
    model = model.to(DTYPES[dtype])
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = 0
    with torch.no_grad():
        x = model.embed(idx)
        for block in model.blocks:
            _, k, v = block.attn.qkv_heads(block.norm1(x))
            kv += k.numel() * k.element_size() + v.numel() * v.element_size()
            x = block(x)
    outputs, _ = _traced(model, idx)
    activations = sum(o.numel() * o.element_size() for o in outputs.values())
    return {"weights": weights, "kv_cache": kv, "activations": activations}

