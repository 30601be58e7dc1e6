"""A dense or subspace run as a Hugging Face `LlamaForCausalLM` folder (no custom code).

With the dense and subspace codecs the trained network is an ordinary LLaMA: what must
match exactly, and how:

- embedding: `model.embed_tokens.weight` = T_fixed + T_S for the subspace codec (T_S = E' U^T
  in "reparam" mode), the plain table for dense; the boundary codecs themselves vanish,
  since decode(encode(h)) = h when h - T_fixed[tok] lies in span(U).
- constrained maps: `o_proj` / `down_proj` are the effective weights (U A in "reparam").
- RoPE: ours (`protocol.model.apply_rope`) rotates interleaved pairs (x_{2i}, x_{2i+1}) by
  p * theta_i, theta_i = 10000^(-2i/h); HF's LLaMA rotates halves (y_i, y_{i+h/2}) by the
  same p * theta_i. So within every head of q_proj and k_proj, HF row j takes our row
      pi(j) = 2j            for 0 <= j < h/2,
      pi(j) = 2(j - h/2) + 1  for h/2 <= j < h,
  i.e. y = x[pi]; q.k is unchanged by permuting q and k alike, v and o_proj are untouched.
- RMSNorm eps 1e-6 with the weight multiplying; SwiGLU with silu; no biases; as many KV
  heads as heads; untied output head (`lm_head.weight`); the run's vocabulary (256 bytes, or a
  BPE's, whose `tokenizer.json` the folder holds byte for byte);
  `max_position_embeddings` = the run's seq_len (the longest context it was trained on).

Weights are written in float32 whatever the run's compute dtype.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from peer.data.tokenizer import Tokenizer
from protocol.bottleneck import RMSNorm
from protocol.model import SubspaceEmbedding, SubspaceLinear
from protocol.spec import RunSpec
from protocol.subspace import out_of_subspace

from .gather import ExportError
from .hf_tokenizer import hf_tokenizer_files
from .model import StagedModel
from .native import NATIVE_FILE, ExportMeta
from .safetensors_io import canonical_bytes, write_atomic

ROPE_THETA = 10000.0
HF_DTYPE = torch.float32


def check_hf_exportable(spec: RunSpec) -> None:
    if spec.codec == "bottleneck":
        raise ExportError("a bottleneck run cannot be exported to Hugging Face: its boundaries are trained "
                          "encoder/decoder networks that LlamaForCausalLM has no place for; export it with "
                          "--format native (swarm eval and swarm generate load that).")
    if spec.hybrid:
        raise ExportError("a hybrid run (residual_width > 0) cannot be exported to Hugging Face: each boundary has "
                          "a trained bottleneck that LlamaForCausalLM has no place for; export it with --format "
                          "native (swarm eval and swarm generate load that).")
    if spec.embed_split != "subspace":
        raise ExportError(f"a run with embed_split {spec.embed_split!r} cannot be exported to Hugging Face: each "
                          "stage adds its own token table to the residual stream, which LlamaForCausalLM has no "
                          "place for; export it with --format native (swarm eval and swarm generate load that).")


def rope_permutation(head_dim: int) -> torch.Tensor:
    """pi: HF's row j of a head is our row pi(j) (see the module docstring)."""
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def permute_heads(W: torch.Tensor, n_heads: int, perm: torch.Tensor) -> torch.Tensor:
    """Rows of a [n_heads * h, d_in] projection reordered within every head by `perm`."""
    d_out, d_in = W.shape
    return W.reshape(n_heads, d_out // n_heads, d_in)[:, perm].reshape(d_out, d_in)


def _effective(mod: torch.nn.Module) -> torch.Tensor:
    return mod.effective_weight() if isinstance(mod, SubspaceLinear) else mod.weight


def _embedding(mod: torch.nn.Module) -> torch.Tensor:
    if isinstance(mod, SubspaceEmbedding):
        return mod.T_fixed + mod.trainable_table()
    return mod.weight


def hf_state_dict(model: StagedModel, permutation: Callable[[int], torch.Tensor] = rope_permutation
                  ) -> dict[str, torch.Tensor]:
    """The model's weights under LlamaForCausalLM's names (`permutation` is a parameter so that a
    test can show a wrong one fails)."""
    spec = model.spec
    check_hf_exportable(spec)
    perm = permutation(spec.head_dim)
    out: dict[str, torch.Tensor] = {}
    for m in model.stages:
        if m.is_first:
            out["model.embed_tokens.weight"] = _embedding(m.embed)
        for g, block in zip(spec.layer_range(m.stage), m.blocks):
            p = f"model.layers.{g}."
            out[p + "input_layernorm.weight"] = block.attn_norm.weight
            out[p + "self_attn.q_proj.weight"] = permute_heads(block.wq.weight, spec.n_heads, perm)
            out[p + "self_attn.k_proj.weight"] = permute_heads(block.wk.weight, spec.n_heads, perm)
            out[p + "self_attn.v_proj.weight"] = block.wv.weight
            out[p + "self_attn.o_proj.weight"] = _effective(block.wo)
            out[p + "post_attention_layernorm.weight"] = block.mlp_norm.weight
            out[p + "mlp.gate_proj.weight"] = block.w_gate.weight
            out[p + "mlp.up_proj.weight"] = block.w_up.weight
            out[p + "mlp.down_proj.weight"] = _effective(block.w_down)
        if m.is_last:
            out["model.norm.weight"] = m.norm.weight
            out["lm_head.weight"] = m.head.weight
    return {k: v.detach().to("cpu", HF_DTYPE).contiguous() for k, v in out.items()}


def off_subspace(model: StagedModel) -> float:
    """The largest ||(I - P) W|| / ||W|| over the constrained maps of the non-last stages: how far
    the weights left span(U), i.e. how far this LLaMA can be from the swarm's model (0 for dense)."""
    return max((out_of_subspace(W, m.encoder.U, rows) for m in model.stages if not m.is_last
                for _, W, rows in m.constrained_weights()), default=0.0)


def rms_norm_eps(model: StagedModel) -> float:
    eps = {mod.eps for mod in model.modules() if isinstance(mod, RMSNorm)}
    if len(eps) != 1:
        raise ExportError(f"the model's RMSNorms use several epsilons {sorted(eps)}; LLaMA has one.")
    return eps.pop()


def hf_config(model: StagedModel, tokenizer: Tokenizer | None = None) -> dict:
    spec = model.spec
    eos = tokenizer.eos_id if tokenizer is not None else None
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab,
        "hidden_size": spec.d_model,
        "intermediate_size": spec.d_ff,
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": spec.n_heads,
        "num_key_value_heads": spec.n_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.seq_len,
        "rms_norm_eps": rms_norm_eps(model),
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": None,
        "dtype": "float32",
        "torch_dtype": "float32",
    }


def write_hf(model: StagedModel, meta: ExportMeta, out_dir: str | Path,
             permutation: Callable[[int], torch.Tensor] = rope_permutation,
             tokenizer: Tokenizer | None = None) -> list[Path]:
    """config.json, model.safetensors (with the export's metadata) and the run's tokenizer (default: bytes),
    written with safetensors and tokenizers only (transformers is needed to load the folder, not to write it).
    Every file's bytes are made before the folder is touched: a failure leaves nothing behind."""
    check_hf_exportable(model.spec)
    files = {NATIVE_FILE: canonical_bytes(hf_state_dict(model, permutation), meta.to_metadata()),
             "config.json": (json.dumps(hf_config(model, tokenizer), indent=2, sort_keys=True) + "\n").encode(),
             **hf_tokenizer_files(model.spec.seq_len, tokenizer)}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [write_atomic(out / name, data) for name, data in files.items()]
