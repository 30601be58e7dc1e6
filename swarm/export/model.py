"""`StagedModel`: the whole network rebuilt from its stages' states, for export, eval and generate.

Each stage is built by `build_stage` exactly as a peer builds it, pointed at the state's
basis (U and its version, as `StageRunner.load_state_dict` does) and loaded with the
state's weights; the stages are chained through their boundary codecs, so the logits are
the ones the swarm computes (with `wire_rounding`, also the wire dtype's rounding at each
boundary, as during training). There is no second implementation of the model here.
"""
from __future__ import annotations

import torch
from torch import nn

from protocol.codecs import WirePacker
from protocol.model import StageModule, build_stage, compute_dtype, spec_basis
from protocol.spec import RunSpec
from protocol.subspace import SubspaceBasis


def stage_from_state(spec: RunSpec, state: dict, T_fixed: torch.Tensor | None = None) -> StageModule:
    """Stage `state["stage"]` of `spec` with the state's basis and weights (`T_fixed` defaults to the seed's)."""
    stage = int(state["stage"])
    basis = spec_basis(spec)
    if basis is not None:
        dtype = compute_dtype(spec)
        U = state["U"].to(dtype) if state.get("U") is not None else basis.U
        fixed = T_fixed.to(dtype) if T_fixed is not None else basis.T_fixed
        basis = SubspaceBasis(U, fixed, int(state.get("basis_version") or 0))
    module = build_stage(spec, stage, basis)
    module.load_state_dict(state["module"])
    return module.eval().requires_grad_(False)


class StagedModel(nn.Module):
    """tokens [B, T] (T <= seq_len) -> logits [B, T, vocab], through every stage in order."""

    def __init__(self, spec: RunSpec, stages: list[StageModule], step: int = 0, wire_rounding: bool = False) -> None:
        super().__init__()
        if [m.stage for m in stages] != list(range(spec.n_stages)):
            raise ValueError(f"a model needs stages 0..{spec.n_stages - 1} in order.")
        self.spec, self.step = spec, step
        self.stages = nn.ModuleList(stages)
        self.packer = WirePacker.for_spec(spec) if wire_rounding else None

    @classmethod
    def from_states(cls, states: list[dict], T_fixed: torch.Tensor | None = None, wire_rounding: bool = False
                    ) -> StagedModel:
        spec = RunSpec.from_json(states[0]["spec"])
        stages = [stage_from_state(spec, st, T_fixed) for st in states]
        return cls(spec, stages, int(states[0]["step"]), wire_rounding)

    @property
    def basis_version(self) -> int:
        return self.stages[0].basis_version

    @property
    def max_len(self) -> int:
        return self.spec.seq_len

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[-1] > self.spec.seq_len:
            raise ValueError(f"{tokens.shape[-1]} tokens do not fit this model's context of {self.spec.seq_len}.")
        z = None
        for m in self.stages:
            z = m(tokens, z)
            if self.packer is not None and not m.is_last:
                z = self.packer.roundtrip(z)
        return z
