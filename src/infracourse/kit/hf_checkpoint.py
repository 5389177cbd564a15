"""Checkpoints in the Hugging Face layout: `config.json` + `*.safetensors`, a Llama-style decoder (weeks 15-18).

The course ships no weights and downloads nothing: `make_checkpoint` writes random weights of any size in the
layout a real model on disk has, and `load_checkpoint` reads either (the course's, or e.g. a 0.5B Llama or
Qwen2 a learner already has). Loading is checked, never trusted:

    cfg = LlamaConfig(layers=4, hidden=512, heads=8, kv_heads=2, vocab=1024)
    make_checkpoint("ckpt", cfg, seed=0, dtype=torch.bfloat16, shard_mb=8)   # several shards + index.json
    cfg, tensors = load_checkpoint("ckpt")           # {HF tensor name: tensor}, every one checked

Layout of a folder (as `transformers` writes it):
  config.json                       LlamaForCausalLM's fields: hidden_size, intermediate_size, num_hidden_layers,
                                    num_attention_heads, num_key_value_heads, head_dim, vocab_size, rms_norm_eps,
                                    rope_theta, max_position_embeddings, tie_word_embeddings, torch_dtype
  model.safetensors                 one file, or model-00001-of-0000N.safetensors ... with
  model.safetensors.index.json      {"metadata": {"total_size"}, "weight_map": {tensor name: shard file}}
A .safetensors file: 8 bytes little-endian header length N, N bytes of JSON {name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {...}}, then the data, offsets relative to the data's start.

Tensor names (HF's): model.embed_tokens.weight (vocab, hidden); per layer N model.layers.N.input_layernorm.weight,
.self_attn.{q,k,v,o}_proj.weight (q: heads*head_dim x hidden; k, v: kv_heads*head_dim x hidden; o: hidden x
heads*head_dim), .post_attention_layernorm.weight, .mlp.{gate,up}_proj.weight (intermediate x hidden),
.mlp.down_proj.weight (hidden x intermediate); model.norm.weight; lm_head.weight unless the embeddings are tied.
Qwen2 adds q/k/v biases (model_type "qwen2"); Llama's `attention_bias` adds q/k/v/o biases. A tied checkpoint
that stores lm_head.weight anyway serves the embedding table as its head, as HF does. Refused with the reason:
rope_scaling other than Llama 3.x's ("llama3"), sliding-window attention, MLP biases, an activation other than SiLU.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
# safetensors dtype codes <-> torch dtypes (the ones a decoder's weights come in)
ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I8": torch.int8,
             "U8": torch.uint8, "I32": torch.int32, "I64": torch.int64}
TORCH_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ARG = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# buffers some older checkpoints saved beside the weights: recomputed from the config, never read
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be served as it is: the message names the file, the tensor and the fix."""


