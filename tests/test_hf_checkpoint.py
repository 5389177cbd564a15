"""kit.hf_checkpoint against the safetensors format itself: files the `safetensors` library writes load, and a
folder that cannot be served as it is (truncated, a wrong shape or dtype, a missing or unexpected tensor) is
refused naming the file and the tensor."""
import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from infracourse.kit.hf_checkpoint import (CheckpointError, LlamaConfig, expected_tensors, load_checkpoint,
                                           make_checkpoint, random_tensors)

CFG = LlamaConfig(layers=2, hidden=64, heads=4, kv_heads=2, vocab=97, intermediate=96, dtype="bfloat16")


def hf_config(**overrides) -> dict:
    """config.json as transformers writes it for a small Llama, spelled out here, not by the kit."""
    raw = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 97, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}
    return {**raw, **overrides}


def hf_tensors(layers=2, C=64, kv_rows=32, F=96, vocab=97, dtype=torch.bfloat16) -> dict:
    """Every tensor of that model under HF's names, shapes written out by hand (kv rows = 2 heads x 16)."""
    g = torch.Generator().manual_seed(1)
    shapes = {"model.embed_tokens.weight": (vocab, C), "model.norm.weight": (C,), "lm_head.weight": (vocab, C)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                       p + "self_attn.q_proj.weight": (C, C), p + "self_attn.k_proj.weight": (kv_rows, C),
                       p + "self_attn.v_proj.weight": (kv_rows, C), p + "self_attn.o_proj.weight": (C, C),
                       p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                       p + "mlp.down_proj.weight": (C, F)})
    return {n: torch.randn(s, generator=g).to(dtype) for n, s in shapes.items()}


def write_folder(folder, tensors, config=None):
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or hf_config()))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_a_file_written_by_the_safetensors_library_loads(tmp_path):
    tensors = hf_tensors()
    cfg, loaded = load_checkpoint(write_folder(tmp_path / "m", tensors))
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.vocab, cfg.intermediate) == (2, 64, 4, 2, 97, 96)
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        assert loaded[name].dtype == torch.bfloat16 and torch.equal(loaded[name], t), name
    _, as_fp32 = load_checkpoint(tmp_path / "m", dtype=torch.float32)
    assert as_fp32["lm_head.weight"].dtype == torch.float32


