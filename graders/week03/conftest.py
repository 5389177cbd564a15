"""Shared fixtures of the week 3 graders: the model, seeded batches of variable-length sequences (sized so
compute dominates on this device), and the factor their length distribution allows."""
from dataclasses import dataclass

import pytest

from infracourse.grader import in_worker
from infracourse.kit import intra_op
from infracourse.kit.gpt import GPTConfig
from infracourse.kit.sequences import random_batches, token_model
from infracourse.kit.threads import intra_op_threads

# Per device: model size, number of batches, sequences per batch, and the length distribution.
SIZES = {
    "cpu": dict(cfg=GPTConfig(vocab_size=256, d_model=128, n_layer=2), batches=6, batch_size=16,
                median=24, max_len=256),
    "cuda": dict(cfg=GPTConfig(vocab_size=4096, d_model=512, n_layer=4), batches=8, batch_size=64,
                 median=96, max_len=1024),
}


@dataclass
class Workload:
    model: object  # the grader's copy, for references
    remote_model: object  # the same model built in the worker, where the learner's code calls it
    batches: list
    padded_tokens: int  # what padding to the longest of each batch computes
    useful_tokens: int  # the real tokens

    @property
    def factor(self) -> float:
        """How much more useful work per second packing allows: computed tokens over useful ones."""
        return self.padded_tokens / self.useful_tokens


@pytest.fixture(scope="session", autouse=True)
def one_intra_op_thread(learner):
    # A tiny model: see infracourse.kit.threads. The worker runs the learner's side, so it gets one thread too.
    learner.build(intra_op.set_intra_op_threads, 1)
    with intra_op_threads(1):
        yield


@pytest.fixture(scope="session")
def workload(learner, device, seed):
    size = SIZES[device]
    cfg = size["cfg"]
    batches = random_batches(size["batches"], size["batch_size"], vocab=cfg.vocab_size, seed=seed, device=device,
                             median=size["median"], max_len=size["max_len"])
    # The model the learner's code runs is built in the worker from the same seed: a judge-side model passed
    # over would be called back here, one round trip per forward pass, inside the learner's timings.
    spec = dict(vocab_size=cfg.vocab_size, d_model=cfg.d_model, n_layer=cfg.n_layer, seed=seed, device=device)
    return Workload(model=token_model(**spec), remote_model=learner.worker.build(
                        in_worker(token_model, **spec)), batches=batches,
                    padded_tokens=sum(len(b) * max(len(s) for s in b) for b in batches),
                    useful_tokens=sum(len(s) for b in batches for s in b))


@pytest.fixture(scope="session")
def schemes(learner):
    return learner.module("schemes")


@pytest.fixture(scope="session")
def experiment(learner):
    return learner.module("experiment")
