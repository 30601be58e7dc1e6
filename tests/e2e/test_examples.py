"""Every example in examples/, run at smoke size on this machine (loopback addresses):

- two_machines: coordinator.sh, then peer.sh for stages 0 and 1 (the head trains);
- docker_gpu/run.sh for stage 2, with a stand-in `docker` that runs the Dockerfile's
  ENTRYPOINT here (tests/docker_shim.py), and the Dockerfile's HEALTHCHECK command against it;
- dashboard_api.py against `swarm dashboard` on that swarm;
- own_text/train.sh on a folder of .txt/.md/.py files (and its refusal of an empty folder);
- how every script finds `swarm` (PATH, else the clone's .venv, else one line on how to install).

They run from the clone's root, as a user would, and must leave no new file in the clone: keys,
identities and checkpoints go to the per-user state folder.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.request

import pytest

from swarm.local_reports import report_events as events
from tests.e2e.processes import at_once
from tests.e2e.scripts import EXAMPLES, ROOT, Scripts, swarm_on_path
from tests.test_dockerfile import instructions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, what: str, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)  # poll interval of files and ports other processes write
    return result


def clone_state() -> tuple[str, list[str]]:
    """What a user would see change in the clone: `git status` (untracked files one by one) and
    every file under examples/, ignored ones included (caches aside)."""
    status = ""
    if (ROOT / ".git").exists():
        status = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=all"],
                                capture_output=True, text=True, timeout=60).stdout
    files = sorted(str(p.relative_to(ROOT)) for p in EXAMPLES.rglob("*") if "__pycache__" not in p.parts)
    return status, files


@pytest.fixture
def scripts(tmp_path):
    env = swarm_on_path(tmp_path / "bin")
    docker = tmp_path / "bin" / "docker"
    docker.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests' / 'docker_shim.py'} \"$@\"\n")
    docker.chmod(0o755)
    env.update(DOCKER_SHIM_LOG=str(tmp_path / "docker-calls.jsonl"), DOCKER_SHIM_DATA=str(tmp_path / "container-data"))
    before = clone_state()
    s = Scripts(tmp_path, env, cwd=ROOT)  # run from the clone's root, as the README says
    yield s
    s.stop()
    assert clone_state() == before, "running the examples left new files in the clone"


def test_two_machines_docker_peer_and_dashboard_api(scripts, tmp_path):
    d = tmp_path
    # no STATE_DIR: the identity and the swarm key go to the per-user state folder ($XDG_DATA_HOME here)
    scripts.start("coordinator", ["bash", EXAMPLES / "two_machines" / "coordinator.sh"], HOST="127.0.0.1",
                  PORT=str(free_port()), SWARM_STATE_DIR="", XDG_DATA_HOME=str(d / "xdg"))
    address = scripts.coordinator_address()
    assert address.startswith("/ip4/127.0.0.1/")
    state = d / "xdg" / "subspace-swarm"
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in state.iterdir() if not p.name.endswith(".lock")} == {
        "coordinator.id": 0o600, "swarm.key": 0o600}

    loopback = ["--host-maddrs", "/ip4/127.0.0.1/tcp/0"]
    scripts.start("head", ["bash", EXAMPLES / "two_machines" / "peer.sh", address, "--stage", "0", "--steps", "1000",
                           "--report", d / "head.jsonl"], HOST="127.0.0.1", STATE_DIR=str(d / "head"))
    scripts.start("middle", ["bash", EXAMPLES / "two_machines" / "peer.sh", address, "--stage", "1",
                             "--report", d / "middle.jsonl"], HOST="127.0.0.1", STATE_DIR=str(d / "middle"))
    # the dashboard, read by the example script at the end: it comes up while the peers do
    port = free_port()
    scripts.start("dashboard", [sys.executable, "-m", "swarm.cli", "dashboard", "--initial-peers", address,
                                "--port", str(port)])
    url = f"http://127.0.0.1:{port}/"

    def ready_of(name: str) -> dict:
        return wait_for(lambda: [e for e in events(d / f"{name}.jsonl") if e["event"] == "ready"], f"{name} ready")[0]

    ready = {n: ready_of(n) for n in ("head", "middle")}
    health = free_port()  # the container's peer takes the stage left: 2
    scripts.start("docker", ["bash", EXAMPLES / "docker_gpu" / "run.sh", address, "--device", "cpu", *loopback,
                             "--report", d / "docker.jsonl"], SWARM_HEALTH_PORT=str(health))
    ready["docker"] = ready_of("docker")
    assert {n: r["stage"] for n, r in ready.items()} == {"head": 0, "middle": 1, "docker": 2}
    assert all(r["reachability"] == "direct" for r in ready.values())
    steps = wait_for(lambda: [e for e in events(d / "head.jsonl") if e["event"] == "step"][3:], "4 steps")
    assert steps[-1]["loss"] < 6.0

    # what run.sh asked Docker for: a build of this repository, then the GPU, the port and the volume
    calls = [json.loads(line) for line in (d / "docker-calls.jsonl").read_text().splitlines()]
    assert calls[0][0] == "build" and calls[0][-1].endswith("examples/docker_gpu/../..")
    run = calls[1]
    assert run[0] == "run" and run[run.index("--gpus") + 1] == "all"
    assert run[run.index("-p") + 1] == "31337:31337" and run[run.index("-v") + 1].endswith(":/data")
    # the container's identity and checkpoint folder went to its /data volume
    assert (d / "container-data" / "identity.key").exists()

    # run.sh passed SWARM_HEALTH_PORT on (docker run -e), and the image's HEALTHCHECK command, in the
    # container's environment, reads the peer's /healthz there
    assert run[run.index("-e") + 1] == "SWARM_HEALTH_PORT"
    check = json.loads(instructions()["HEALTHCHECK"][0].split("CMD", 1)[1])
    assert check[:2] == ["sh", "-c"]
    probe = subprocess.run(check, capture_output=True, text=True, timeout=30,
                           env={**os.environ, "SWARM_HEALTH_PORT": str(health)})
    assert probe.returncode == 0 and json.loads(probe.stdout)["state"] == "online", probe.stdout + probe.stderr

    # the dashboard, read by the example script
    def three_online() -> dict | None:
        try:
            with urllib.request.urlopen(url + "api/v1/state", timeout=5) as r:
                state = json.load(r)
        except OSError:
            return None
        online = [p for p in state.get("peers") or [] if p.get("online")]
        # a health record is republished every ttl/3: the first ones may still say step 0
        return state if len(online) == 3 and max(p.get("step") or 0 for p in online) >= 1 else None

    state = wait_for(three_online, "the dashboard to show 3 online peers past step 0", timeout=120)
    out = subprocess.run([sys.executable, str(EXAMPLES / "dashboard_api.py"), url, "--json"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["run"] == state["run"]["hash"] and summary["stages"] == summary["stages_covered"] == 3
    assert summary["peers_online"] == 3 and summary["relayed_peers"] == [] and summary["step"] >= 1
    text = subprocess.run([sys.executable, str(EXAMPLES / "dashboard_api.py"), url], capture_output=True, text=True,
                          timeout=60)
    assert re.match(rf"run {summary['run']}: 3/3 stages covered, 3 peers online \(0 relayed\)", text.stdout)
    for name in ("coordinator", "head", "middle", "docker"):
        assert scripts.procs[name].poll() is None, scripts.log(name)[-3000:]


def test_own_text_example(scripts, tmp_path):
    folder = tmp_path / "my-texts"
    (folder / "notes").mkdir(parents=True)
    for i, module in enumerate(("json", "textwrap", "argparse")):
        source = __import__(module).__file__
        (folder / "notes" / f"{module}.py").write_text(open(source).read())
        (folder / f"page{i}.md").write_text(f"# Page {i}\n\n" + "Volunteers train one model together. " * 50)
    (folder / "ignored.bin").write_bytes(b"\0" * 100)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "photo.jpg").write_bytes(b"\xff\xd8")
    train = EXAMPLES / "own_text" / "train.sh"

    def run(texts, timeout: float, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", train, texts, "--steps", "3", "--quiet", "--no-dashboard", *extra],
                              capture_output=True, text=True, timeout=timeout, env=scripts.env, cwd=ROOT)

    # the run, and the refusal of a folder with no text, side by side
    done, refused = at_once(lambda: run(folder, 400, "--threads", "1"), lambda: run(empty, 120))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"done: 3 steps, loss [\d.]+ -> [\d.]+", done.stdout), done.stdout
    assert refused.returncode != 0 and "contains no" in refused.stderr, refused.stderr


def test_scripts_find_swarm_on_path_else_in_the_clones_venv_else_say_how_to_install(tmp_path):
    bare_path = "/usr/bin:/bin"
    if shutil.which("swarm", path=bare_path):
        pytest.skip("a swarm command is installed system-wide: cannot test a PATH without one")
    clone = tmp_path / "clone"  # a copy of the examples in a clone that has no .venv yet
    shutil.copytree(EXAMPLES, clone / "examples")
    folder = tmp_path / "texts"
    folder.mkdir()
    env = {**os.environ, "PATH": bare_path, "SWARM_STATE_DIR": str(tmp_path / "state")}

    def run(script: str, *args: str, path: str = bare_path) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", clone / "examples" / script, *args], capture_output=True, text=True,
                              timeout=60, env={**env, "PATH": path}, cwd=tmp_path)

    for script, args in (("own_text/train.sh", [str(folder)]), ("two_machines/coordinator.sh", []),
                         ("two_machines/peer.sh", ["/ip4/127.0.0.1/tcp/1/p2p/x"])):
        missing = run(script, *args)
        assert missing.returncode == 127 and missing.stdout == "", missing.stderr
        line = missing.stderr.strip()
        assert "\n" not in line and "python3 -m venv .venv && .venv/bin/pip install -e ." in line, line

    def fake_swarm(where, says: str) -> None:
        where.mkdir(parents=True, exist_ok=True)
        (where / "swarm").write_text(f'#!/bin/sh\necho "{says}: $*"\n')
        (where / "swarm").chmod(0o755)

    fake_swarm(clone / ".venv" / "bin", "venv")  # the README's install
    done = run("own_text/train.sh", str(folder), "--quiet")
    assert done.returncode == 0 and done.stdout == f"venv: local --data {folder} --steps 200 --quiet\n", done
    peer = run("two_machines/peer.sh", "/ip4/127.0.0.1/tcp/1/p2p/x")
    assert peer.stdout.startswith("venv: peer --initial-peers /ip4/127.0.0.1/tcp/1/p2p/x"), peer
    assert f"--identity {tmp_path / 'state' / 'peer.id'} --checkpoint-dir {tmp_path / 'state' / 'checkpoints'}" in (
        peer.stdout)
    fake_swarm(tmp_path / "bin", "path")  # a swarm on PATH comes first
    coord = run("two_machines/coordinator.sh", path=f"{tmp_path / 'bin'}:{bare_path}")
    assert coord.stdout.startswith(f"path: coordinator --run-spec {clone / 'examples' / 'two_machines' / 'run.toml'}")
    assert "--identity" not in coord.stdout and "--key" not in coord.stdout  # the CLI's defaults: the state folder
    assert sorted(p.name for p in (clone / "examples").rglob("*") if p.is_file()) == sorted(
        p.name for p in EXAMPLES.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
