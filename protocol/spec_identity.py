"""How a run spec is named and stored: its canonical JSON and the run hash of it, and JSON or TOML files.
Mixed into `RunSpec` (protocol/spec.py), which is a frozen dataclass of plain values."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any, Self

from protocol.spec_choices import HASH_NEUTRAL_DEFAULTS, SpecError


class SpecIdentity:
    """`RunSpec`'s identity (`to_dict`, `to_json`, `run_hash`) and its files (`save`, `load`)."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for name, default in HASH_NEUTRAL_DEFAULTS.items():
            if d[name] == default:
                del d[name]
        d["stage_layers"] = list(self.stage_layers)
        d["betas"] = list(self.betas)
        return d

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces): what is hashed and what travels."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def run_hash(self) -> str:
        # cached: every message header and every inbound check asks for it (the spec is frozen)
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"unknown run spec fields: {', '.join(unknown)}; remove them or check the spelling.")
        try:
            return cls(**data)
        except TypeError as e:
            raise SpecError(f"bad run spec: {e}.") from e

    @classmethod
    def from_json(cls, text: str) -> Self:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(f"run spec is not valid JSON ({e}).") from e
        if not isinstance(data, dict):
            raise SpecError("run spec JSON must be an object.")
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        if path.suffix == ".toml":
            path.write_text(_to_toml(self.to_dict()))
        else:
            path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Self:
        path = Path(path)
        if not path.is_file():
            raise SpecError(f"run spec file {path} does not exist.")
        if path.suffix == ".toml":
            try:
                return cls.from_dict(tomllib.loads(path.read_text()))
            except tomllib.TOMLDecodeError as e:
                raise SpecError(f"run spec {path} is not valid TOML ({e}).") from e
        return cls.from_json(path.read_text())


def _to_toml(d: dict[str, Any]) -> str:
    lines, tables = [], []
    for k, v in sorted(d.items()):
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {json.dumps(v)}")
    for k, v in tables:
        lines.append(f"\n[{k}]")
        lines.extend(f"{kk} = {json.dumps(vv)}" for kk, vv in sorted(v.items()))
    return "\n".join(lines) + "\n"
