"""The shared judging helpers of the week16 graders (constants, checks, probes): its test files and
conftest.py (which keeps the fixtures) import them by this week-unique name."""
import math

from infracourse.grader import LabCheckFailed, LearnerRaised
from infracourse.kit.paged_reference import state_violations


class JudgeAllocator:
    """The handout's allocator, as the judge keeps it: its own block ids (not the learner's), so only what is
    observable is compared: cached tokens, MemoryError or not, the number of free blocks, table lengths."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool):
        self.n, self.bs, self.caching = num_blocks, block_size, prefix_caching
        self.refs = [0] * num_blocks
        self.name = [None] * num_blocks      # block -> hash it is registered under, or None
        self.released = [0.0] * num_blocks   # when the block's reference count last fell to 0
        self.owner = {}                      # hash -> block
        self.tables, self.tokens, self.clock = {}, {}, 0

    def hashes(self, tokens):
        out, prev = [], None
        for i in range(len(tokens) // self.bs):
            prev = hash((prev, tuple(tokens[i * self.bs:(i + 1) * self.bs])))
            out.append(prev)
        return out

    def free_blocks(self):
        return [b for b in range(self.n) if self.refs[b] == 0]

    def _new(self):
        free = self.free_blocks()
        plain = [b for b in free if self.name[b] is None]
        b = plain[0] if plain else min(free, key=lambda x: self.released[x])  # LRU among the cached ones
        if self.name[b] is not None:
            del self.owner[self.name[b]]
            self.name[b] = None
        self.refs[b] = 1
        return b

    def _name(self, b, h):
        if self.caching and h not in self.owner:
            self.owner[h], self.name[b] = b, h

    def allocate(self, seq, tokens):
        """Cached tokens, or None where MemoryError is due."""
        hashes = self.hashes(tokens) if self.caching else []
        hits = []
        for h in hashes:
            if h not in self.owner:
                break
            hits.append(self.owner[h])
        need = math.ceil(len(tokens) / self.bs) - len(hits)
        if need > len(self.free_blocks()) - sum(self.refs[b] == 0 for b in hits):
            return None
        for b in hits:
            self.refs[b] += 1
        table = hits + [self._new() for _ in range(need)]
        for i in range(len(hits), len(hashes)):
            self._name(table[i], hashes[i])
        self.tables[seq], self.tokens[seq] = table, list(tokens)
        return len(hits) * self.bs

    def append(self, seq, token):
        """True, or False where MemoryError is due."""
        tokens, table = self.tokens[seq], self.tables[seq]
        if len(tokens) == len(table) * self.bs:
            if not self.free_blocks():
                return False
            table.append(self._new())
        tokens.append(token)
        if len(tokens) % self.bs == 0:
            self._name(table[-1], self.hashes(tokens)[-1])
        return True

    def free(self, seq):
        for b in reversed(self.tables.pop(seq)):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.clock += 1
                self.released[b] = self.clock
        del self.tokens[seq]


def attempt(fn, *args):
    """(True, value) or (False, None) when the learner's code raised MemoryError (no room)."""
    try:
        return True, fn(*args)
    except LearnerRaised as exc:
        if exc.type_name == "MemoryError":
            return False, None
        raise


def checked_state(alloc, judge: JudgeAllocator, what: str) -> dict:
    """The learner's state(), its invariants, and its agreement with the judge's accounting."""
    state = alloc.state()
    problems = state_violations(state, judge.n, shared_allowed=judge.caching)
    if problems:
        raise LabCheckFailed(f"{what}: your allocator's state() breaks the invariants: " + "; ".join(problems))
    tables = state["block_tables"]
    if set(tables) != set(judge.tables):
        raise LabCheckFailed(f"{what}: state()['block_tables'] holds sequences {sorted(tables)[:8]}, the live ones "
                             f"are {sorted(judge.tables)[:8]}: a freed sequence must leave, a new one appear")
    for seq, tokens in judge.tokens.items():
        want = math.ceil(len(tokens) / judge.bs)
        if len(tables[seq]) != want:
            raise LabCheckFailed(f"{what}: sequence {seq} holds {len(tokens)} tokens, so {want} blocks of "
                                 f"{judge.bs}; its block table has {len(tables[seq])}")
    want_free = len(judge.free_blocks())
    if len(state["free"]) != want_free:
        raise LabCheckFailed(f"{what}: state() reports {len(state['free'])} free blocks; {judge.n} blocks minus "
                             f"those the live sequences hold leaves {want_free}. Blocks lost on free (a leak) or "
                             "handed out twice show up here")
    return state


def check_pool_bytes(device_bytes, formula: int, tensors: int, what: str) -> None:
    """The paged K/V pool as the device's allocator counts it against the formula (2 x layers x blocks x
    block_size x KV heads x head_dim x bytes per element). `device_bytes` is None where the pool is not on a
    device (host memory: no device figure); the allocator rounds each of the pool's `tensors` up to 512 bytes."""
    if device_bytes is None:
        raise LabCheckFailed(f"{what}: the KV pool is in host memory; on a GPU it lives on the device, and its bytes "
                             "are the device allocator's (torch.cuda.memory_allocated), not sizes of host tensors")
    if not formula <= device_bytes <= formula + 512 * tensors:
        raise LabCheckFailed(f"{what}: the device's allocator gave the KV pool {device_bytes} bytes; the formula "
                             f"gives {formula}: the figures are not of the same pool")
