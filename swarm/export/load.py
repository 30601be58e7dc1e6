"""One loader for `swarm eval` and `swarm generate`: a native export or a Hugging Face folder.

A native `model.safetensors` becomes a `StagedModel` (our stages, rebuilt as the swarm runs
them); a folder with `config.json` written by `swarm export --format hf` is loaded by
transformers' `LlamaForCausalLM`, offline. Both answer tokens [B, T] -> logits [B, T, V].
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from peer.data.corpus import DataError
from peer.data.run_tokenizer import load_run_tokenizer
from peer.data.tokenizer import ByteTokenizer, Tokenizer

from .gather import ExportError
from .model import StagedModel
from .native import NATIVE_FILE, TOKENIZER_FILE, ExportMeta, native_path, read_native
from .safetensors_io import read_metadata


@dataclass
class LoadedModel:
    meta: ExportMeta
    module: nn.Module
    logits: Callable[[torch.Tensor], torch.Tensor]  # tokens [B, T] -> logits [B, T, vocab]
    max_len: int  # the longest context it takes
    kind: str  # "native" or "hf"
    device: torch.device
    folder: Path | None = None  # where the export lies (its tokenizer.json, for a BPE run)

    @property
    def tokenizer(self) -> Tokenizer:
        """The run's tokenizer: bytes, or the BPE whose `tokenizer.json` the export holds (checked against the
        sha256 its metadata and run spec name); ExportError (one sentence) if it is missing or another."""
        if self.meta.tokenizer.get("type") != "bpe":
            return ByteTokenizer()
        path = (self.folder or Path(".")) / self.meta.tokenizer.get("file", TOKENIZER_FILE)
        if not path.is_file():
            raise ExportError(f"this export of a BPE run has no {path.name} beside its weights; export it again with "
                              f"--tokenizer FILE (the run's tokenizer.json), or copy that file to {path}.")
        try:
            return load_run_tokenizer(self.meta.spec, path)
        except DataError as e:
            raise ExportError(str(e)) from None


def is_hf_folder(path: str | Path) -> bool:
    return (Path(path) / "config.json").is_file()


def _load_native(path: Path, device: torch.device, wire_rounding: bool) -> LoadedModel:
    meta, states, T_fixed = read_native(path)
    model = StagedModel.from_states(states, T_fixed, wire_rounding).to(device)
    return LoadedModel(meta, model, model, model.max_len, "native", device, path.parent)


def _load_hf(path: Path, device: torch.device) -> LoadedModel:
    try:
        from transformers import LlamaForCausalLM
    except ImportError as e:
        raise ImportError("loading a Hugging Face folder needs transformers, which the base install leaves out: "
                          "run `pip install -e '.[export]'` in the clone, or load the native export (swarm export "
                          "without --format hf) instead.") from e
    weights = path / NATIVE_FILE
    if not weights.is_file():
        raise ExportError(f"{path} has a config.json but no {NATIVE_FILE}; pass a folder written by swarm export.")
    meta = ExportMeta.from_metadata(read_metadata(weights), str(weights))
    model = LlamaForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch.float32)
    model = model.to(device).eval().requires_grad_(False)

    def logits(tokens: torch.Tensor) -> torch.Tensor:
        return model(input_ids=tokens, use_cache=False).logits

    return LoadedModel(meta, model, logits, int(model.config.max_position_embeddings), "hf", device, path)


def load_model(path: str | Path, device: str | torch.device = "cpu", wire_rounding: bool = False) -> LoadedModel:
    """The model in `path` (a folder written by `swarm export`, or its model.safetensors)."""
    path, device = Path(path), torch.device(device)
    if not path.exists():
        raise ExportError(f"{path} does not exist; pass the folder written by `swarm export`.")
    if path.is_dir() and is_hf_folder(path):
        if wire_rounding:
            raise ExportError("--wire-rounding needs a native export: a Hugging Face folder has no boundaries.")
        return _load_hf(path, device)
    return _load_native(native_path(path), device, wire_rounding)