@dataclass(frozen=True)
class LlamaConfig:
    """The decoder's shape. Field names are the course's; `to_hf`/`from_hf` speak config.json's."""
    layers: int = 4
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 2              # num_key_value_heads: each K/V head is shared by heads // kv_heads queries
    vocab: int = 1024
    intermediate: int | None = None  # SwiGLU width; None: 8/3 hidden rounded up to 64, as Llama sizes it
    head_dim: int | None = None    # None: hidden // heads
    max_positions: int = 2048
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    # Llama 3.x's long-context RoPE: (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
    rope_llama3: tuple[float, float, float, int] | None = None
    tie_embeddings: bool = False
    qkv_bias: bool = False         # Qwen2
    o_bias: bool = False           # Llama's attention_bias also biases o_proj
    dtype: str = "float32"         # torch_dtype: the dtype the tensors are stored in
    model_type: str = "llama"

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "kv_heads", "vocab", "max_positions"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) > 0):
                raise CheckpointError(f"config: {name} must be a positive integer, got {getattr(self, name)!r}")
        if self.heads % self.kv_heads:
            raise CheckpointError(f"config: num_attention_heads {self.heads} is not a multiple of "
                                  f"num_key_value_heads {self.kv_heads}: each KV head serves a whole group")
        if self.head_dim is None and self.hidden % self.heads:
            raise CheckpointError(f"config: hidden_size {self.hidden} does not split into {self.heads} heads; "
                                  "give head_dim")
        # the defaults resolved once, so that equal models have equal configs
        object.__setattr__(self, "head_dim", self.head_dim or self.hidden // self.heads)
        object.__setattr__(self, "intermediate", self.intermediate or 64 * math.ceil(8 * self.hidden / 3 / 64))
        if self.head_dim % 2:
            raise CheckpointError(f"config: head_dim {self.head_dim} must be even (RoPE rotates pairs)")
        if self.dtype not in TORCH_NAMES:
            raise CheckpointError(f"config: torch_dtype {self.dtype!r} is not one of {sorted(TORCH_NAMES)}")

    # kit.gpt's names for the same sizes: code written against GPTConfig (a week-15 cache) reads these
    n_layer = property(lambda self: self.layers)
    n_head = property(lambda self: self.heads)
    d_model = property(lambda self: self.hidden)
    vocab_size = property(lambda self: self.vocab)
    seq_len = property(lambda self: self.max_positions)

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_NAMES[self.dtype]

    def kv_bytes_per_token(self, dtype: torch.dtype | None = None) -> int:
        """2 (K and V) x layers x kv_heads x head_dim x bytes per element: what one token costs in the cache."""
        size = torch.empty((), dtype=dtype or self.torch_dtype).element_size()
        return 2 * self.layers * self.kv_heads * self.head_dim * size

    def to_hf(self) -> dict:
        return {"architectures": ["Qwen2ForCausalLM" if self.model_type == "qwen2" else "LlamaForCausalLM"],
                "model_type": self.model_type, "hidden_size": self.hidden, "intermediate_size": self.intermediate,
                "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim, "vocab_size": self.vocab,
                "max_position_embeddings": self.max_positions, "rms_norm_eps": self.rms_eps,
                "rope_theta": self.rope_theta, "rope_scaling": self._hf_rope_scaling(), "tie_word_embeddings": self.tie_embeddings,
                "attention_bias": self.o_bias, "hidden_act": "silu", "torch_dtype": self.dtype}

    def _hf_rope_scaling(self) -> dict | None:
        if self.rope_llama3 is None:
            return None
        factor, low, high, original = self.rope_llama3
        return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                "original_max_position_embeddings": original}

    @classmethod
    def from_hf(cls, raw: dict, where: str = CONFIG) -> "LlamaConfig":
        if not isinstance(raw, dict):
            raise CheckpointError(f"{where}: expected a JSON object")
        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
                   if k not in raw]
        if missing:
            raise CheckpointError(f"{where}: missing {', '.join(missing)} (a Llama-style config.json has them)")
        scaling = raw.get("rope_scaling") or {}
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        if scaling and (scaling.get("rope_type", scaling.get("type")) != "llama3" or not all(k in scaling
                                                                                             for k in keys)):
            raise CheckpointError(f"{where}: rope_scaling {scaling!r} is not supported: the kit's RoPE is the plain "
                                  "one or Llama 3.x's (rope_type llama3 with " + ", ".join(keys) + ")")
        if raw.get("use_sliding_window"):
            raise CheckpointError(f"{where}: use_sliding_window is true: the kit's attention sees every earlier "
                                  "token; use a model without sliding-window attention")
        if raw.get("mlp_bias"):
            raise CheckpointError(f"{where}: mlp_bias is true: the kit's SwiGLU has no biases")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"{where}: hidden_act {act!r}: the kit's MLP is SwiGLU (silu)")
        model_type = raw.get("model_type", "llama")
        bias = bool(raw.get("attention_bias", False))
        return cls(layers=raw["num_hidden_layers"], hidden=raw["hidden_size"], heads=raw["num_attention_heads"],
                   kv_heads=raw.get("num_key_value_heads") or raw["num_attention_heads"], vocab=raw["vocab_size"],
                   intermediate=raw.get("intermediate_size"), head_dim=raw.get("head_dim"),
                   max_positions=raw.get("max_position_embeddings", 2048), rms_eps=raw.get("rms_norm_eps", 1e-5),
                   rope_theta=raw.get("rope_theta", 10000.0),
                   rope_llama3=tuple(scaling[k] for k in keys) if scaling else None, tie_embeddings=bool(raw.get("tie_word_embeddings")),
                   qkv_bias=bias or model_type == "qwen2", o_bias=bias,
                   dtype=raw.get("torch_dtype") or raw.get("dtype") or "float32", model_type=model_type)


