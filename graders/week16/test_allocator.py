"""The block allocator without prefix caching: a seeded random run of allocate / append / free, the learner's
state() checked after every operation (free + used = total, reference counts equal the tables holding each
block, no block owned twice) and against the judge's own accounting, which also decides when an allocation must
fail for want of blocks (so a state() that hides a leak is caught by behaviour). Everything freed at the end
leaves every count at zero."""
import random

import pytest

from infracourse.grader import LabCheckFailed
from week16_judging import JudgeAllocator, attempt, checked_state

OPS = 120


def random_run(paged, seed: int, *, prefix_caching: bool, ops: int, tokens_from, blocks=(12, 24), sizes=(3, 4, 8)):
    r = random.Random(seed)
    num_blocks, bs = r.randint(*blocks), r.choice(sizes)
    judge = JudgeAllocator(num_blocks, bs, prefix_caching)
    alloc = paged.BlockAllocator(num_blocks, bs, prefix_caching)
    head = f"seed {seed}, {num_blocks} blocks of {bs} tokens, prefix caching {'on' if prefix_caching else 'off'}"
    history, next_id = [], 0
    for step in range(ops):
        live = sorted(judge.tables)
        roll = r.random()
        if not live or roll < 0.4:
            seq, tokens = f"s{next_id}", tokens_from(r, bs)
            next_id += 1
            free, blocks = len(judge.free_blocks()), -(-len(tokens) // bs)
            ok, got = attempt(alloc.allocate, seq, tokens)
            want = judge.allocate(seq, tokens)
            history.append(f"allocate(seq {seq}, {len(tokens)} tokens)")
            if ok != (want is not None):
                raise LabCheckFailed(
                    f"{head}: after {'; '.join(history[-4:])}: " + (
                        f"your allocate raised MemoryError, but {free} blocks were free, enough for its {blocks} "
                        "(less any cached ones it shares): blocks were lost (a leak on free?)"
                        if want is not None else
                        f"your allocate succeeded, but only {free} blocks were free, fewer than it needs: it must "
                        "raise MemoryError and change nothing (or blocks were handed out twice)"))
            if ok and got != want:
                raise LabCheckFailed(f"{head}: after {'; '.join(history[-4:])}: allocate returned {got!r} cached "
                                     f"tokens; the prefix cache holds {want} of them (full blocks whose hash chain "
                                     "matches from the first block on)")
        elif roll < 0.75:
            seq = r.choice(live)
            for _ in range(r.randint(1, bs + 1)):
                token = r.randrange(50)
                ok, _ = attempt(alloc.append, seq, token)
                want = judge.append(seq, token)
                history.append(f"append(seq {seq})")
                if ok != want:
                    raise LabCheckFailed(
                        f"{head}: after {'; '.join(history[-4:])}: your append "
                        + ("raised MemoryError although a block was free or the last block had room" if want else
                           "succeeded although the sequence's last block was full and no block was free"))
                if not ok:
                    break
        else:
            seq = r.choice(live)
            alloc.free(seq)
            judge.free(seq)
            history.append(f"free(seq {seq})")
        checked_state(alloc, judge, f"{head}, operation {step + 1} ({history[-1]})")
    for seq in sorted(judge.tables):
        alloc.free(seq)
        judge.free(seq)
    state = checked_state(alloc, judge, f"{head}, after freeing every sequence")
    if any(state["ref_counts"]) or len(state["free"]) != num_blocks:
        raise LabCheckFailed(f"{head}: with every sequence freed all {num_blocks} blocks must be free with reference "
                             f"count 0; free {len(state['free'])}, counts {state['ref_counts']}")
    return judge


@pytest.mark.check("allocator-invariants")
def test_random_operations_keep_the_invariants(paged, seed):
    random_run(paged, seed, prefix_caching=False, ops=OPS,
               tokens_from=lambda r, bs: [r.randrange(50) for _ in range(r.randint(1, 4 * bs + 1))])
