"""Input generators that the judge and the worker both build, so each side has the same inputs for a call.

A generator is named by a `BuildInWorker` ('infracourse.grading.inputs:random_tensors', ...), built in the
worker from that name and here by `build`; calling it with a call's index gives that call's arguments,
drawn from a generator seeded with (seed, index). Same torch, same device: the same bits on both sides.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from infracourse.grading.protocol import BuildInWorker


def dtype_name(dtype) -> str:
    """'bfloat16' for torch.bfloat16: the name input specs take (`tensors(dtype=...)`) and messages show."""
    return str(dtype).removeprefix("torch.")


# A judged batch's inputs are those of indices salt + 0, salt + 1, ...: the judge draws the salt when it starts its
# clock, far above the indices any other call uses (0.. for the watched pass, 10**6.. for samples and references).
SALTS = (2**40, 2**52)


def salted(salt: int, call: int) -> int:
    """The input index of call `call` of the clocked batch drawn with `salt`."""
    return salt + call


def build(spec: BuildInWorker) -> Callable[[int], tuple]:
    """The judge's own copy of a generator the worker builds from the same spec."""
    module_name, _, name = spec.target.partition(":")
    if not module_name.startswith("infracourse."):
        raise ValueError(f"input generators come from the course package, not {spec.target!r}")
    return getattr(importlib.import_module(module_name), name)(*spec.args, **spec.kwargs)


class random_tensors:  # noqa: N801  (named like the factory it is, for BuildInWorker targets)
    """args(i) = tensors of the given shapes, `kind` 'randn' (normal) or 'rand' (uniform [0, 1)).

    shapes: [[dims...], ...]; dtype: a torch dtype name; device: 'cuda' or 'cpu'."""

    def __init__(self, shapes: list, dtype: str = "float32", device: str = "cuda", seed: int = 0,
                 kind: str = "randn"):
        self.shapes, self.dtype, self.device, self.seed, self.kind = shapes, dtype, device, seed, kind

    def __call__(self, index: int) -> tuple[Any, ...]:
        generator = self._generator(index)  # one stream for the call: each tensor its own values
        return tuple(self._draw(shape, generator) for shape in self.shapes)

    def _generator(self, index: int):
        import torch

        return torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + index)

    def _draw(self, shape, generator, scale: float = 1.0, shift: float = 0.0):
        """One kernel writing the tensor in its own dtype: a judged batch draws its inputs inside the judge's
        clock (grading.perf), which takes their cost off, so the cheaper the draw the less noise it adds."""
        import torch

        out = torch.empty(*shape, device=self.device, dtype=getattr(torch, self.dtype))
        if self.kind == "randn":
            return out.normal_(shift, scale, generator=generator)
        return out.uniform_(shift, shift + scale, generator=generator)


def tensors(shapes: list, *, dtype: str = "float32", device: str = "cuda", seed: int = 0,
            kind: str = "randn") -> BuildInWorker:
    """The spec graders pass to perf.timed: `make_args=tensors([[N], [N]], seed=seed)`."""
    return BuildInWorker("infracourse.grading.inputs:random_tensors", (shapes,),
                        {"dtype": dtype, "device": device, "seed": seed, "kind": kind})


class scaled_tensors(random_tensors):  # noqa: N801
    """random_tensors, tensor k drawn with standard deviation scales[k] around shifts[k] (uniform: over
    [shifts[k], shifts[k] + scales[k])), followed by the plain values of `extra` (an eps, a flag):
    args(i) = (*tensors, *extra)."""

    def __init__(self, shapes: list, scales: list, shifts: list, extra: list = (), **options):
        super().__init__(shapes, **options)
        self.scales, self.shifts, self.extra = scales, shifts, tuple(extra)

    def __call__(self, index: int) -> tuple[Any, ...]:
        generator = self._generator(index)
        drawn = tuple(self._draw(shape, generator, scale, shift)
                      for shape, scale, shift in zip(self.shapes, self.scales, self.shifts))
        return drawn + self.extra


def scaled(shapes: list, *, scales: list | None = None, shifts: list | None = None, extra: list = (),
           dtype: str = "float32", device: str = "cuda", seed: int = 0, kind: str = "randn") -> BuildInWorker:
    """The spec of `scaled_tensors`: e.g. a norm's (x, weight = 1 + 0.5 randn, eps) is
    `scaled([[R, C], [C]], scales=[1, 0.5], shifts=[0, 1], extra=[1e-6])`."""
    scales = list(scales or [1.0] * len(shapes))
    shifts = list(shifts or [0.0] * len(shapes))
    return BuildInWorker("infracourse.grading.inputs:scaled_tensors", (shapes, scales, shifts, list(extra)),
                        {"dtype": dtype, "device": device, "seed": seed, "kind": kind})


class gpt_batches:  # noqa: N801
    """args(i) = ([count kit synthetic (inputs, targets) batches],) for a GPTConfig given by its fields:
    a call that runs several training steps (week 6 times train_step this way)."""

    def __init__(self, cfg: dict, batch: int, count: int, seed: int = 0, device: str = "cuda"):
        self.cfg, self.batch, self.count, self.seed, self.device = cfg, batch, count, seed, device

    def __call__(self, index: int) -> tuple[Any, ...]:
        from infracourse.kit.gpt import GPTConfig  # why: kit.gpt loads torch: only the GPT batch builders need it

        cfg = GPTConfig(**self.cfg)
        first = (self.seed * 1_000_003 + index) * self.count
        return ([self._batch(cfg, first + i) for i in range(self.count)],)

    def _batch(self, cfg, seed: int):
        """kit.gpt.synthetic_batch's layout (targets are the inputs shifted by one), drawn on the device itself:
        a batch drawn on the host and copied over would wait for the judge's hold of the device (grading.perf)."""
        import torch

        generator = torch.Generator(device=self.device).manual_seed(seed)
        tokens = torch.randint(cfg.vocab_size, (self.batch, cfg.seq_len + 1), generator=generator,
                               device=self.device)
        return tokens[:, :-1], tokens[:, 1:]


class token_batches(gpt_batches):  # noqa: N801
    """args(i) = one kit synthetic (inputs, targets) batch, for a call that runs one training step."""

    def __init__(self, cfg: dict, batch: int, seed: int = 0, device: str = "cuda"):
        super().__init__(cfg, batch, 1, seed=seed, device=device)

    def __call__(self, index: int) -> tuple[Any, ...]:
        return super().__call__(index)[0][0]


def tokens(cfg: dict, batch: int, *, device: str = "cuda", seed: int = 0) -> BuildInWorker:
    """The spec of `token_batches` (cfg: a kit.gpt.GPTConfig's fields, as a dict)."""
    return BuildInWorker("infracourse.grading.inputs:token_batches", (dict(cfg), batch),
                        {"seed": seed, "device": device})