def test_written_checkpoints_are_sharded_indexed_and_deterministic(tmp_path):
    files = make_checkpoint(tmp_path / "a", CFG, seed=3, shard_mb=0.02)
    shards = [f for f in files if f.suffix == ".safetensors"]
    assert len(shards) > 2 and all(f.name.endswith(f"-of-{len(shards):05d}.safetensors") for f in shards)
    index = json.loads((tmp_path / "a" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(expected_tensors(CFG))
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in random_tensors(CFG, seed=3).values())
    cfg, loaded = load_checkpoint(tmp_path / "a")
    assert cfg == CFG
    for name, t in random_tensors(CFG, seed=3).items():
        assert torch.equal(loaded[name], t), name
    make_checkpoint(tmp_path / "b", CFG, seed=3)  # one file: the same tensors, byte for byte
    assert (tmp_path / "b" / "model.safetensors").exists()
    _, again = load_checkpoint(tmp_path / "b")
    assert all(torch.equal(again[n], loaded[n]) for n in loaded)
    other = random_tensors(CFG, seed=4)
    assert not torch.equal(other["model.embed_tokens.weight"], loaded["model.embed_tokens.weight"])


def _first_tensor_cut(path, cut):
    """The tensor, in data order, whose bytes a cut of `cut` bytes from the file's end reaches first."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    data_left = path.stat().st_size - 8 - n - cut
    return min((k for k in header if header[k]["data_offsets"][1] > data_left),
               key=lambda k: header[k]["data_offsets"][1])


@pytest.mark.parametrize("cut", [1, 4096])
def test_a_truncated_file_is_refused_naming_the_file_and_the_tensor(tmp_path, cut):
    folder = write_folder(tmp_path / "m", hf_tensors())
    path = folder / "model.safetensors"
    first = _first_tensor_cut(path, cut)
    path.write_bytes(path.read_bytes()[:-cut])
    with pytest.raises(CheckpointError, match="truncated") as e:
        load_checkpoint(folder)
    assert str(e.value).startswith("model.safetensors: tensor " + first + " ends at byte")


def test_a_file_cut_inside_its_header_is_refused(tmp_path):
    folder = write_folder(tmp_path / "m", hf_tensors())
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*truncated"):
        load_checkpoint(folder)


def test_shape_dtype_missing_and_unexpected_tensors_are_refused_by_name(tmp_path):
    k = "model.layers.1.self_attn.k_proj.weight"
    # a K projection with one row per QUERY head: the file of a config that says 4 KV heads, read as 2
    wrong_shape = {**hf_tensors(), k: torch.zeros(64, 64, dtype=torch.bfloat16)}
    with pytest.raises(CheckpointError, match=rf"{k} has shape \(64, 64\).*needs \(32, 64\)"):
        load_checkpoint(write_folder(tmp_path / "shape", wrong_shape))

    wrong_dtype = {**hf_tensors(), k: torch.zeros(32, 64, dtype=torch.float16)}
    with pytest.raises(CheckpointError, match=rf"{k} is F16 but config.json says torch_dtype bfloat16"):
        load_checkpoint(write_folder(tmp_path / "dtype", wrong_dtype))

    missing = hf_tensors()
    del missing["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight is missing"):
        load_checkpoint(write_folder(tmp_path / "missing", missing))

    extra = {**hf_tensors(), "model.layers.2.mlp.up_proj.weight": torch.zeros(96, 64, dtype=torch.bfloat16)}
    with pytest.raises(CheckpointError, match=r"model\.safetensors: unexpected tensor model\.layers\.2\.mlp"):
        load_checkpoint(write_folder(tmp_path / "extra", extra))

    no_head = hf_tensors()
    del no_head["lm_head.weight"]  # legal only when the embeddings are tied
    with pytest.raises(CheckpointError, match=r"lm_head\.weight is missing"):
        load_checkpoint(write_folder(tmp_path / "untied", no_head))
    cfg, tied = load_checkpoint(write_folder(tmp_path / "tied", no_head, hf_config(tie_word_embeddings=True)))
    assert cfg.tie_embeddings and "lm_head.weight" not in tied
    # a tied checkpoint that stores the head anyway loads: the head is the embedding table, as HF ties it
    _, tied = load_checkpoint(write_folder(tmp_path / "both", hf_tensors(), hf_config(tie_word_embeddings=True)))
    assert "lm_head.weight" not in tied


def test_a_sharded_folder_whose_index_names_a_lost_shard_is_refused(tmp_path):
    make_checkpoint(tmp_path, CFG, shard_mb=0.02)
    lost = sorted(tmp_path.glob("model-*.safetensors"))[1]
    lost.unlink()
    with pytest.raises(CheckpointError, match=rf"names {lost.name}, which is not in"):
        load_checkpoint(tmp_path)
    (tmp_path / "model.safetensors.index.json").unlink()
    with pytest.raises(CheckpointError, match="several shards need their index"):
        load_checkpoint(tmp_path)


def test_configs_the_kit_cannot_serve_are_refused_with_the_reason(tmp_path):
    for overrides, reason in [({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
                              ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
                              ({"hidden_act": "gelu"}, "SwiGLU"),
                              ({"use_sliding_window": True}, "sliding-window"),
                              ({"mlp_bias": True}, "mlp_bias"),
                              ({"torch_dtype": "float64"}, "torch_dtype 'float64'")]:
        folder = write_folder(tmp_path / reason.split()[0].strip("'"), hf_tensors(), hf_config(**overrides))
        with pytest.raises(CheckpointError, match=reason):
            load_checkpoint(folder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path / "empty")


def test_qwen2_layout_has_qkv_biases_and_its_own_head_dim(tmp_path):
    cfg = LlamaConfig.from_hf(hf_config(model_type="qwen2", head_dim=32))
    shapes = expected_tensors(cfg)
    assert shapes["model.layers.0.self_attn.q_proj.bias"] == (4 * 32,)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (2 * 32, 64)
    assert "model.layers.0.self_attn.o_proj.bias" not in shapes
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (64, 128)


def test_model_make_writes_what_the_loader_reads_and_refuses_bad_arguments(tmp_path):
    from typer.testing import CliRunner

    from infracourse.cli import app

    args = ["model", "make", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "1", "--vocab", "97",
            "--dtype", "bf16", "--seed", "7", "--shard-mb", "0.02", "--tie"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert "KV cache: 128 bytes per token in bf16 (2 x 2 layers x 1 KV heads x 16 x 2 bytes)" in result.output
    cfg, tensors = load_checkpoint(tmp_path / "m")
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.vocab, cfg.dtype) == (2, 64, 4, 1, 97, "bfloat16")
    assert cfg.tie_embeddings and "lm_head.weight" not in tensors
    assert all(torch.equal(tensors[n], t) for n, t in random_tensors(cfg, seed=7).items())
    again = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "m")])
    assert again.exit_code == 2 and "already holds a checkpoint" in again.output
    bad = CliRunner().invoke(app, ["model", "make", "--heads", "8", "--kv-heads", "3", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "not a multiple of num_key_value_heads 3" in bad.output


def test_a_header_that_is_not_a_tensor_table_is_refused(tmp_path):
    folder = write_folder(tmp_path / "m", hf_tensors())
    header = json.dumps({"model.norm.weight": {"dtype": "BF16"}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(CheckpointError, match=r"tensor model\.norm\.weight has no dtype, shape and data_offsets"):
        load_checkpoint(folder)
