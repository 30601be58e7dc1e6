"""A run on a BPE token folder, exported: the Hugging Face folder holds the run's own tokenizer.json (so
`transformers.AutoTokenizer` loads it and encodes as the run did), transformers generates from the model,
and its tokens decode with the run's BPE; `swarm generate` on the native export samples the same tokens.
An export that cannot find the run's tokenizer, or is given another, says so in one sentence."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from peer.data.run_tokens import token_batches, with_tokens
from peer.data.shards import prepare
from peer.data.tokenizer import BpeTokenizer, train_bpe
from peer.runner.pipeline import InProcessPipeline
from protocol.spec import preset
from swarm.export import ExportError
from swarm.export.exporter import export_run
from swarm.export.generate import generate_ids, generate_text
from swarm.export.load import load_model
from tests.peer.test_tokenizer import corpus_text
from tests.swarm.export_helpers import gathered

transformers = pytest.importorskip("transformers")

PROMPT = "the model of the swarm"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny subspace run trained 2 steps on a BPE-prepared folder, and its tokenizer."""
    root = tmp_path_factory.mktemp("bpe_export")
    (root / "a.txt").write_text(corpus_text(4, 1500), encoding="utf-8")
    tok = train_bpe(root / "a.txt", 360, root / "tokenizer.json")
    prepare(root / "a.txt", tok, root / "tokens", shard_tokens=4000, val_tokens=400, progress=False)
    spec = with_tokens(preset("tiny", stages=3), str(root / "tokens"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pipe = InProcessPipeline(spec)
        for step in range(2):
            pipe.train_step(step, token_batches(spec))
    finally:
        torch.set_num_threads(threads)
    return root, tok, gathered(pipe)


def test_hf_export_ships_the_runs_tokenizer_and_transformers_generates_bpe_text(run, tmp_path):
    root, tok, gathered_run = run
    files = {f.name for f in export_run(gathered_run, tmp_path / "hf", "hf")}
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"} <= files
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (root / "tokenizer.json").read_bytes()
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["vocab_size"] == tok.vocab_size > 256 and config["eos_token_id"] == tok.eos_id

    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    ids = auto(PROMPT, add_special_tokens=False)["input_ids"]
    assert ids == tok.encode(PROMPT).tolist() and len(ids) < len(PROMPT.encode())  # BPE merged bytes
    assert auto.eos_token == "<|endoftext|>" and auto.eos_token_id == tok.eos_id

    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True,
                                                              dtype=torch.float32)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                             pad_token_id=tok.eos_id)[0].tolist()
    assert out[:len(ids)] == ids and len(out) == len(ids) + 12
    assert all(0 <= t < tok.vocab_size for t in out)
    text = tok.decode(out)
    assert text.startswith(PROMPT) and text == auto.decode(out)

    # `swarm generate` on the same folder: the run's BPE encodes the prompt, greedy sampling picks the same tokens
    ours = load_model(tmp_path / "hf")
    assert isinstance(ours.tokenizer, BpeTokenizer) and ours.tokenizer.sha256 == tok.sha256
    assert generate_ids(ours, ids, 12, temperature=0.0) == out
    assert generate_text(ours, PROMPT, 12, temperature=0.0) == text


def test_native_export_keeps_the_tokenizer_and_generates_the_same_text(run, tmp_path):
    root, tok, gathered_run = run
    names = [f.name for f in export_run(gathered_run, tmp_path / "native")]
    assert names == ["model.safetensors", "tokenizer.json"]
    model = load_model(tmp_path / "native")
    assert model.meta.tokenizer["type"] == "bpe" and model.meta.tokenizer["sha256"] == tok.sha256
    assert model.meta.tokenizer["vocab_size"] == tok.vocab_size
    ids = tok.encode(PROMPT).tolist()
    assert tok.decode(generate_ids(model, ids, 12, temperature=0.0)) == generate_text(model, PROMPT, 12, 0.0)


def test_an_export_without_the_runs_tokenizer_says_so(run, tmp_path):
    root, tok, gathered_run = run
    gone = root / "tokens-away"
    (root / "tokens").rename(gone)  # the recorded folder is not on this machine any more
    try:
        with pytest.raises(ExportError) as err:
            export_run(gathered_run, tmp_path / "hf", "hf")
        text = str(err.value)
        assert "\n" not in text and "--tokenizer FILE" in text and tok.sha256[:12] in text
        assert not (tmp_path / "hf").exists()  # refused before anything is written
        (tmp_path / "other.json").write_text((root / "tokenizer.json").read_text().replace("<|endoftext|>", "<|eot|>"))
        with pytest.raises(ExportError) as err:
            export_run(gathered_run, tmp_path / "hf", "hf", str(tmp_path / "other.json"))
        assert "not this run's tokenizer" in str(err.value) and "\n" not in str(err.value)
        # given the file, or from the swarm (what `swarm export --initial-peers` fetched), it works
        assert export_run(gathered_run, tmp_path / "hf", "hf", str(root / "tokenizer.json"))
        fetched = shutil.copy(root / "tokenizer.json", tmp_path / "fetched.json")
        gathered_run.tokenizer = open(fetched, "rb").read()
        try:
            names = [f.name for f in export_run(gathered_run, tmp_path / "native2")]
        finally:
            gathered_run.tokenizer = None
        assert names == ["model.safetensors", "tokenizer.json"]
        # the native weights alone are still written (eval reads token ids); generate then asks for the file
        assert [f.name for f in export_run(gathered_run, tmp_path / "native3")] == ["model.safetensors"]
        with pytest.raises(ExportError, match="has no tokenizer.json beside its weights"):
            generate_text(load_model(tmp_path / "native3"), PROMPT, 2)
    finally:
        gone.rename(root / "tokens")