def expected_tensors(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the checkpoint must hold, HF's name -> shape, in the model's reading order."""
    C, hd, F = cfg.hidden, cfg.head_dim, cfg.intermediate
    q, kv = cfg.heads * hd, cfg.kv_heads * hd
    shapes = {"model.embed_tokens.weight": (cfg.vocab, C)}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (C,)
        for proj, rows in (("q", q), ("k", kv), ("v", kv)):
            shapes[f"{p}self_attn.{proj}_proj.weight"] = (rows, C)
            if cfg.qkv_bias:
                shapes[f"{p}self_attn.{proj}_proj.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (C, q)
        if cfg.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (C,)
        shapes[p + "post_attention_layernorm.weight"] = (C,)
        shapes[p + "mlp.gate_proj.weight"] = (F, C)
        shapes[p + "mlp.up_proj.weight"] = (F, C)
        shapes[p + "mlp.down_proj.weight"] = (C, F)
    shapes["model.norm.weight"] = (C,)
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab, C)
    return shapes


def random_tensors(cfg: LlamaConfig, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights for every expected tensor, from a private generator (same seed, same bytes): norms 1,
    biases 0, matrices N(0, 0.02), output projections scaled by 1/sqrt(2 * layers) as GPT-2 does."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in expected_tensors(cfg).items():
        if name.endswith("norm.weight"):
            t = torch.ones(shape)
        elif name.endswith(".bias"):
            t = torch.zeros(shape)
        else:
            std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            t = torch.randn(shape, generator=gen) * std
        out[name] = t.to(cfg.torch_dtype).contiguous()
    return out


def make_checkpoint(out, cfg: LlamaConfig, *, seed: int = 0, shard_mb: float | None = None) -> list[Path]:
    """Write config.json and random weights (in cfg.dtype) to folder `out`; with shard_mb, shards of at most
    about that many MiB and model.safetensors.index.json. Returns the files written."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stale = sorted(p.name for p in (out / CONFIG, out / INDEX, *out.glob("*.safetensors")) if p.exists())
    if stale:  # a leftover index or shard would be read with the new files
        raise CheckpointError(f"{out} already holds a checkpoint ({', '.join(stale)}): choose another folder or "
                              "delete that one first")
    tensors = random_tensors(cfg, seed=seed)
    shards: list[dict[str, torch.Tensor]] = [{}]
    limit = math.inf if shard_mb is None else shard_mb * 2**20
    used = 0
    for name, t in tensors.items():
        if shards[-1] and used + t.nbytes > limit:
            shards.append({})
            used = 0
        shards[-1][name] = t
        used += t.nbytes
    (out / CONFIG).write_text(json.dumps(cfg.to_hf(), indent=2) + "\n", encoding="utf-8")
    written = [out / CONFIG]
    if len(shards) == 1:
        save_file(shards[0], str(out / SINGLE), metadata={"format": "pt"})
        return written + [out / SINGLE]
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update({t: name for t in shard})
        written.append(out / name)
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return written + [out / INDEX]


def make_and_describe(out, sizes: dict, *, tie: bool = False, dtype: str = "fp32", seed: int = 0,
                      shard_mb: float | None = None) -> str:
    """`infracourse model make`: write the checkpoint of LlamaConfig(**sizes) and say what it holds."""
    if dtype not in DTYPE_ARG:
        raise CheckpointError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPE_ARG)}")
    cfg = LlamaConfig(**sizes, tie_embeddings=tie, dtype=str(DTYPE_ARG[dtype]).removeprefix("torch."))
    files = make_checkpoint(out, cfg, seed=seed, shard_mb=shard_mb)
    params = sum(math.prod(shape) for shape in expected_tensors(cfg).values())
    size = cfg.torch_dtype.itemsize
    shards = sum(f.suffix == ".safetensors" for f in files)
    return (f"Wrote {out}: {shards} safetensors file(s), {params / 1e6:.2f} M parameters "
            f"({params * size / 2**20:.1f} MiB in {dtype}); {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} "
            f"heads, {cfg.kv_heads} KV heads of {cfg.head_dim}, SwiGLU {cfg.intermediate}, vocab {cfg.vocab}. "
            f"KV cache: {cfg.kv_bytes_per_token()} bytes per token in {dtype} "
            f"(2 x {cfg.layers} layers x {cfg.kv_heads} KV heads x {cfg.head_dim} x {size} bytes).")


