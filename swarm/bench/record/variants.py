"""What `swarm bench record` trains and measures, by name (no torch here: the CLI reads it)."""
from __future__ import annotations

# The variants the bench trains. Beside the three codecs at the preset's k = d/100 ("subspace": the published
# method, every stage at the lr): the best lever of issue 24 item 2 (docs/fidelity.md 3d-3f), the constrained
# stages (every stage before the last) at 0.03 x the lr, at ~100x and at 16x (k = d/16), where it closed the
# gap at d=1024 (section 3e). It is now the `record` preset's default for the subspace codec (protocol/spec.py
# `preset`), so each variant names its stage lr.
VARIANTS: dict[str, dict] = {
    "dense": {"codec": "dense"},
    "subspace": {"codec": "subspace", "constrained_stage_lr_scale": 1.0},
    "bottleneck": {"codec": "bottleneck"},
    "subspace-lr0.03": {"codec": "subspace", "constrained_stage_lr_scale": 0.03},
    "subspace-16x-lr0.03": {"codec": "subspace", "ratio": 16, "constrained_stage_lr_scale": 0.03},
    # named only (not in DEFAULT_VARIANTS): the stage lr on the bottleneck codec (docs/fidelity.md 3j: at d=512 it
    # took its 16x gap from +26% to +14%; unmeasured in this setting)
    "bottleneck-lr0.03": {"codec": "bottleneck", "constrained_stage_lr_scale": 0.03},
}
DEFAULT_VARIANTS = ("dense", "subspace", "bottleneck", "subspace-lr0.03", "subspace-16x-lr0.03")
SMOKE_VARIANTS = ("dense", "subspace", "subspace-lr0.03")  # two swarms, three curves


def swarm_of(name: str) -> str:
    """The swarm whose tokens/s a variant has: its codec at its width (`-16x`); the lr moves no byte."""
    v = VARIANTS[name]
    return v["codec"] + (f"-{v['ratio']}x" if "ratio" in v else "")


def check_variants(names: tuple[str, ...]) -> tuple[str, ...]:
    """`names` if each is a variant and dense (the reference) is among them; else ValueError."""
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or "dense" not in names:
        raise ValueError(f"--variants takes dense and any of {', '.join(VARIANTS)}; "
                         + (f"not {', '.join(unknown)}." if unknown else "dense is the reference, name it too."))
    return names
