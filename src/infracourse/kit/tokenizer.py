"""A byte-level tokenizer: token id = one UTF-8 byte (0..255), so `GPTConfig()`'s vocab_size 256 fits it.

    tok = ByteTokenizer()
    ids = tok.encode("héllo")        # list[int], one id per byte: [104, 195, 169, 108, 108, 111]
    tok.decode(ids)                  # "héllo"; a cut multi-byte character decodes as U+FFFD
    tok.decode_bytes(ids)            # b"h\xc3\xa9llo"

Nothing is downloaded; no special tokens (generation stops on max_tokens, not on an end-of-text id).
"""
from __future__ import annotations

from typing import Iterable


class ByteTokenizer:
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < 256]
        if bad:
            raise ValueError(f"ByteTokenizer: ids must be bytes 0..255, got {bad[:5]}")
        return bytes(ids)

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")
