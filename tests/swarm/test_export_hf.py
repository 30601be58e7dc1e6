"""The Hugging Face export: a library we did not write computes our model's logits (fp32, 1e-4)."""
from __future__ import annotations

import json

import pytest
import torch

from protocol.model import spec_basis
from swarm.export import ExportError, StagedModel
from swarm.export.exporter import export_run
from swarm.export.hf import hf_state_dict, off_subspace, rope_permutation, write_hf
from swarm.export.hf_tokenizer import byte_characters
from swarm.export.load import load_model
from swarm.export.native import ExportMeta
from tests.swarm.export_helpers import fixed_tokens, gathered, rel_err, runner_logits, tiny, trained

transformers = pytest.importorskip("transformers")

TOL = 1e-4


def hf_logits(folder, tokens: torch.Tensor) -> torch.Tensor:
    model = transformers.LlamaForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32)
    with torch.no_grad():
        return model.eval()(input_ids=tokens).logits


@pytest.mark.parametrize("codec,mode", [("subspace", "project"), ("subspace", "reparam"), ("dense", "project")])
def test_transformers_computes_our_logits(codec, mode, tmp_path):
    spec = tiny(codec, subspace_mode=mode)
    pipe = trained(spec, steps=3, switch_at=2 if codec == "subspace" else None)
    run = gathered(pipe)
    if codec == "subspace":  # the export must use the current basis, not the seed's
        assert run.basis_version == 1 and not torch.allclose(run.states[0]["U"], spec_basis(spec).U)
    files = export_run(run, tmp_path / "hf", "hf")
    assert {f.name for f in files} == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}

    tokens = fixed_tokens(spec)
    ours = runner_logits(pipe, tokens)
    theirs = hf_logits(tmp_path / "hf", tokens)
    assert theirs.shape == ours.shape == (2, spec.seq_len, spec.vocab)
    assert rel_err(theirs, ours) < TOL
    # a prefix too: the causal mask and positions line up
    assert rel_err(hf_logits(tmp_path / "hf", tokens[:, :17]), ours[:, :17]) < TOL

    # negative control: no RoPE permutation (or a wrong one) must fail the same comparison
    model = StagedModel.from_states(run.states)
    for wrong in (lambda h: torch.arange(h), lambda h: rope_permutation(h).flip(0)):
        write_hf(model, ExportMeta.of(run, "hf"), tmp_path / "wrong", permutation=wrong)
        assert rel_err(hf_logits(tmp_path / "wrong", tokens), ours) > 10 * TOL


def test_config_says_what_must_match(tmp_path):
    spec = tiny("dense")
    export_run(gathered(trained(spec, steps=1)), tmp_path, "hf")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rms_norm_eps"] == 1e-6
    assert config["num_key_value_heads"] == config["num_attention_heads"] == spec.n_heads
    assert config["tie_word_embeddings"] is False
    assert config["vocab_size"] == 256 and config["max_position_embeddings"] == spec.seq_len
    assert config["rope_parameters"]["rope_theta"] == 10000.0
    loaded = transformers.AutoConfig.from_pretrained(str(tmp_path), local_files_only=True)
    assert loaded.head_dim == spec.head_dim and loaded.num_hidden_layers == spec.n_layers


def test_embedding_is_fixed_plus_trainable_table():
    spec = tiny("subspace")
    run = gathered(trained(spec, steps=1))
    model = StagedModel.from_states(run.states)
    table = hf_state_dict(model)["model.embed_tokens.weight"]
    emb = model.stages[0].embed
    assert torch.equal(table, emb.T_fixed + emb.weight)
    assert sorted(k for k in hf_state_dict(model) if ".layers.0." in k) == sorted(
        f"model.layers.0.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
                                               "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))


def test_rope_permutation_formula():
    assert rope_permutation(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


def test_bottleneck_is_refused_for_hf_and_exported_natively(tmp_path):
    pipe = trained(tiny("bottleneck"), steps=1)
    run = gathered(pipe)
    with pytest.raises(ExportError, match="bottleneck run cannot be exported to Hugging Face.*--format native"):
        export_run(run, tmp_path / "hf", "hf")
    assert not (tmp_path / "hf").exists()
    assert [f.name for f in export_run(run, tmp_path / "native", "native")] == ["model.safetensors"]
    tokens = fixed_tokens(pipe.spec)
    with torch.no_grad():  # its trained encoders/decoders come back with it
        assert torch.equal(load_model(tmp_path / "native").logits(tokens), runner_logits(pipe, tokens))


def refused_for_hf_and_exported_natively(pipe, tmp_path, refusal: str) -> None:
    """HF export refuses the run with `refusal` and writes nothing; the native file keeps what HF has no
    place for, and the loaded model computes the pipeline's logits."""
    run = gathered(pipe)
    with pytest.raises(ExportError, match=refusal):
        export_run(run, tmp_path / "hf", "hf")
    assert not (tmp_path / "hf").exists()
    export_run(run, tmp_path / "native", "native")
    tokens = fixed_tokens(pipe.spec)
    with torch.no_grad():
        assert torch.equal(load_model(tmp_path / "native").logits(tokens), runner_logits(pipe, tokens))


def test_hybrid_is_refused_for_hf_and_exported_natively(tmp_path):
    """The hybrid (issue 24): its boundaries' trained bottlenecks have no place in HF."""
    pipe = trained(tiny("subspace", residual_width=4), steps=2)
    refused_for_hf_and_exported_natively(pipe, tmp_path, "hybrid run .* cannot be exported to Hugging Face.*native")


def test_per_stage_tables_are_refused_for_hf_and_exported_natively(tmp_path):
    """embed_split "per_stage": HF has no place for the stages' own token tables (trained away from zero)."""
    pipe = trained(tiny("subspace", embed_split="per_stage"), steps=2)
    assert all(float(r.module.token_table.detach().abs().max()) > 0 for r in pipe.runners)
    refused_for_hf_and_exported_natively(pipe, tmp_path,
                                         "embed_split 'per_stage' cannot be exported to Hugging Face.*native")


def test_off_subspace_weights_are_measured():
    spec = tiny("subspace")
    model = StagedModel.from_states(gathered(trained(spec, steps=2)).states)
    assert off_subspace(model) < 1e-6
    with torch.no_grad():
        model.stages[1].blocks[0].w_down.weight.add_(1e-3 * torch.randn(model.stages[1].blocks[0].w_down.weight.shape))
    assert off_subspace(model) > 1e-3
    assert off_subspace(StagedModel.from_states(gathered(trained(tiny("dense"), steps=1)).states)) == 0.0


def test_tokenizer_json_encodes_bytes(tmp_path):
    export_run(gathered(trained(tiny("dense"), steps=1)), tmp_path, "hf")
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    text = "def f(x):\n\treturn x ** 2  # wörd ∑ 😀 \x00\x7f"
    ids = tok(text)["input_ids"]
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert sorted(byte_characters()) == list(range(256)) and len(set(byte_characters().values())) == 256
