"""Every mistake of issue 55 a user can make, as the user makes it: `swarm ARGS` through the console
script's entry point (`swarm.cli:main`, in process), checked for its exit code (2: bad usage, 1: the
world refused), its one sentence on stderr, no traceback, and that nothing was started (this lane
refuses any process: tests/conftest.py). The cases that start a p2pd, and the same entry through
the installed `swarm` executable, are in tests/e2e/test_bad_input.py."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from peer.runner.memory_estimate import GIB, parse_size
from protocol.spec import preset
from swarm import memory_command
from swarm.cli import main
from swarm.corpus_text import bad_share, check_text
from swarm.local import LocalOptions, LocalSwarm
from swarm.user_errors import USAGE, WORLD, explain

PEER = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWR1bk34552UHxDiTqQsNZapyuxSreNsAP7iY7Cp7BjDfR"  # right form, nobody there


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    """The files a user's mistakes name: a regular file, binary data, a folder of text with one binary
    among it, a run spec, a file that is no model, a folder nobody can write (root writes anywhere but /sys)."""
    plain = tmp_path / "plain.txt"
    plain.write_text("just a file\n")
    binary = tmp_path / "photo.txt"
    binary.write_bytes(bytes(range(128, 256)))  # too short to train on: with --data-binary-ok the next check stops it
    mixed = tmp_path / "corpus"
    mixed.mkdir()
    (mixed / "a.txt").write_text("words and more words\n" * 200)
    (mixed / "b.txt").write_bytes(os.urandom(4096))
    spec = tmp_path / "run.json"
    spec.write_text(json.dumps(preset("tiny").to_dict()))
    model = tmp_path / "model.safetensors"
    model.write_bytes(os.urandom(1 << 16))
    if os.geteuid() == 0:
        readonly = "/sys/swarm-ck"
    else:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        readonly = str(ro / "ck")
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir(mode=0o000)
    if os.geteuid() == 0:  # root reads any folder it may list; a process without CAP_SYS_ADMIN cannot list this one
        unreadable = Path("/proc/1/map_files")
    return {"unreadable": str(unreadable), "file": str(plain), "binary": str(binary), "mixed": str(mixed),
            "spec": str(spec), "model": str(model), "readonly": readonly, "b.txt": str(mixed / "b.txt")}


def _no_cuda() -> bool:
    return not torch.cuda.is_available()


# (name, argv with {placeholders} from `files`, exit code, fragments of the one sentence)
CASES = [
    # issue 55's tracebacks, now one sentence each
    ("steps 0", "local --steps 0", USAGE, ["--steps must be at least 1", "not 0"]),
    ("steps -5", "local --steps -5", USAGE, ["--steps must be at least 1", "not -5"]),
    ("dashboard port", "local --dashboard-port 70000", USAGE, ["--dashboard-port must be a TCP port", "70000"]),
    ("cuda without cuda", "local --devices cuda:0", WORLD, ["--devices asks for cuda:0", "--devices cpu"]),
    ("device without cuda", "local --device cuda", WORLD, ["--device asks for cuda", "--device cpu"]),
    ("peer cuda without cuda", f"peer --initial-peers {PEER} --device cuda:0", WORLD, ["cannot run CUDA"]),
    ("generate random file", "generate --model {model} --prompt hi", USAGE,
     ["is not a safetensors file", "written by `swarm export`"]),
    ("eval random file", "eval --model {model}", USAGE, ["is not a safetensors file"]),
    ("unreadable checkpoint folder", "export --from-checkpoints {unreadable} --out {file}.out", WORLD,
     ["permission denied on", "give this user access"]),
    # silent loss, now refused before anything starts
    ("checkpoint dir under a file", "local --checkpoint-dir {file}/ck", USAGE,
     ["--checkpoint-dir", "is a file", "pass a folder"]),
    ("workdir is a file", "local --workdir {file}", USAGE, ["--workdir", "is a file"]),
    ("metrics out is a folder", "local --metrics-out {mixed}", USAGE, ["--metrics-out", "is a folder"]),
    ("metrics out in a read-only folder", "local --metrics-out {readonly}/m.json", WORLD, ["cannot be written"]),
    ("checkpoint dir read-only", "local --checkpoint-dir {readonly}", WORLD, ["cannot be written", "--checkpoint-dir"]),
    ("peer checkpoint dir under a file", f"peer --initial-peers {PEER} --checkpoint-dir {{file}}/ck", USAGE,
     ["is a file"]),
    ("coordinator checkpoint dir", "coordinator --checkpoint-dir {file}/ck", USAGE, ["is a file"]),
    ("binary data", "local --data {binary}", USAGE, ["not text", "photo.txt", "--data-binary-ok"]),
    ("binary among text", "local --data {mixed}", USAGE, ["a file that is not text", "b.txt", "--data-binary-ok"]),
    ("coordinator binary data", "coordinator --data {binary}", USAGE, ["not text", "--data-binary-ok"]),
    ("peer binary data", f"peer --initial-peers {PEER} --data {{binary}}", USAGE, ["not text"]),
    ("run spec with dtype", "local --run-spec {spec} --dtype bf16 --stages 2 --codec dense", USAGE,
     ["--stages, --codec, --dtype would be ignored", "change them in the file, or drop --run-spec"]),
    ("coordinator run spec with dtype", "coordinator --run-spec {spec} --dtype fp16", USAGE,
     ["--dtype would be ignored"]),
    ("too large for this machine", "local --preset paper8b", WORLD,
     ["need about", "free", "swarm memory --preset paper8b"]),
    # inputs that were already refused with one sentence stay so
    ("replicas 0", "local --replicas 0", USAGE, ["--replicas must be at least 1"]),
    ("bad bandwidth", "local --bandwidth fast", USAGE, ["bandwidth 'fast' is not a number"]),
    ("missing data", "local --data {file}.nope", USAGE, ["does not exist"]),
    ("bad max memory", f"peer --initial-peers {PEER} --max-memory 8bananas", USAGE,
     ["--max-memory must be a size such as 8GB"]),
    ("health port", f"peer --initial-peers {PEER} --health-port 99999", USAGE, ["--health-port must be a TCP port"]),
    ("dashboard port of dashboard", f"dashboard --initial-peers {PEER} --port -1", USAGE, ["--port must be a TCP"]),
    ("snapshot every", "coordinator --snapshot-every -1", USAGE, ["--snapshot-every must be 0"]),
    # issue 57, item 6: powersgd contributions cannot be checked, so a public swarm does not take them on trust
    ("powersgd in a public swarm", "coordinator --preset tiny --replica-sync powersgd", USAGE,
     ["--replica-sync powersgd leaves every replica's contribution unchecked", "--private", "--unchecked-powersgd"]),
    ("bad replica sync rank", "local --replica-sync-rank 0", USAGE, ["replica_sync_rank must be between 1 and 1024"]),
]


@pytest.mark.parametrize("name,argv,code,words", CASES, ids=[c[0] for c in CASES])
def test_each_mistake_is_one_sentence(name, argv, code, words, files, capsys, monkeypatch):
    if "cuda" in name and not _no_cuda():
        pytest.skip("this machine has CUDA: the case is for one without")
    if name == "unreadable checkpoint folder":
        try:
            os.listdir(files["unreadable"])
            pytest.skip("this user can read every folder (root with CAP_SYS_ADMIN)")
        except PermissionError:
            pass
    monkeypatch.setattr(memory_command, "_available_ram", lambda: 8 * GIB)  # a small machine, whatever this is
    assert main(argv.format(**files).split()) == code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), err
    assert "Traceback" not in err, err
    for w in words:
        assert w in lines[-1], (w, lines[-1])


def test_argparse_mistakes_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["local", "--preset", "huge"])
    assert e.value.code == 2 and "invalid choice: 'huge'" in capsys.readouterr().err


def test_debug_shows_the_traceback(monkeypatch):
    with pytest.raises(ValueError, match="--steps must be at least 1"):
        main(["local", "--steps", "0", "--debug"])
    with pytest.raises(ValueError, match="--steps must be at least 1"):
        main(["--debug", "local", "--steps", "0"])
    monkeypatch.setenv("SWARM_DEBUG", "1")
    with pytest.raises(ValueError, match="--steps must be at least 1"):
        main(["local", "--steps", "0"])


def test_binary_ok_lets_a_binary_corpus_through(files, capsys):
    check_text(files["binary"], binary_ok=True)
    with pytest.raises(ValueError, match="not text"):
        check_text(files["binary"], binary_ok=False)
    check_text(files["mixed"].replace("corpus", "plain.txt"), binary_ok=False)  # plain text passes
    # with the flag the text check is passed and the next check speaks: this corpus is too short to train on
    assert main(["local", "--data", files["binary"], "--data-binary-ok"]) == 2
    err = capsys.readouterr().err
    assert "not text" not in err and "too short" in err, err
    assert bad_share("naïve café ünïcode".encode() * 100) == 0.0
    assert bad_share("é".encode()[:1] + b"x" * 99) < 0.02  # a cut character at the end of a sample is not binary


def test_memory_prints_every_stage_and_its_card(capsys):
    assert main(["memory", "--preset", "paper8b", "--activation-checkpointing"]) == 0
    out = capsys.readouterr().out
    assert "dtype bf16 (auto: bf16 as on a card" in out and "activation checkpointing on" in out
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 8 and all(line.endswith("24 GB") for line in rows), out
    assert main(["memory", "--preset", "small", "--device", "cpu", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "dtype fp32 (--dtype)" in out and "on cpu" in out
    assert len([line for line in out.splitlines() if line.strip()[:1].isdigit()]) == 3


def test_gb_is_what_the_card_tables_mean():
    assert parse_size("24GB") == parse_size("24GiB") == 24 * GIB
    assert parse_size("512MB") == 512 * 2**20


def test_local_memory_check_fits_tiny_and_refuses_what_does_not_fit(monkeypatch):
    monkeypatch.setattr(memory_command, "_available_ram", lambda: 8 * GIB)
    memory_command.check_local_memory(preset("tiny"), ["cpu"], 2)  # fits: nothing raised
    monkeypatch.setattr(memory_command, "_available_ram", lambda: GIB)
    with pytest.raises(Exception, match="need about .* but cpu has 1.0 GiB free"):
        memory_command.check_local_memory(preset("large"), ["cpu"], 1)
    monkeypatch.setenv("SWARM_SKIP_MEMORY_CHECK", "1")
    memory_command.check_local_memory(preset("large"), ["cpu"], 1)


def test_a_failed_run_keeps_its_logs(capsys):
    swarm = LocalSwarm(LocalOptions(preset("tiny")))  # a temporary folder, no process yet
    (swarm.dir / "stage0.log").write_text("why it failed\n")
    swarm.cleanup(keep_logs=True)
    assert (swarm.dir / "stage0.log").read_text() == "why it failed\n"
    assert f"the logs of this run are kept in {swarm.dir}" in capsys.readouterr().err
    kept = swarm.dir
    swarm = LocalSwarm(LocalOptions(preset("tiny")))
    swarm.cleanup()
    assert not swarm.dir.exists()
    import shutil
    shutil.rmtree(kept)


class _P2PDaemonError(Exception):
    """Named as hivemind's is: `explain` goes by the class name, so this module needs no hivemind."""


