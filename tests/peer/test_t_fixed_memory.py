"""Real vocabularies: the `small-bpe` preset and the vocab override, and the subspace's fixed token table
T_fixed [V, d] in the memory estimate (peer/runner/memory_estimate.py `t_fixed_rows`): the copies it counts
are the ones a built stage holds, it grows with V on every stage, and it is built from the seed, never sent."""
from __future__ import annotations

import pytest

from peer.data.corpus import DataError
from peer.runner.memory_estimate import T_FIXED_VOCABS, describe_t_fixed, estimate_stage, t_fixed_rows
from peer.runner.stage import StageRunner
from protocol.model import spec_basis
from protocol.spec import preset


def t_fixed_bytes_held(runner: StageRunner) -> int:
    """Bytes of the distinct [V, d] T_fixed tensors a built stage holds (its basis and its modules' buffers)."""
    V, d = runner.spec.vocab, runner.spec.d_model
    tensors = [runner.basis.T_fixed] + [b for name, b in runner.module.named_buffers() if name.endswith("T_fixed")]
    assert all(tuple(t.shape) == (V, d) for t in tensors)
    return sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in tensors}.values())


def test_the_estimate_counts_the_copies_a_stage_holds():
    spec = preset("tiny", vocab=2048)
    for stage in range(spec.n_stages):
        runner = StageRunner(spec, stage)
        est = estimate_stage(spec, stage, device="cpu")
        assert est.t_fixed == t_fixed_bytes_held(runner) > 0 and est.t_fixed <= est.buffers
        # built from the seed, never sent: not in the state a replica downloads or a checkpoint holds
        assert not [k for k in runner.state_dict()["module"] if "T_fixed" in k]
    again = spec_basis(spec)  # what every peer builds from the seed alone
    assert again.hash() == StageRunner(spec, 0).basis.hash() and again.T_fixed.equal(StageRunner(spec, 2).basis.T_fixed)


def test_t_fixed_at_32k_to_128k_on_every_stage():
    spec = preset("small")
    rows = t_fixed_rows(spec)
    assert [r["vocab"] for r in rows] == [V for V in T_FIXED_VOCABS for _ in range(spec.n_stages)]
    assert set(T_FIXED_VOCABS) >= {32768, 65536, 131072}
    for r in rows:
        assert r["t_fixed"] == r["copies"] * r["vocab"] * spec.d_model * 4 and r["copies"] in (2, 3)
        assert r["sent_bytes"] == 0 and "seed" in r["built_from"] and 0 < r["share_of_peak"] < 1
    at = {(r["vocab"], r["stage"]): r["t_fixed"] for r in rows}
    assert at[(131072, 0)] == 4 * at[(32768, 0)] == 3 * 131072 * 512 * 4  # 768 MiB on stage 0 at 128k
    assert at[(131072, spec.n_stages - 1)] == 2 * 131072 * 512 * 4  # the last stage has no encoder
    text = describe_t_fixed(spec)
    assert "never sent" in text and "V=131072: stage 0 768.0 MiB" in text
    assert t_fixed_rows(preset("small", codec="dense")) == [] and "none" in describe_t_fixed(preset("tiny",
                                                                                                    codec="dense"))


def test_small_bpe_and_the_vocab_override_change_the_vocabulary_alone():
    small, bpe = preset("small"), preset("small-bpe")
    assert bpe.vocab == 32768 and small.vocab == 256
    same = ("d_model", "n_layers", "n_heads", "d_ff", "seq_len", "stage_layers", "rank", "batch_size", "lr")
    assert all(getattr(small, f) == getattr(bpe, f) for f in same)
    assert preset("small", vocab=8192).vocab == 8192
    extra = 2 * (32768 - 256) * 512  # the embedding and the head
    assert sum(estimate_stage(bpe, s).params for s in range(3)) - sum(
        estimate_stage(small, s).params for s in range(3)) == extra


def test_vocab_flag_and_a_contradicting_token_folder(tmp_path):
    import argparse

    from peer.data.run_tokens import with_tokens
    from peer.data.shards import prepare
    from swarm.spec_flags import add_spec_flags, spec_from_args

    p = argparse.ArgumentParser()
    add_spec_flags(p)
    assert spec_from_args(p.parse_args(["--preset", "small", "--vocab", "8192", "--dtype", "fp32"])).vocab == 8192
    (tmp_path / "a.txt").write_text("some words of text\n" * 400, encoding="utf-8")
    prepare(tmp_path / "a.txt", "byte", tmp_path / "bytes", val_tokens=300, progress=False)
    assert with_tokens(preset("tiny"), str(tmp_path / "bytes")).vocab == 256
    with pytest.raises(DataError) as err:
        with_tokens(preset("tiny", vocab=8192), str(tmp_path / "bytes"))
    text = str(err.value)
    assert "\n" not in text and "drop --vocab" in text and "8192" in text
