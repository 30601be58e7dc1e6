"""Gathering stage states for export (one replica per stage, one step, hashes) and the native file."""
from __future__ import annotations

import hashlib
import io
import struct

import pytest
import torch

from protocol.subspace import SubspaceBasis
from swarm.export import ExportError, StagedModel, fetch_stage_states, gather_from_checkpoints
from swarm.export.exporter import ExportOptions, export_run, gather
from swarm.export.gather import StageState, select_stages, state_hash
from swarm.export.native import read_native
from swarm.export.safetensors_io import canonical_bytes, read_safetensors
from swarm.net.addresses import AddressError
from tests.swarm.export_helpers import batch_source, fixed_tokens, runner_logits, save_checkpoints, tiny, trained

pytest.importorskip("safetensors")


@pytest.fixture(scope="module")
def pipe():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return trained(tiny("subspace"), steps=2, switch_at=1)
    finally:
        torch.set_num_threads(threads)


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_checkpoints_gather_into_one_model(pipe, tmp_path):
    save_checkpoints(pipe, tmp_path / "ck")
    run = gather_from_checkpoints([tmp_path / "ck"])
    assert (run.step, run.basis_version, run.spec) == (2, 1, pipe.spec)
    assert run.stage_hashes == [state_hash(r.state_dict()) for r in pipe.runners]
    tokens = fixed_tokens(pipe.spec)
    with torch.no_grad():
        assert torch.equal(StagedModel.from_states(run.states)(tokens), runner_logits(pipe, tokens))


def test_live_and_checkpoint_states_give_identical_files(pipe, tmp_path):
    """A state that travelled as bytes (what a live peer will send, issue 9) and one read from a
    checkpoint file export to the same bytes; so does exporting twice."""
    save_checkpoints(pipe, tmp_path / "ck")
    from_files = export_run(gather_from_checkpoints([tmp_path / "ck"]), tmp_path / "a")[0]

    def travelled(state: dict) -> dict:
        buf = io.BytesIO()
        torch.save(state, buf)
        return torch.load(io.BytesIO(buf.getvalue()), weights_only=False)

    live = select_stages([StageState(travelled(r.state_dict()), f"peer {r.stage}") for r in pipe.runners])
    from_peers = export_run(live, tmp_path / "b")[0]
    again = export_run(gather_from_checkpoints([tmp_path / "ck"]), tmp_path / "c")[0]
    assert sha(from_files) == sha(from_peers) == sha(again)


def test_safetensors_header_is_canonical():
    tensors = {"b": torch.ones(3), "a": torch.zeros(2, dtype=torch.float64)}
    meta = {k: str(i) for i, k in enumerate("zyxwvutsrq")}
    first = canonical_bytes(tensors, meta)
    assert all(canonical_bytes(tensors, dict(reversed(meta.items()))) == first for _ in range(5))
    assert struct.unpack("<Q", first[:8])[0] % 8 == 0  # the data starts 8-byte aligned
    from safetensors.torch import load
    back = load(first)
    assert torch.equal(back["a"], tensors["a"]) and torch.equal(back["b"], tensors["b"])


def test_native_file_rebuilds_the_model_exactly(pipe, tmp_path):
    save_checkpoints(pipe, tmp_path / "ck")
    path = export_run(gather_from_checkpoints([tmp_path / "ck"]), tmp_path / "out")[0]
    meta, states, T_fixed = read_native(tmp_path / "out")
    assert (meta.step, meta.basis_version, meta.spec, meta.layout) == (2, 1, pipe.spec, "native")
    assert meta.tokenizer["type"] == "bytes" and meta.tokenizer["vocab_size"] == 256
    assert torch.equal(states[1]["U"], pipe.runners[1].basis.U)
    assert torch.equal(T_fixed, pipe.runners[0].basis.T_fixed)
    tensors, metadata = read_safetensors(path)
    assert metadata["format"] == "pt"
    assert "stages.0.embed.weight" in tensors and "stages.2.head.weight" in tensors
    tokens = fixed_tokens(pipe.spec)
    with torch.no_grad():
        assert torch.equal(StagedModel.from_states(states, T_fixed)(tokens), runner_logits(pipe, tokens))


def test_missing_stage_is_refused(pipe, tmp_path):
    save_checkpoints(pipe, tmp_path / "ck", stages=[0, 2])
    with pytest.raises(ExportError, match="no state of stage 1 of run .* every stage is needed"):
        gather_from_checkpoints([tmp_path / "ck"])