_P2PDaemonError.__name__ = "P2PDaemonError"


@pytest.mark.parametrize("exc,code,words", [
    (_P2PDaemonError("Daemon failed to start: 2026/12/06 02:05:13 failed to connect to bootstrap peers"), WORLD,
     "no peer answered at --initial-peers"),
    (_P2PDaemonError("Daemon failed to start: failed to listen on any addresses: [listen tcp4 127.0.0.1:45123: "
                     "bind: address already in use]"), WORLD, "port 45123 is taken; pass another with --host-maddrs"),
    (PermissionError(13, "Permission denied", "/data/ck"), WORLD, "permission denied on /data/ck"),
    (MemoryError(), WORLD, "could not allocate the memory"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory: you tried to "
                  "allocate 137438953472 bytes."), WORLD, "swarm memory"),
    (AssertionError("Torch not compiled with CUDA enabled"), WORLD, "--device cpu"),
    (KeyError("surprise"), WORLD, "rerun with --debug"),
])
def test_library_errors_become_one_sentence(exc, code, words):
    told = explain(exc)
    assert told.code == code and words in told.sentence and "\n" not in told.sentence, told


def test_the_banner_names_the_dtype_and_its_origin(files):
    from swarm.cli import build_parser
    from swarm.spec_flags import dtype_origin
    assert dtype_origin(build_parser().parse_args(["local"])) == "auto: cpu"
    assert dtype_origin(build_parser().parse_args(["local", "--dtype", "fp64"])) == "--dtype"
    assert dtype_origin(build_parser().parse_args(["coordinator", "--run-spec", files["spec"]])) == \
        f"from {files['spec']}"
    if _no_cuda():
        assert "no CUDA GPU; a swarm of GPU peers wants --dtype bf16" in dtype_origin(
            build_parser().parse_args(["coordinator"]))
    assert Path(files["spec"]).exists()


