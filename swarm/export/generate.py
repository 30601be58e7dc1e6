"""`swarm generate`: text from an exported model, by temperature and top-k sampling.

The prompt is encoded and the result decoded with the run's tokenizer (`LoadedModel.tokenizer`: bytes,
or a BPE run's `tokenizer.json` beside the export).

Each new token is drawn from softmax(logits / temperature) restricted to the `top_k` most
likely tokens (all of them when top_k is 0); temperature 0 takes the most likely token.
The context is the last `max_len` tokens (the run's seq_len): the model was trained on
windows no longer than that, so a longer text is generated with a sliding window (and the
command says so). By default it generates `max_len` new tokens. Draws come from one CPU
generator seeded by `--seed`, so the same prompt and seed give the same text on any device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from peer.data.batches import ByteTokenizer
from swarm.options import opt

from .load import LoadedModel, load_model


@dataclass
class GenerateOptions:
    """What `swarm generate` can be told; each field is also its flag."""

    model: str = opt(None, "folder written by swarm export (native or hf)", metavar="DIR", required=True)
    prompt: str = opt(None, "text to continue", metavar="TEXT", required=True)
    max_new_tokens: int | None = opt(None, "tokens to generate (bytes, or the run's BPE tokens; default: the model's "
                                     "context, the run's seq_len). Each token is predicted from the last seq_len "
                                     "tokens at most: past the context, the window slides and the start of the "
                                     "text is no longer seen", metavar="N")
    temperature: float = opt(0.8, "sampling temperature; 0 takes the most likely token")
    top_k: int = opt(40, "sample among the k most likely tokens; 0 for all")
    seed: int = opt(0, "seed of the sampling generator")
    device: str = opt("cpu", "torch device, e.g. cuda")


def next_token(logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator) -> int:
    """One draw from the last position's logits [V] (see the module docstring)."""
    logits = logits.detach().to("cpu", torch.float64)
    if temperature == 0:
        return int(logits.argmax())
    if top_k > 0 and top_k < logits.numel():
        cutoff = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < cutoff, float("-inf"))
    probs = torch.softmax(logits / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate_ids(model: LoadedModel, prompt: list[int], max_new_tokens: int, temperature: float = 0.8,
                 top_k: int = 40, seed: int = 0) -> list[int]:
    """The prompt's ids followed by `max_new_tokens` sampled ones."""
    if not prompt:
        raise ValueError("the prompt is empty; give at least one character to continue.")
    if temperature < 0 or top_k < 0 or max_new_tokens < 0:
        raise ValueError("--temperature, --top-k and --max-new-tokens must not be negative.")
    generator = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    for _ in range(max_new_tokens):
        context = torch.tensor([ids[-model.max_len:]], dtype=torch.long, device=model.device)
        ids.append(next_token(model.logits(context)[0, -1], temperature, top_k, generator))
    return ids


def generate_text(model: LoadedModel, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8,
                  top_k: int = 40, seed: int = 0) -> str:
    """The prompt and its continuation, encoded and decoded with the run's tokenizer (bytes, or the BPE
    beside the export; bytes that are not UTF-8 become U+FFFD)."""
    tok = model.tokenizer
    ids = generate_ids(model, tok.encode(prompt).tolist(), max_new_tokens, temperature, top_k, seed)
    return tok.decode(ids)


def window_note(model: LoadedModel, prompt_tokens: int, new_tokens: int) -> str | None:
    """The sentence that says the context slides, if prompt + new tokens exceed the model's context."""
    if prompt_tokens + new_tokens <= model.max_len:
        return None
    unit = "byte" if isinstance(model.tokenizer, ByteTokenizer) else "token"
    return (f"the prompt ({prompt_tokens} {unit}s) and {new_tokens} new {unit}s exceed this model's context of "
            f"{model.max_len} {unit}s: each {unit} past it is predicted from the last {model.max_len} {unit}s only "
            f"(a sliding window).")


def run_generate(opts: GenerateOptions) -> tuple[str, str | None]:
    """(the text, the sliding-window note or None)."""
    model = load_model(opts.model, opts.device)
    new = model.max_len if opts.max_new_tokens is None else opts.max_new_tokens
    note = window_note(model, len(model.tokenizer.encode(opts.prompt)), new)
    return generate_text(model, opts.prompt, new, opts.temperature, opts.top_k, opts.seed), note
