"""kit.llama served in process to the course's load generator, and its memory figures, labelled by where they
were taken (weeks 15-18).

    model = Llama.from_checkpoint("ckpt", device="cuda", dtype=torch.bfloat16)
    engine = Engine(model)
    rows = run_matrix(cells, "results/", send=engine.send)    # kit.load_matrix, every cell through the engine
    engine.memory()   # {"source": "device" | "cpu-stand-in", ...}: what the figures are, said in every figure

The engine is the simplest correct server: one request at a time, first come first served, batch 1, a fresh
contiguous cache per request (prefill once, then one decode step per token). Week 17's continuous batching and
paged pool are what beat it. The model runs in a worker thread, so arrivals keep their clock while it computes.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable

import torch

from infracourse.kit.llama import Llama
from infracourse.kit.loadgen import RequestRecord, RequestSpec, record_stream


class Engine:
    def __init__(self, model: Llama):
        self.model = model
        self.peak_kv_bytes = 0  # the largest cache held at once (one request at a time: the largest cache)
        self._loop = self._lock = None

    def _queue(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()  # each run_load has its own event loop; a lock belongs to one
        if self._loop is not loop:
            self._loop, self._lock = loop, asyncio.Lock()
        return self._lock

    @torch.no_grad()
    def _next(self, ids: torch.Tensor, cache) -> int:
        return int(self.model(ids, cache)[0, -1].argmax())

    async def stream(self, spec: RequestSpec) -> AsyncIterator[str]:
        """The greedy tokens of one request as they are produced, each as its id in text ("17 ")."""
        async with self._queue():
            cache = self.model.new_cache(1, len(spec.prompt_ids) + spec.max_tokens)
            self.peak_kv_bytes = max(self.peak_kv_bytes, cache.nbytes)
            ids = torch.tensor([spec.prompt_ids], device=self.model.device)
            for _ in range(spec.max_tokens):
                token = await asyncio.to_thread(self._next, ids, cache)  # prefill at step 0, then decode
                yield f"{token} "
                ids = torch.tensor([[token]], device=self.model.device)

    def send(self, spec: RequestSpec) -> Awaitable[RequestRecord]:
        """run_load's `send`: the request's record, on the same clock rules as an HTTP request's."""
        return record_stream(spec, self.stream(spec))

    def memory(self) -> dict:
        """Memory figures and what they are. On CUDA: device memory (torch.cuda.max_memory_allocated since the
        last reset, the weights' and the largest KV cache's bytes). On a CPU the process's resident size stands
        in for device memory and says so: `source` is "cpu-stand-in"."""
        weights = sum(t.nbytes for t in {p.data_ptr(): p for p in self.model.parameters()}.values())
        figures = {"weights_bytes": weights, "kv_peak_bytes": self.peak_kv_bytes,
                   "kv_bytes_per_token": self.model.cfg.kv_bytes_per_token(self.model.dtype),
                   "dtype": str(self.model.dtype).removeprefix("torch.")}
        device = self.model.device
        if device.type == "cuda":
            return {"source": "device", "device": torch.cuda.get_device_name(device),
                    "measure": "torch.cuda.max_memory_allocated",
                    "memory_bytes": torch.cuda.max_memory_allocated(device), **figures}
        import psutil

        return {"source": "cpu-stand-in", "device": "cpu", "measure": "process resident size (psutil), standing "
                "in for device memory", "memory_bytes": psutil.Process().memory_info().rss, **figures}
