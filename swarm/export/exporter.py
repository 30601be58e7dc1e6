"""`swarm export`: gather every stage's state and write our model file or a Hugging Face folder."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from peer.data.corpus import DataError
from peer.data.run_tokenizer import find_run_tokenizer, load_run_tokenizer, run_tokenizer_sha256
from peer.data.tokenizer import Tokenizer
from swarm.options import opt

from .gather import ExportError, GatheredRun, gather_from_checkpoints, gather_from_peers
from .hf import check_hf_exportable, off_subspace, write_hf
from .hf_tokenizer import byte_tokenizer
from .model import StagedModel
from .native import NATIVE_FILE, ExportMeta, write_native
from .safetensors_io import safetensors_module

log = logging.getLogger(__name__)

FORMATS = ("native", "hf")
# float32 projections leave ~1e-7; anything near 1e-5 means the subspace invariant was broken
OFF_SUBSPACE_WARN = 1e-5


@dataclass
class ExportOptions:
    """What `swarm export` can be told; each field is also its flag (`swarm/options.py`)."""

    out: str = opt(None, "folder to write the model into", metavar="DIR", required=True)
    initial_peers: list[str] = opt([], "export from a running swarm: the coordinator's or any peer's address",
                                   metavar="MADDR")
    from_checkpoints: list[str] = opt([], "export from checkpoint folders (swarm peer --checkpoint-dir) instead",
                                      metavar="DIR")
    format: str = opt("native", "native: our model.safetensors (every codec); hf: a Hugging Face "
                      "LlamaForCausalLM folder (dense and subspace runs)", choices=FORMATS)
    run: str | None = opt(None, "the run hash to export when the folders hold checkpoints of several runs",
                          metavar="HASH")
    tokenizer: str | None = opt(None, "the run's tokenizer.json, for a run on a BPE token folder (default: the copy in "
                                "the run's token folder on this machine, else, with --initial-peers, the swarm's; "
                                "checked against the sha256 the run spec pins)", metavar="FILE")
    overwrite: bool = opt(False, "replace the model an earlier export wrote to --out (without it, a folder that holds "
                          "one is refused before anything is gathered)")


def gather(opts: ExportOptions) -> GatheredRun:
    if bool(opts.initial_peers) == bool(opts.from_checkpoints):
        raise ExportError("give either --initial-peers (a running swarm) or --from-checkpoints DIR... "
                          "(checkpoint folders), not both or neither.")
    if opts.from_checkpoints:
        return gather_from_checkpoints(opts.from_checkpoints, opts.run)
    return asyncio.run(gather_from_peers(opts.initial_peers, opts.run))


def export_tokenizer(run: GatheredRun, path: str | None = None, required: bool = True) -> Tokenizer | None:
    """The run's tokenizer for its export: bytes, or the BPE file `path`, the one the gathering found, or
    this machine's copy in the run's token folder, checked against the run spec's hash. None (logged) if a
    BPE run's is nowhere and not `required`; else ExportError (one sentence)."""
    sha = run_tokenizer_sha256(run.spec)
    try:
        if sha is not None and path is None and run.tokenizer is None and find_run_tokenizer(run.spec) is None:
            why = (f"this run's tokenizer (sha256 {sha[:12]}) is not on this machine: pass --tokenizer FILE (the "
                   f"run's tokenizer.json), or export from the running swarm with --initial-peers")
            if required:
                raise ExportError(why + ".")
            log.warning("%s; the export holds the weights without it", why)
            return None
        return load_run_tokenizer(run.spec, path, None if path is not None else run.tokenizer)
    except DataError as e:
        raise ExportError(str(e)) from None


def export_run(run: GatheredRun, out: str | Path, fmt: str = "native", tokenizer_file: str | None = None
               ) -> list[Path]:
    """Write `run` to `out` in `fmt`, with its tokenizer (`export_tokenizer`); returns the files written."""
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}.")
    if fmt == "native":  # the weights alone still serve `swarm eval`; `swarm generate` needs the tokenizer
        return write_native(run, out, export_tokenizer(run, tokenizer_file, required=False))
    tokenizer = export_tokenizer(run, tokenizer_file)  # a Hugging Face folder without it would be unusable
    check_hf_exportable(run.spec)  # before building anything
    model = StagedModel.from_states(run.states)
    if run.spec.wire_dtype != "fp32" or run.spec.quant != "none":
        log.warning("this run's wire (%s, quant %s) rounded the boundaries while it trained; the exported model "
                    "is the same network without that rounding", run.spec.wire_dtype, run.spec.quant)
    residual = off_subspace(model)
    if residual > OFF_SUBSPACE_WARN:
        log.warning("the constrained weights lie %.1e outside span(U) (relative norm); the subspace decoder drops "
                    "that part, so the exported LLaMA differs from the swarm's model by about as much", residual)
    return write_hf(model, ExportMeta.of(run, "hf", tokenizer), out, tokenizer=tokenizer)


def check_writers(fmt: str) -> None:
    """ImportError (one sentence) if a library that writing `fmt` needs is missing: said before
    gathering anything (a live swarm's states take a while) and before --out is created."""
    safetensors_module()
    if fmt == "hf":
        byte_tokenizer()


def check_out(out: str, overwrite: bool) -> None:
    """ExportError (one sentence) if `out` is not a folder an export may write: a file, or a folder that holds an
    earlier export's model while `overwrite` is off (said before gathering: a live swarm's states take a while)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ExportError(f"--out {out} is a file, not a folder; pass a folder (it is created if missing).")
    if (path / NATIVE_FILE).exists() and not overwrite:
        raise ExportError(f"{out} already holds an exported model ({NATIVE_FILE}); pass --overwrite to replace it, or "
                          f"another --out folder.")


def run_export(opts: ExportOptions) -> list[Path]:
    check_writers(opts.format)
    check_out(opts.out, opts.overwrite)
    run = gather(opts)
    log.info("run %s (%s, codec %s): %d stages at step %d, basis version %d, from %s", run.spec.run_hash,
             run.spec.name, run.spec.codec, run.spec.n_stages, run.step, run.basis_version, ", ".join(run.sources))
    files = export_run(run, opts.out, opts.format, opts.tokenizer)
    for f in files:
        log.info("wrote %s (%.1f kB)", f, f.stat().st_size / 1024)
    return files
