"""Week 3 correctness: padding and packing give every sequence exactly the model's output for it alone.
(Whether packing wastes positions is effective-gain's to judge.)"""
import pytest
import torch

from infracourse.grader import LabCheckFailed, assert_close, require_plain_tensor



def _outputs(scheme, name, model, seqs):
    tokens, unpack = scheme(seqs)
    if name == "pad" and tuple(tokens.shape) != (len(seqs), max(len(s) for s in seqs)):
        raise LabCheckFailed(f"pad's tokens have shape {tuple(tokens.shape)}; padding to the longest of {len(seqs)} "
                             f"sequences gives ({len(seqs)}, {max(len(s) for s in seqs)})")
    outputs = unpack(model(tokens))
    if len(outputs) != len(seqs):
        raise LabCheckFailed(f"{name}: unpack returned {len(outputs)} outputs for {len(seqs)} sequences")
    return outputs


@pytest.mark.check("schemes-correct")
def test_schemes_correct(schemes, workload, device, seed):
    model, vocab = workload.model, workload.model.head.out_features
    gen = torch.Generator().manual_seed(seed)
    edge = {  # awkward batches beside the realistic ones
        "one sequence": [torch.randint(vocab, (37,), generator=gen)],
        "length-1 sequences": [torch.randint(vocab, (n,), generator=gen) for n in (1, 1, 5, 1)],
        "equal lengths": [torch.randint(vocab, (16,), generator=gen) for _ in range(3)],
    }
    cases = {**{k: [s.to(device) for s in v] for k, v in edge.items()},
             **{f"batch {i} (seed {seed})": b for i, b in enumerate(workload.batches[:2])}}
    for name in ("pad", "pack"):
        scheme = getattr(schemes, name)
        for what, seqs in cases.items():
            for i, (seq, out) in enumerate(zip(seqs, _outputs(scheme, name, model, seqs))):
                require_plain_tensor(out, shape=(len(seq), vocab), dtype=torch.float32, device=device,
                                     what=f"{name}, {what}: output of sequence {i}")
                # Position-wise model: a sequence's output must not depend on its batch mates or on padding.
                assert_close(out, model(seq).double(), rtol=1e-4, atol=1e-5, what=f"{name}, {what}, sequence {i}")
