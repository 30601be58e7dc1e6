"""A stand-in for `docker` in tests (Docker does not run here): `build` checks the context,
`run` runs the image's ENTRYPOINT from the Dockerfile on this machine, with the container's
/data mapped to a folder, and the arguments given after the image, as the container would.
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
    entry = [a.replace("/data", str(data), 1) if a.startswith("/data") else a
             for a in instruction(ROOT / "Dockerfile", "ENTRYPOINT")]
    assert entry[0] == "swarm"
    cmd = [sys.executable, "-m", "swarm.cli", *entry[1:], *positional[1:]]
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
