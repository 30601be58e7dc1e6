"""`swarm eval` and `swarm generate` on exported models, and the three commands' command lines."""
from __future__ import annotations

import json
import math

import pytest
import torch

from peer.data.batches import ByteTokenizer
from protocol.model import lm_loss
from swarm.cli import main
from swarm.export.evaluate import evaluate
from swarm.export.exporter import export_run
from swarm.export.generate import generate_ids, generate_text, next_token
from swarm.export.load import load_model
from tests.swarm.export_helpers import batch_source, gathered, runner_logits, save_checkpoints, tiny, trained

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A subspace run trained 2 steps, exported both ways, and the pipeline that trained it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pipe = trained(tiny("subspace"), steps=2)
        root = tmp_path_factory.mktemp("exported")
        run = gathered(pipe)
        export_run(run, root / "native", "native")
        export_run(run, root / "hf", "hf")
        save_checkpoints(pipe, root / "ck")
        return pipe, root
    finally:
        torch.set_num_threads(threads)


def test_eval_on_a_training_step_equals_the_tails_loss(exported):
    pipe, root = exported
    result = evaluate(load_model(root / "native"), train_step=2)
    # the tail's loss of the next step, through the pipeline's wire bytes (later tests only read the files)
    tail = pipe.train_step(2, batch_source(pipe.spec).microbatch).loss
    assert result.loss == pytest.approx(tail, rel=1e-6)
    assert result.tokens == pipe.spec.batch_size * pipe.spec.seq_len and result.step == 2


def test_validation_loss_and_perplexity(exported):
    pipe, root = exported
    native = evaluate(load_model(root / "native"), batches=4)
    hf = evaluate(load_model(root / "hf"), batches=4)
    spec = pipe.spec
    assert native.tokens == hf.tokens == 4 * spec.microbatch_size * spec.seq_len
    assert native.source == "validation split of pydoc_data.topics"
    assert native.perplexity == pytest.approx(math.exp(native.loss), rel=1e-12)
    assert hf.loss == pytest.approx(native.loss, rel=1e-5)  # transformers agrees on held-out text too
    untrained = trained(spec, steps=0)
    with torch.no_grad():
        before = sum(float(lm_loss(runner_logits(untrained, b[:, :-1]), b[:, 1:]))
                     for b in batch_source(spec).val_batches(4)) / 4
    assert before == pytest.approx(math.log(256), rel=0.02)  # a fresh model is near uniform
    assert native.loss < before - 0.1, "two steps of training did not lower the held-out loss"


def test_eval_on_other_text_and_with_wire_rounding(tmp_path):
    spec = tiny("subspace", wire_dtype="bf16")
    pipe = trained(spec, steps=1)
    export_run(gathered(pipe), tmp_path / "m")
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    other = evaluate(load_model(tmp_path / "m"), data=str(text), batches=2)
    assert other.source == f"validation split of {text}"
    rounded = evaluate(load_model(tmp_path / "m", wire_rounding=True), train_step=1)
    tail = pipe.train_step(1, batch_source(spec).microbatch).loss  # bf16 on the wire
    assert rounded.loss == pytest.approx(tail, rel=1e-6)


def test_greedy_generation_is_the_argmax_and_agrees_with_transformers(exported):
    _, root = exported
    native, hf = load_model(root / "native"), load_model(root / "hf")
    prompt = ByteTokenizer().encode("The for statement").tolist()
    ids = generate_ids(native, prompt, 70, temperature=0)  # 87 tokens: the context slides past seq_len 64
    assert len(ids) == len(prompt) + 70 and ids[:len(prompt)] == prompt
    with torch.no_grad():
        for i in range(len(prompt), len(ids)):
            context = torch.tensor([ids[max(0, i - 64):i]])
            assert ids[i] == int(native.logits(context)[0, -1].argmax())
    assert generate_ids(hf, prompt, 70, temperature=0) == ids
    assert generate_ids(native, prompt, 10, temperature=0.7, top_k=1, seed=3) == ids[:len(prompt) + 10]


def test_sampling_is_seeded_and_keeps_to_top_k(exported):
    _, root = exported
    model = load_model(root / "native")
    a = generate_text(model, "def ", 40, temperature=1.0, top_k=40, seed=1)
    assert a.startswith("def ") and len(a) > 4
    assert generate_text(model, "def ", 40, temperature=1.0, top_k=40, seed=1) == a
    assert generate_text(model, "def ", 40, temperature=1.0, top_k=40, seed=2) != a
    logits = torch.tensor([0.0, 3.0, 1.0, 2.5, -1.0])
    g = torch.Generator().manual_seed(0)
    assert {next_token(logits, 5.0, 2, g) for _ in range(200)} == {1, 3}
    assert {next_token(logits, 50.0, 0, g) for _ in range(400)} == {0, 1, 2, 3, 4}
    with pytest.raises(ValueError, match="prompt is empty"):
        generate_ids(model, [], 5)
    with pytest.raises(ValueError, match="must not be negative"):
        generate_ids(model, [1], 5, temperature=-1)


def test_command_lines(exported, tmp_path, capsys):
    pipe, root = exported
    ck = root / "ck"
    assert main(["export", "--from-checkpoints", str(ck), "--out", str(tmp_path / "hf"), "--format", "hf"]) == 0
    assert "config.json" in capsys.readouterr().out
    assert main(["eval", "--model", str(tmp_path / "hf"), "--batches", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["step"] == 2 and result["run_hash"] == pipe.spec.run_hash and result["tokens"] == 2 * 8 * 64
    assert main(["generate", "--model", str(tmp_path / "hf"), "--prompt", "Hello", "--max-new-tokens", "12"]) == 0
    assert capsys.readouterr().out.startswith("Hello")

    assert main(["export", "--initial-peers", "/ip4/127.0.0.1/tcp/1", "--out", str(tmp_path / "live")]) == 2
    assert "does not name a peer" in capsys.readouterr().err  # refused before any daemon starts
    (tmp_path / "empty").mkdir()
    assert main(["export", "--from-checkpoints", str(tmp_path / "empty"), "--out", str(tmp_path / "x")]) == 2
    assert "error: no checkpoints" in capsys.readouterr().err
    # an earlier export is never replaced unasked (refused before gathering); with --overwrite it is, in its format
    before = (tmp_path / "hf" / "model.safetensors").read_bytes()
    assert main(["export", "--from-checkpoints", str(ck), "--out", str(tmp_path / "hf"), "--format", "hf"]) == 2
    assert "already holds an exported model (model.safetensors); pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == before
    assert main(["export", "--from-checkpoints", str(ck), "--out", str(tmp_path / "hf"), "--format", "hf",
                 "--overwrite"]) == 0
    assert "config.json" in capsys.readouterr().out
    assert main(["export", "--from-checkpoints", str(ck), "--out", str(tmp_path / "hf"), "--overwrite"]) == 2
    assert "holds a Hugging Face export" in capsys.readouterr().err  # native over hf: not even with --overwrite
    (tmp_path / "afile").write_text("")
    assert main(["export", "--from-checkpoints", str(ck), "--out", str(tmp_path / "afile")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert main(["eval", "--model", str(tmp_path / "nothing")]) == 2
    assert "does not exist" in capsys.readouterr().err
