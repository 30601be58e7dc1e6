"""Our own export format: one `model.safetensors` that rebuilds the model of any codec.

Tensors: `stages.{s}.{name}` for every entry of stage s's module state dict (the names of
`protocol/model.py`: `embed.weight`, `blocks.{i}.wq.weight`, ... with block indices local
to the stage, codec modules included), and for the subspace codec `basis.U` (the current
U) and `basis.T_fixed`, so that loading needs neither the seed's generator nor a torch
version that regenerates the same constants. The header's metadata carries `format: pt`
and `swarm`: the JSON of `ExportMeta` (run spec, step, basis version, tokenizer, per-stage
weight hashes). A run on a BPE token folder has its tokenizer file beside the weights
(`tokenizer.json`, named in the metadata by the sha256 its run spec pins).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from peer.data.batches import BYTE_VOCAB_SIZE
from peer.data.run_tokenizer import run_tokenizer_sha256
from peer.data.tokenizer import BpeTokenizer, Tokenizer
from protocol.model import spec_basis
from protocol.spec import RunSpec

from .gather import ExportError, GatheredRun
from .safetensors_io import canonical_bytes, read_metadata, read_safetensors, write_atomic

NATIVE_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"  # a BPE run's tokenizer, beside the weights (native and Hugging Face folders)
META_KEY = "swarm"
FORMAT_VERSION = 1
# what peer/data/batches.py's ByteTokenizer does, said so that any program can reproduce it
BYTE_TOKENIZER = {"type": "bytes", "vocab_size": BYTE_VOCAB_SIZE, "encode": "token id = UTF-8 byte value",
                  "decode": "bytes as UTF-8, invalid sequences replaced by U+FFFD", "special_tokens": {}}


def tokenizer_meta(spec: RunSpec, tok: Tokenizer | None = None) -> dict:
    """What the export says of its tokenizer: bytes (`BYTE_TOKENIZER`), or, for a run on a BPE token folder,
    the BPE whose file, `tokenizer.json` beside the weights, is named by the sha256 the run spec pins (said
    also when the export could not include the file, so that a reader knows which file it lacks)."""
    sha = run_tokenizer_sha256(spec)
    if sha is None:
        return dict(BYTE_TOKENIZER)
    return {"type": "bpe", "file": TOKENIZER_FILE, "sha256": sha, "vocab_size": spec.vocab,
            "eos_id": tok.eos_id if tok is not None else None, "format": "Hugging Face tokenizers (tokenizer.json)"}


@dataclass
class ExportMeta:
    """What an exported file says about itself (the `swarm` metadata entry, as JSON)."""

    run_spec: str  # the run spec's canonical JSON (RunSpec.to_json), the run hash is its sha256
    run_hash: str
    step: int  # optimizer steps done by every stage
    basis_version: int
    layout: str  # "native" (stages.{s}.*) or "hf" (LlamaForCausalLM names)
    stage_hashes: list[str] = field(default_factory=list)
    tokenizer: dict = field(default_factory=lambda: dict(BYTE_TOKENIZER))
    format_version: int = FORMAT_VERSION

    @property
    def spec(self) -> RunSpec:
        return RunSpec.from_json(self.run_spec)

    @classmethod
    def of(cls, run: GatheredRun, layout: str, tokenizer: Tokenizer | None = None) -> ExportMeta:
        """The meta of `run`; `tokenizer` (default: bytes) is described in it (`tokenizer_meta`)."""
        return cls(run.spec.to_json(), run.spec.run_hash, run.step, run.basis_version, layout, list(run.stage_hashes),
                   tokenizer_meta(run.spec, tokenizer))

    def to_metadata(self) -> dict[str, str]:
        return {"format": "pt", META_KEY: json.dumps(asdict(self), sort_keys=True)}

    @classmethod
    def from_metadata(cls, metadata: dict[str, str], where: str) -> ExportMeta:
        if META_KEY not in metadata:
            raise ExportError(f"{where} was not written by `swarm export` (no {META_KEY!r} metadata).")
        data = json.loads(metadata[META_KEY])
        if data.get("format_version", 0) > FORMAT_VERSION:
            raise ExportError(f"{where} has export format {data['format_version']}; this swarm reads up to "
                              f"{FORMAT_VERSION}: upgrade subspace-swarm.")
        return cls(**data)


def native_tensors(run: GatheredRun) -> dict[str, torch.Tensor]:
    tensors = {f"stages.{s}.{name}": t for s, st in enumerate(run.states) for name, t in st["module"].items()}
    basis = spec_basis(run.spec)
    if basis is not None:
        U = run.states[0].get("U")
        tensors["basis.U"] = U if U is not None else basis.U
        tensors["basis.T_fixed"] = basis.T_fixed
    return tensors


def write_native(run: GatheredRun, out_dir: str | Path, tokenizer: Tokenizer | None = None) -> list[Path]:
    """`model.safetensors`, and beside it a BPE `tokenizer`'s file (`tokenizer.json`); the files written."""
    out = Path(out_dir)
    if (out / "config.json").exists():
        raise ExportError(f"{out} holds a Hugging Face export (config.json); write the native file to another "
                          f"--out folder.")
    data = canonical_bytes(native_tensors(run), ExportMeta.of(run, "native", tokenizer).to_metadata())
    out.mkdir(parents=True, exist_ok=True)  # only now: a failure above leaves no empty folder
    files = [write_atomic(out / NATIVE_FILE, data)]
    if isinstance(tokenizer, BpeTokenizer):
        files.append(write_atomic(out / TOKENIZER_FILE, tokenizer.data))
    return files


def native_path(path: str | Path) -> Path:
    path = Path(path)
    return path / NATIVE_FILE if path.is_dir() else path


def read_native(path: str | Path) -> tuple[ExportMeta, list[dict], torch.Tensor | None]:
    """(meta, one state dict per stage in the `StageRunner.state_dict()` shape, T_fixed or None)."""
    path = native_path(path)
    if not path.is_file():
        raise ExportError(f"{path} does not exist; pass the folder written by `swarm export`.")
    meta = ExportMeta.from_metadata(read_metadata(path), str(path))
    if meta.layout != "native":
        raise ExportError(f"{path} holds {meta.layout} weights, not the native layout.")
    tensors, _ = read_safetensors(path)
    spec = meta.spec
    states = [{"spec": meta.run_spec, "stage": s, "step": meta.step, "basis_version": meta.basis_version,
               "U": tensors.get("basis.U"), "module": {}} for s in range(spec.n_stages)]
    for name, t in tensors.items():
        if name.startswith("stages."):
            s, _, local = name[len("stages."):].partition(".")
            states[int(s)]["module"][local] = t
    return meta, states, tensors.get("basis.T_fixed")
