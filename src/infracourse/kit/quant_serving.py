"""A checkpoint served in int8 with a learner's quantised Linear, beside the same checkpoint in full precision
(week 18): course code built in the grading worker, so the judge serves both models on the same load matrix,
stamps every token on its own clock, and counts the bytes each one holds.

    model = checkpoint_model(sizes, seed)                 # kit.llama: written to disk, loaded, checked
    qmodel = quantized_llama(model, quant.Int8Linear)     # every Linear of every layer -> Int8Linear(linear)
    held_tensors(qmodel)                                  # every tensor the model keeps alive, found by walking it
    ref = reference_int8_llama(model)                     # the judge's int8 model: q * scale per row, dequantised
    server = StepServer(qmodel)                           # in the worker: one request at a time, a step per call
    engine = StepEngine(server.prefill, server.decode)    # in the judge: run_load's `send`, every token a call
    run_matrix(cells, "out/", send=engine.send)           # kit.load_matrix, the judge's clock

The layers' seven projections (q/k/v/o, gate/up/down) are quantised; the embedding table, the norms and the LM
head stay in the checkpoint's dtype, as weight-only int8 serving usually keeps them.
"""
from __future__ import annotations

import asyncio
import copy
from typing import AsyncIterator, Callable

import torch
import torch.nn as nn

from infracourse.kit.llama import Llama
from infracourse.kit.llama_serving import OneAtATime
from infracourse.kit.loadgen import RequestSpec
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


class StepServer:
    """A model served one request at a time, one step per call (built in the worker around the model): prefill
    takes a prompt and gives the first greedy token, each decode the next. int() waits for the device, so a call
    returns when its token exists. On CUDA it also keeps, per (prompt length, new tokens), the most the
    allocator held above its level at the request's start (KV cache, activations, any dequantised weight)."""

    def __init__(self, model: Llama):
        self.model, self.cache, self.left, self.base, self.key = model, None, 0, 0, (0, 0)
        self.peaks: dict[tuple[int, int], int] = {}

    @torch.no_grad()
    def prefill(self, prompt_ids: list[int], max_tokens: int) -> int:
        cuda = self.model.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.model.device)  # host counters: no wait for the device
            self.base = torch.cuda.memory_allocated(self.model.device)
        self.cache = self.model.new_cache(1, len(prompt_ids) + max_tokens)
        self.key, self.left = (len(prompt_ids), max_tokens), max_tokens
        return self._next(torch.tensor([prompt_ids], device=self.model.device))

    @torch.no_grad()
    def decode(self, token: int) -> int:
        if self.left < 1:
            raise RuntimeError("decode after the request's last token: prefill the next request first")
        return self._next(torch.tensor([[token]], device=self.model.device))

    def _next(self, ids: torch.Tensor) -> int:
        token = int(self.model(ids, self.cache)[0, -1].argmax())
        self.left -= 1
        if self.left == 0:
            self.cache = None
            if self.model.device.type == "cuda":
                peak = torch.cuda.max_memory_allocated(self.model.device) - self.base
                self.peaks[self.key] = max(self.peaks.get(self.key, 0), peak)
        return token

    def memory_peaks(self) -> list[list[int]]:
        """[prompt length, new tokens, bytes above the request's start] per lengths served (CUDA; else [])."""
        return [[*key, peak] for key, peak in sorted(self.peaks.items())]


class StepEngine(OneAtATime):
    """kit.loadgen.run_load's `send` over a StepServer's prefill and decode (the grading worker's, through the
    judge's proxies, or local ones): one request at a time, first come first served, the others queued, as
    kit.llama_serving.Engine serves. Every token is one call, its chunk stamped on this process's clock when the
    call returns: the figures are this process's, whatever the server's process does with its own clock. The
    text of a record is its tokens, "17 4 ...". Calls run in a thread, so arrivals keep their clock."""

    def __init__(self, prefill: Callable[[list, int], int], decode: Callable[[int], int]):
        self.prefill, self.decode = prefill, decode

    async def stream(self, spec: RequestSpec) -> AsyncIterator[str]:
        async with self._queue():
            token = await asyncio.to_thread(self.prefill, list(spec.prompt_ids), spec.max_tokens)
            yield f"{token} "
            for _ in range(spec.max_tokens - 1):
                token = await asyncio.to_thread(self.decode, token)
                yield f"{token} "
