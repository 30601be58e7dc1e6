"""A stand-in for `docker` in tests (Docker does not run here): `build` checks the context,
`run` runs the image's ENTRYPOINT from the Dockerfile on this machine (`swarm` is the one on PATH),
with the container's /data mapped to a folder, the image's ENV and the `-e` variables set, and the
arguments given after the image, as the container would.
Every call is appended to $DOCKER_SHIM_LOG as JSON, so tests can check what a script asked for.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WITH_VALUE = {"-p", "--publish", "-v", "--volume", "--name", "--gpus", "-e", "--env", "--restart", "--network",
              "--shm-size", "-t", "--tag", "--health-cmd"}


def instruction(dockerfile: Path, name: str) -> list[str]:
    for line in dockerfile.read_text().splitlines():
        if line.startswith(name + " "):
            return json.loads(line[len(name) + 1:])
    raise SystemExit(f"docker shim: the Dockerfile has no JSON {name}")


def image_env(dockerfile: Path) -> dict[str, str]:
    """The image's `ENV NAME=VALUE` lines (one variable each, as this Dockerfile writes them)."""
    pairs = [line[4:].strip().partition("=") for line in dockerfile.read_text().splitlines() if line.startswith("ENV ")]
    return {name: value for name, _, value in pairs}


def container_env(dockerfile: Path, given: list[str]) -> dict[str, str]:
    """The image's ENV, then each `-e NAME=VALUE`, or `-e NAME` (this shell's value, if it has one)."""
    env = {**os.environ, **image_env(dockerfile)}
    for item in given:
        name, eq, value = item.partition("=")
        if eq:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
    return env


def main(argv: list[str]) -> int:
    with open(os.environ["DOCKER_SHIM_LOG"], "a") as log:
        log.write(json.dumps(argv) + "\n")
    command, args = argv[0], argv[1:]
    flags: dict[str, list[str]] = {}
    positional: list[str] = []
    i = 0
    while i < len(args):
        if args[i] in WITH_VALUE:
            flags.setdefault(args[i], []).append(args[i + 1])
            i += 2
        elif args[i].startswith("-") and not positional:
            flags.setdefault(args[i], []).append("")
            i += 1
        else:
            positional = args[i:]
            break
    if command == "build":
        if not (Path(positional[0]) / "Dockerfile").is_file():
            raise SystemExit(f"docker shim: no Dockerfile in the build context {positional[0]}")
        return 0
    if command != "run":
        raise SystemExit(f"docker shim: {command} is not supported")
    data = Path(os.environ["DOCKER_SHIM_DATA"])
    data.mkdir(parents=True, exist_ok=True)
    dockerfile = ROOT / "Dockerfile"
    shell, dash_c, script, name = instruction(dockerfile, "ENTRYPOINT")
    assert (shell, dash_c) == ("sh", "-c") and " swarm peer " in script
    script = script.replace(" /data/", f" {data}/")
    env = container_env(dockerfile, flags.get("-e", []) + flags.get("--env", []))
    os.execvpe("sh", ["sh", "-c", script, name, *positional[1:]], env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
