"""Getting the model out of a real swarm: train `tiny` with OS processes over libp2p, export
the peers' checkpoints with `swarm export`, load the Hugging Face folder with transformers
(a library we did not write must compute our logits), and check `swarm eval` against the
loss the tail reported for the next step, and `swarm generate`.

The export from the live peers runs as its own `swarm` process (its exit code, and another
process writing the same bytes); the commands on files run through `swarm.cli.main` in this
process (the same parser, command and exit code, without a torch import each).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import signal

import pytest
import torch

from peer.runner.state_hash import HASH_EVERY
from protocol.spec import preset
from swarm.cli import main
from swarm.export import StagedModel, gather_from_checkpoints
from swarm.export.exporter import export_run
from swarm.local import LocalOptions, child_env, run_local
from tests.e2e.conftest import swarm_command, wait_for_event

transformers = pytest.importorskip("transformers")

# a step whose state the replicas hash: a live peer serves its state at once then, where between two
# hashed steps it waits until its stage counts as stopped (peer/state/state_transfer.py `stalled`: 10 s here)
STEPS = HASH_EVERY
TOL = 1e-4


def cli(server, folder, *args: str) -> str:
    """`swarm ARGS` as its own process, forked from the session's server as the swarm's processes are
    (tests/e2e/conftest.py `swarm_command`); on one torch thread, as in every test (tests/conftest.py):
    commands run side by side here, and on a 2-core box their second threads only spin."""
    done = swarm_command(server, list(args), child_env(threads=1), folder, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def command(capsys, *args: str) -> str:
    """`swarm ARGS` run in this process: its printed output, once it exited with 0."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    return out


def hf_matches_our_model(ck, hf_dir) -> None:
    """The HF folder's logits (transformers) equal our stages' logits, rebuilt from the checkpoints."""
    run = gather_from_checkpoints([ck])
    ours = StagedModel.from_states(run.states)
    theirs = transformers.LlamaForCausalLM.from_pretrained(str(hf_dir), local_files_only=True, dtype=torch.float32)
    tokens = torch.randint(0, 256, (2, run.spec.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = theirs.eval()(input_ids=tokens).logits, ours(tokens)
    err = float((a - b).abs().max() / b.abs().max())
    assert err < TOL, f"transformers' logits differ from ours by {err:.2e} (relative)"


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_export_a_trained_subspace_swarm(make_swarm, session_fork_server, tmp_path, capsys):
    swarm = make_swarm(codec="subspace")
    ck = tmp_path / "ck"
    swarm.start_coordinator(serving=False)
    peers = [swarm.start_peer(s, "--checkpoint-dir", str(ck), *(["--steps", str(STEPS), "--linger"] if s == 0
                                                                 else [])) for s in range(3)]
    wait_for_event(swarm, "stage0", "done", timeout=240)
    # from the live peers first (the head lingers after its last step), then from their checkpoints
    cli(session_fork_server, tmp_path, "export", "--initial-peers", swarm.maddrs[0], "--out", str(tmp_path / "live"))
    for p in peers:  # every peer saves its checkpoint when stopped
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 0
    swarm.procs = [(n, p) for n, p in swarm.procs if p not in peers]  # they stopped as asked, not crashed
    assert len(list(ck.glob("*-stage*.pt"))) == 3

    # the swarm trains one more step from copies of those checkpoints (started now: it comes up
    # while the exports run); the tail's loss of that step is what `swarm eval` computes on the
    # same microbatches from the export
    resumed = tmp_path / "resumed"
    shutil.copytree(ck, resumed)
    for s in (1, 2):
        swarm.start_peer(s, "--checkpoint-dir", str(resumed), "--resume", name=f"again{s}")
    swarm.start_peer(0, "--checkpoint-dir", str(resumed), "--resume", "--steps", str(STEPS + 1), name="again0")

    command(capsys, "export", "--from-checkpoints", str(ck), "--out", str(tmp_path / "native"))
    command(capsys, "export", "--from-checkpoints", str(ck), "--out", str(tmp_path / "hf"), "--format", "hf")
    hf_matches_our_model(ck, tmp_path / "hf")
    # exporting the same states again writes the same bytes, and so did the live export (another process)
    again = export_run(gather_from_checkpoints([ck]), tmp_path / "again")[0]
    assert sha(again) == sha(tmp_path / "native" / "model.safetensors")
    assert sha(tmp_path / "live" / "model.safetensors") == sha(tmp_path / "native" / "model.safetensors")

    wait_for_event(swarm, "again0", "done", timeout=240)
    (step,) = [e for e in swarm.events("again0") if e["event"] == "step"]
    assert step["step"] == STEPS + 1
    folders = ("native", "hf")
    evals = [command(capsys, "eval", "--model", str(tmp_path / folder), "--train-step", str(STEPS), "--json")
             for folder in folders]
    text = command(capsys, "generate", "--model", str(tmp_path / "native"), "--prompt", "The ", "--max-new-tokens",
                   "40")
    for folder, out in zip(folders, evals):
        result = json.loads(out)
        assert result["step"] == STEPS
        assert result["loss"] == pytest.approx(step["loss"], rel=1e-5), folder
    assert text.startswith("The ") and len(text.rstrip("\n")) > len("The ")


def test_export_a_trained_dense_swarm(tmp_path, capsys):
    spec = preset("tiny", codec="dense", stages=3)
    ck = tmp_path / "ck"
    run_local(LocalOptions(spec, steps=STEPS, workdir=str(tmp_path / "run"), quiet=True, threads=1,
                           checkpoint_dir=str(ck)))  # `swarm local --checkpoint-dir`
    command(capsys, "export", "--from-checkpoints", str(ck), "--out", str(tmp_path / "hf"), "--format", "hf")
    assert gather_from_checkpoints([ck]).step == STEPS
    hf_matches_our_model(ck, tmp_path / "hf")