def test_a_failed_checkpoint_write_travels_in_the_health_record():
    from dataclasses import asdict

    from tests.swarm.test_health import parse, record, signed_value
    why = "could not write stage 1's checkpoint at step 9 to /ck/x-stage1.pt (No space left on device); free space"
    assert parse(signed_value(record(checkpoint_error=why))).record.checkpoint_error == why
    older = asdict(record())
    del older["checkpoint_error"]  # a peer from before the field: its record is still read, with no error
    assert parse(signed_value(older)).record.checkpoint_error == ""


def test_only_checkpoints_written_by_this_run_count(tmp_path):
    import time

    from peer.runner.checkpoint import checkpoint_path
    spec = preset("tiny", stages=2)
    swarm = LocalSwarm(LocalOptions(spec, workdir=str(tmp_path / "w"), checkpoint_dir=str(tmp_path / "ck")))
    started = time.time()
    assert swarm.missing_checkpoints(since=started) == [0, 1]
    for s in (0, 1):
        path = checkpoint_path(tmp_path / "ck", spec.run_hash, s)
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"state")
    os.utime(checkpoint_path(tmp_path / "ck", spec.run_hash, 1), (started - 3600, started - 3600))  # a reused folder's
    assert swarm.missing_checkpoints(since=started) == [1]


def test_a_failed_local_run_ends_with_its_sentence_after_the_log_tail(monkeypatch, capsys):
    import swarm.local as local
    from swarm.local_reports import LocalSwarmError

    def fails(opts):
        raise LocalSwarmError("stage1 exited with code 1; its log (/tmp/swarm-local-x/stage1.log) ends with:\n"
                              "12:00:00 INFO swarm.node: head: training\nerror: this machine could not allocate")
    monkeypatch.setattr(local, "run_local", fails)
    monkeypatch.setattr(memory_command, "_available_ram", lambda: 8 * GIB)
    import signal
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}  # `swarm local` sets both
    try:
        assert main(["local", "--steps", "1", "--no-dashboard"]) == 1
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2] == "error: this machine could not allocate"  # the peer's own sentence, from its log
    assert err[-1] == ("error: stage1 exited with code 1; its log (/tmp/swarm-local-x/stage1.log) ends with the "
                       "lines above.")
