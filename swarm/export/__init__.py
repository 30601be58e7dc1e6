"""Getting a trained model out of a swarm: export, Hugging Face, eval, generate (issue 13).

    gather.py     a run's stage states (checkpoint folders or live peers): one
                  replica per stage, all at one step, hashes checked, or a clear refusal
    model.py      `StagedModel`: the whole network rebuilt from those states, stage by stage
    safetensors_io.py  byte-deterministic safetensors files (sorted metadata, atomic write)
    native.py     our `model.safetensors`: every stage's weights, the basis, run spec, tokenizer
    hf.py         the mapping to a Hugging Face `LlamaForCausalLM` folder (RoPE permutation)
    hf_tokenizer.py  the byte tokenizer as a `tokenizer.json` that transformers loads
    exporter.py   `swarm export`: gather, then write the native file or the HF folder
    load.py       one loader for `swarm eval` / `swarm generate`: a native file or an HF folder
    evaluate.py   `swarm eval`: held-out (or a training step's) loss and perplexity
    generate.py   `swarm generate`: temperature and top-k sampling
"""
from .gather import ExportError, GatheredRun, fetch_stage_states, gather_from_checkpoints, select_stages
from .model import StagedModel

__all__ = ["ExportError", "GatheredRun", "StagedModel", "fetch_stage_states", "gather_from_checkpoints",
           "select_stages"]