# Reading ------------------------------------------------------------------------------------------------------
def read_header(path: Path) -> dict[str, dict]:
    """The tensors a .safetensors file declares, {name: {dtype, shape, data_offsets}}, each checked against the
    file's real size: a file cut short is refused naming the first tensor whose bytes are missing."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path.name}: {size} bytes, shorter than a safetensors header: the file is "
                                  "truncated or not safetensors; copy or write it again")
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            raise CheckpointError(f"{path.name}: the header says {n} bytes of JSON but the file has {size - 8}: "
                                  "the file is truncated; copy or write it again")
        try:
            header = json.loads(f.read(n))
        except ValueError as exc:
            raise CheckpointError(f"{path.name}: the header is not JSON ({exc}): not a safetensors file") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path.name}: the header is not a JSON object: not a safetensors file")
    header.pop("__metadata__", None)
    for name, info in header.items():
        if not (isinstance(info, dict) and isinstance(info.get("shape"), list) and isinstance(
                info.get("data_offsets"), list) and len(info["data_offsets"]) == 2):
            raise CheckpointError(f"{path.name}: tensor {name} has no dtype, shape and data_offsets in the header: "
                                  "the file is corrupt")
    data_size = size - 8 - n
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if info.get("dtype") not in ST_DTYPES:
            raise CheckpointError(f"{path.name}: tensor {name} has dtype {info.get('dtype')!r}, not one the kit "
                                  f"reads ({', '.join(ST_DTYPES)})")
        begin, end = info["data_offsets"]
        want = math.prod(info["shape"]) * ST_DTYPES[info["dtype"]].itemsize
        if end - begin != want:
            raise CheckpointError(f"{path.name}: tensor {name} spans {end - begin} bytes but its shape "
                                  f"{info['shape']} in {info['dtype']} needs {want}: the file is corrupt")
        if end > data_size:
            raise CheckpointError(f"{path.name}: tensor {name} ends at byte {end} of the data but the file holds "
                                  f"only {data_size}: the file is truncated; copy or write it again")
    return header


def _shard_files(folder: Path) -> dict[str, Path]:
    """tensor name -> the file that should hold it, from the index when there is one."""
    if (folder / INDEX).exists():
        try:
            weight_map = json.loads((folder / INDEX).read_text(encoding="utf-8"))["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{INDEX}: not a JSON object with a weight_map ({exc})") from None
        return {name: folder / file for name, file in weight_map.items()}
    if (folder / SINGLE).exists():
        return {name: folder / SINGLE for name in read_header(folder / SINGLE)}
    found = sorted(p.name for p in folder.glob("*.safetensors"))
    raise CheckpointError(f"{folder}: neither {SINGLE} nor {INDEX}" + (
        f" (found {', '.join(found)}: several shards need their index)" if found else
        ": not a checkpoint folder; write one with `infracourse model make`"))


def load_checkpoint(folder, *, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """(config, {HF name: tensor}) of a checkpoint folder, every tensor checked against the config: a missing
    or unexpected tensor, a shape or dtype other than the config's, a truncated file each raise CheckpointError
    naming the file and the tensor. `dtype` casts after the check (serve a bf16 checkpoint in fp32)."""
    from safetensors import safe_open

    folder = Path(folder)
    if not (folder / CONFIG).exists():
        raise CheckpointError(f"{folder}: no {CONFIG}: not a checkpoint folder; write one with "
                              "`infracourse model make --out DIR`")
    try:
        raw = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except ValueError as exc:
        raise CheckpointError(f"{folder / CONFIG}: not JSON ({exc})") from None
    cfg = LlamaConfig.from_hf(raw, str(folder / CONFIG))
    expected = expected_tensors(cfg)
    files = {n: f for n, f in _shard_files(folder).items() if not n.endswith(IGNORED_SUFFIXES)}
    if cfg.tie_embeddings:  # some tied checkpoints store the head too; tied, it is the embedding table (as in HF)
        files.pop("lm_head.weight", None)
    missing = [n for n in expected if n not in files]
    if missing:
        raise CheckpointError(f"{folder.name}: tensor {missing[0]} is missing" + (
            f" (and {len(missing) - 1} more)" if len(missing) > 1 else "") +
            f": the config ({cfg.layers} layers, tie_word_embeddings {cfg.tie_embeddings}) needs it")
    unexpected = [n for n in files if n not in expected]
    if unexpected:
        raise CheckpointError(f"{files[unexpected[0]].name}: unexpected tensor {unexpected[0]}: the config "
                              f"({cfg.model_type}, {cfg.layers} layers, tie_word_embeddings {cfg.tie_embeddings}) "
                              "has no place for it; check config.json matches the weights")
    tensors = {}
    for path in sorted(set(files.values())):
        if not path.exists():
            raise CheckpointError(f"{INDEX} names {path.name}, which is not in {folder}")
        header = read_header(path)
        wanted = [n for n, f in files.items() if f == path]
        for name in wanted:
            if name not in header:
                raise CheckpointError(f"{path.name}: tensor {name} is missing (the index puts it in this file)")
            info = header[name]
            if tuple(info["shape"]) != expected[name]:
                raise CheckpointError(f"{path.name}: tensor {name} has shape {tuple(info['shape'])}, the config "
                                      f"needs {expected[name]}: check config.json (heads, num_key_value_heads, "
                                      "head_dim, sizes) matches the weights")
            if ST_DTYPES[info["dtype"]] != cfg.torch_dtype:
                raise CheckpointError(f"{path.name}: tensor {name} is {info['dtype']} but config.json says "
                                      f"torch_dtype {cfg.dtype}: write the checkpoint again in one dtype")
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for name in wanted:
                t = f.get_tensor(name)
                tensors[name] = t if dtype is None else t.to(dtype)
    return cfg, {n: tensors[n] for n in expected}

