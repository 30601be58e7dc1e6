"""What `pip install -e .` alone gives: `swarm export` in both formats without transformers, and
a missing library said in one sentence before anything is written (no empty --out folder)."""
from __future__ import annotations

import sys

import pytest
import torch

from swarm.cli import main
from swarm.export.native import read_native
from swarm.export.safetensors_io import read_metadata
from tests.swarm.export_helpers import save_checkpoints, tiny, trained


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pipe = trained(tiny("subspace"), steps=1)
        return pipe, save_checkpoints(pipe, tmp_path_factory.mktemp("ck"))[0].parent
    finally:
        torch.set_num_threads(threads)


def test_both_formats_export_without_transformers(checkpoints, tmp_path, monkeypatch, capsys):
    pipe, ck = checkpoints
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now raises ImportError
    with pytest.raises(ImportError):
        import transformers  # noqa: F401
    assert main(["export", "--from-checkpoints", str(ck), "--out", str(tmp_path / "native")]) == 0
    meta, states, _ = read_native(tmp_path / "native")
    assert meta.run_hash == pipe.spec.run_hash and len(states) == pipe.spec.n_stages
    assert main(["export", "--from-checkpoints", str(ck), "--out", str(tmp_path / "hf"), "--format", "hf"]) == 0
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert '"layout": "hf"' in read_metadata(tmp_path / "hf" / "model.safetensors")["swarm"]
    capsys.readouterr()
    # loading that folder is what needs transformers: one sentence that says what to install
    assert main(["eval", "--model", str(tmp_path / "hf"), "--batches", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install -e '.[export]'" in err, err


@pytest.mark.parametrize("missing, fmt", [("safetensors", "native"), ("safetensors", "hf"), ("tokenizers", "hf")])
def test_a_missing_library_is_one_sentence_and_leaves_no_folder(checkpoints, tmp_path, monkeypatch, capsys, missing,
                                                                 fmt):
    _, ck = checkpoints
    for name in [m for m in sys.modules if m == missing or m.startswith(missing + ".")] + [missing]:
        monkeypatch.setitem(sys.modules, name, None)
    out = tmp_path / "out"
    assert main(["export", "--from-checkpoints", str(ck), "--out", str(out), "--format", fmt]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and err.count("\n") == 0 and f"needs the {missing} package" in err, err
    assert "pip install -e ." in err
    assert not out.exists()
