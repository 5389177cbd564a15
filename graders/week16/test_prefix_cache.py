"""Prefix caching: full blocks named by a hash chained over every block before them, shared with reference
counts, and evicted least-recently-released first when the free blocks run out. Three directed workloads (the
shared-prefix workload whose cached tokens the report states; equal blocks after different prefixes; LRU
against FIFO) and a seeded random run under memory pressure, every answer compared with the judge's model."""
import random

import pytest

from week16_judging import JudgeAllocator, attempt, checked_state
from test_allocator import random_run

from infracourse.grader import LabCheckFailed

# The shared-prefix workload (fixed, so the report's figures can be compared with this grade's):
# 8 requests, one 100-token system prompt, each with its own 20-token question; 16-token blocks, 64 blocks.
WORKLOAD_BLOCKS, WORKLOAD_BS, SYSTEM, QUESTION, REQUESTS = 64, 16, 100, 20, 8


def run_sequence(paged, judge: JudgeAllocator, ops, what: str):
    """Runs (op, seq, tokens) on both; compares every allocate's cached tokens and the state after each."""
    alloc = paged.BlockAllocator(judge.n, judge.bs, True)
    got_total = 0
    for op, seq, tokens in ops:
        if op == "free":
            alloc.free(seq)
            judge.free(seq)
        else:
            ok, got = attempt(alloc.allocate, seq, tokens)
            want = judge.allocate(seq, tokens)
            if not ok or got != want:
                raise LabCheckFailed(f"{what}: allocate(sequence {seq!r}, {len(tokens)} tokens) "
                                     f"{'raised MemoryError' if not ok else f'returned {got!r} cached tokens'}; "
                                     f"expected {want} cached tokens")
            got_total += got
        checked_state(alloc, judge, f"{what}, after {op} of {seq!r}")
    return alloc, got_total


def shared_prefix_workload(paged, seed, record):
    r = random.Random(seed)
    system = [r.randrange(1000) for _ in range(SYSTEM)]
    ops = [("allocate", f"req{i}", system + [r.randrange(1000) for _ in range(QUESTION)]) for i in range(REQUESTS)]
    judge = JudgeAllocator(WORKLOAD_BLOCKS, WORKLOAD_BS, True)
    what = (f"seed {seed}: {REQUESTS} requests sharing a {SYSTEM}-token system prompt, each with its own "
            f"{QUESTION}-token question, {WORKLOAD_BS}-token blocks")
    alloc, cached = run_sequence(paged, judge, ops, what)
    used = WORKLOAD_BLOCKS - len(alloc.state()["free"])
    record("cached tokens", cached, unit="tokens", model="the shared-prefix workload")
    record("blocks used", used, unit="blocks", model="the shared-prefix workload, all requests live")


def equal_blocks_after_different_prefixes(paged, seed):
    r = random.Random(seed)
    bs = r.choice((4, 8))
    x, y, w = ([r.randrange(1000) for _ in range(bs)] for _ in range(3))
    judge = JudgeAllocator(16, bs, True)
    what = (f"seed {seed}, {bs}-token blocks: sequence A = [block X, block Y], then B = [block Y, block W] (Y's "
            "tokens equal, but in A they follow X and in B nothing), then C = [X, Y, W]")
    alloc, _ = run_sequence(paged, judge, [("allocate", "A", x + y), ("allocate", "B", y + w),
                                           ("allocate", "C", x + y + w)], what)
    tables = alloc.state()["block_tables"]
    if tables["A"][1] == tables["B"][0]:
        raise LabCheckFailed(f"{what}: A and B share block {tables['A'][1]} for Y. A block's K and V depend on every "
                             "token before it, so its hash must chain the previous block's hash with its own tokens")


def eviction_order(paged, seed):
    r = random.Random(seed)
    bs = 4
    prompts = {name: [r.randrange(1000) for _ in range(bs)] for name in "ABCD"}  # one full block each
    ops = [("allocate", n, prompts[n]) for n in "ABCD"] + [("free", n, None) for n in "ABCD"]
    ops += [("allocate", "A again", prompts["A"]), ("free", "A again", None),  # A is now the most recent
            ("allocate", "long", [r.randrange(1000, 2000) for _ in range(6 * bs)]), ("free", "long", None),
            ("allocate", "A last", prompts["A"]), ("allocate", "D last", prompts["D"])]
    judge = JudgeAllocator(8, bs, True)
    what = (f"seed {seed}, 8 blocks of {bs}: A, B, C, D (one block each) allocated and freed in that order, A "
            "allocated and freed again, then a 6-block sequence that must evict two cached blocks (B and C, the "
            "least recently released; not A, the first ever cached), then A and D asked for again")
    run_sequence(paged, judge, ops, what)


def random_operations(paged, seed):
    prefixes = random.Random(seed).sample(range(1000), 2)

    def tokens(r, bs):  # prompts that start with one of two shared prefixes, so blocks are shared and evicted
        start = [prefixes[r.randrange(2)] + i for i in range(r.choice((0, bs, 2 * bs, 3 * bs)))]
        return start + [r.randrange(50) for _ in range(r.randint(1, bs))]
    random_run(paged, seed + 1, prefix_caching=True, ops=100, tokens_from=tokens, blocks=(16, 28), sizes=(3, 4))


@pytest.mark.check("prefix-cache")
def test_prefix_cache(paged, seed, record):
    equal_blocks_after_different_prefixes(paged, seed)
    eviction_order(paged, seed)
    shared_prefix_workload(paged, seed, record)
    random_operations(paged, seed)