def test_stages_at_different_steps_are_refused(tmp_path):
    spec = tiny("dense")
    p = trained(spec, steps=1)
    save_checkpoints(p, tmp_path / "ck", stages=[0, 1])
    p.train_step(1, batch_source(spec).microbatch)
    save_checkpoints(p, tmp_path / "ck", stages=[2])
    with pytest.raises(ExportError, match=r"different steps \(stage 0 at step 1; stage 1 at step 1; stage 2 at "
                                          r"step 2\)"):
        gather_from_checkpoints([tmp_path / "ck"])
    # with every stage also at step 2 somewhere, the highest common step is taken
    save_checkpoints(p, tmp_path / "later")
    assert gather_from_checkpoints([tmp_path / "ck", tmp_path / "later"]).step == 2


def test_replicas_with_different_weights_are_refused(tmp_path):
    spec = tiny("dense")
    a, b = trained(spec, steps=1), trained(spec, steps=1)  # two replicas that saw the same messages
    save_checkpoints(a, tmp_path / "a")
    save_checkpoints(b, tmp_path / "b")
    assert gather_from_checkpoints([tmp_path / "a", tmp_path / "b"]).step == 1  # identical replicas are fine
    with torch.no_grad():
        b.runners[1].module.blocks[0].wq.weight.add_(1e-3)
    save_checkpoints(b, tmp_path / "b", stages=[1])
    with pytest.raises(ExportError, match="replicas of stage 1 at step 1 hold different weights"):
        gather_from_checkpoints([tmp_path / "a", tmp_path / "b"])


def test_stages_on_different_bases_are_refused(pipe, tmp_path):
    save_checkpoints(pipe, tmp_path / "ck", stages=[0, 1])
    tail = pipe.runners[2]
    state = tail.state_dict()
    tail_basis = SubspaceBasis(tail.basis.U, tail.basis.T_fixed, tail.basis_version + 1)
    state["basis_version"], state["U"] = tail_basis.version, tail_basis.U
    torch.save(state, tmp_path / "ck" / f"{pipe.spec.run_hash}-stage2.pt")
    with pytest.raises(ExportError, match=r"different basis versions \(\[1, 1, 2\]\)"):
        gather_from_checkpoints([tmp_path / "ck"])


def test_several_runs_need_a_choice(pipe, tmp_path):
    other = trained(tiny("dense"), steps=1)
    save_checkpoints(pipe, tmp_path / "ck")
    save_checkpoints(other, tmp_path / "ck")
    with pytest.raises(ExportError, match="2 runs.*pass --run HASH"):
        gather_from_checkpoints([tmp_path / "ck"])
    assert gather_from_checkpoints([tmp_path / "ck"], run=other.spec.run_hash).spec == other.spec
    with pytest.raises(ExportError, match="no state of run 0123456789abcdef"):
        gather_from_checkpoints([tmp_path / "ck"], run="0123456789abcdef")


def test_misnamed_or_missing_checkpoints_are_refused(pipe, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match="no checkpoints"):
        gather_from_checkpoints([tmp_path / "empty"])
    with pytest.raises(ExportError, match="does not exist"):
        gather_from_checkpoints([tmp_path / "nowhere"])
    save_checkpoints(pipe, tmp_path / "ck", stages=[0])
    (tmp_path / "ck" / f"{pipe.spec.run_hash}-stage0.pt").rename(tmp_path / "ck" / f"{pipe.spec.run_hash}-stage1.pt")
    with pytest.raises(ExportError, match="is named for run .* stage 1 but holds run .* stage 0"):
        gather_from_checkpoints([tmp_path / "ck"])
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / f"{pipe.spec.run_hash}-stage0.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ExportError, match="cannot read checkpoint"):
        gather_from_checkpoints([tmp_path / "torn"])


async def test_live_export_refuses_an_address_that_names_no_peer():
    with pytest.raises(AddressError, match="does not name a peer"):
        await fetch_stage_states(["/ip4/127.0.0.1/tcp/1/p2p/x"])


def test_export_needs_exactly_one_source(tmp_path):
    for opts in (ExportOptions(out=str(tmp_path)),
                 ExportOptions(out=str(tmp_path), initial_peers=["/ip4/1.2.3.4/tcp/1"], from_checkpoints=["x"])):
        with pytest.raises(ExportError, match="either --initial-peers .* or --from-checkpoints"):
            gather(opts)
