"""A checkpoint served in int8 with a learner's quantised Linear, beside the same checkpoint in full precision
(week 18): course code built in the grading worker, so the judge times both models with the same harness on the
same prompts and counts the bytes each one holds.

    model = checkpoint_model(sizes, seed)                 # kit.llama: written to disk, loaded, checked
    qmodel = quantized_llama(model, quant.Int8Linear)     # every Linear of every layer -> Int8Linear(linear)
    held_tensors(qmodel)                                  # every tensor the model keeps alive, found by walking it
    call = LlamaGenerate(qmodel, new_tokens=8)            # call(prompts (B, T)) -> B lists of greedy tokens
    ref = reference_int8_llama(model)                     # the judge's int8 model: q * scale per row, dequantised

The layers' seven projections (q/k/v/o, gate/up/down) are quantised; the embedding table, the norms and the LM
head stay in the checkpoint's dtype, as weight-only int8 serving usually keeps them.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from infracourse.kit.llama import Llama, generate
from infracourse.kit.quant_eval import quantize_per_channel


def layer_linears(model: Llama) -> dict[str, nn.Linear]:
    """name -> every nn.Linear inside the decoder layers (the projections weight-only int8 stores in one byte)."""
    return {f"model.layers.{name}": m for name, m in model.model.layers.named_modules() if isinstance(m, nn.Linear)}


def quantized_llama(model: Llama, int8_linear) -> Llama:
    """A copy of `model` whose layer Linears are `int8_linear(linear)` (the learner's class, given the Linear)."""
    qmodel = copy.deepcopy(model)
    for name in layer_linears(qmodel):
        parent, _, attr = name.removeprefix("model.layers.").rpartition(".")
        owner = qmodel.model.layers.get_submodule(parent)
        setattr(owner, attr, int8_linear(getattr(owner, attr)))
    return qmodel


@torch.no_grad()
def reference_int8_llama(model: Llama) -> Llama:
    """The course's int8 model of `model`: each layer Linear's weight replaced by its per-row int8 dequantisation
    (kit.quant_eval.quantize_per_channel), computed in the model's dtype."""
    ref = copy.deepcopy(model)
    for linear in layer_linears(ref).values():
        q, scale = quantize_per_channel(linear.weight)
        linear.weight.copy_((q.float() * scale[:, None]).to(linear.weight.dtype))
    return ref


def _tensors_in(value, out: list, seen: set) -> None:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, nn.Module):
        if id(value) not in seen:
            seen.add(id(value))
            for module in value.modules():
                seen.add(id(module))
                for attr in vars(module).values():   # _parameters and _buffers are dicts: walked like any other
                    _tensors_in(attr, out, seen)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors_in(item, out, seen)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _tensors_in(item, out, seen)


def held_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every tensor the model keeps alive, one per storage: parameters, buffers, and tensors kept in plain
    attributes (a list, a dict, another module held outside the registry), found by walking the modules' own
    attributes rather than asking state_dict. The judge counts the bytes of what comes back."""
    found: list[torch.Tensor] = []
    _tensors_in(model, found, set())
    unique = {}
    for t in found:
        storage = t.untyped_storage()
        unique.setdefault((str(storage.device), storage.data_ptr()), t)
    return [t.detach() for t in unique.values()]


def held_bytes(tensors) -> dict[str, int]:
    """{"bytes", "device_bytes"}: bytes of the distinct storages behind `tensors`, and of those on a GPU."""
    seen = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[(str(storage.device), storage.data_ptr())] = (storage.nbytes(), storage.device.type == "cuda")
    return {"bytes": sum(n for n, _ in seen.values()), "device_bytes": sum(n for n, gpu in seen.values() if gpu)}


class LlamaGenerate:
    """kit.llama.generate on a fixed model as a timed call of its prompts: (B, T) ids -> B lists of new tokens."""

    def __init__(self, model: Llama, new_tokens: int):
        self.model, self.new_tokens = model, new_tokens

    def __call__(self, prompts: torch.Tensor) -> list[list[int]]:
        return generate(self.model, prompts.to(self.model.device), self.new_tokens).tolist()
