"""The per-user state folder: where default keys and identities go, their modes, the warning
for exposed files, and `--state-dir` on the commands that keep files there."""
from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path

import pytest

from protocol.spec import preset
from swarm.cli import build_parser, main
from swarm.coordinator import CoordinatorOptions, run_coordinator
from swarm.options import from_args
from swarm.trust.identity import Identity, IdentityError
from swarm.trust.keys import SigningKey
from swarm.trust.state_dir import ENV_VAR, default_file, state_dir, state_dir_path


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_folder_is_chosen_by_flag_then_env_then_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_dir_path(tmp_path / "flag") == tmp_path / "flag"
    assert state_dir_path() == tmp_path / "env"
    monkeypatch.delenv(ENV_VAR)
    assert state_dir_path() == tmp_path / "xdg" / "subspace-swarm"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/xdg")  # the XDG spec: a relative value is ignored
    assert state_dir_path() == tmp_path / "home" / ".local" / "share" / "subspace-swarm"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert state_dir_path() == tmp_path / "home" / ".local" / "share" / "subspace-swarm"


def test_default_files_land_in_a_private_folder_and_are_written_0600(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "deep" / "state"))
    old = os.umask(0o022)  # a usual umask: without an explicit mode, files would be world-readable
    try:
        key_file, id_file = default_file("swarm.key"), default_file("coordinator.id")
        SigningKey.load_or_create(key_file)
        Identity.load_or_create(id_file)
    finally:
        os.umask(old)
    folder = tmp_path / "deep" / "state"
    assert Path(key_file).parent == folder == Path(id_file).parent
    assert mode(folder) == 0o700
    assert mode(key_file) == 0o600 and mode(id_file) == 0o600
    assert state_dir() == folder  # an existing folder is kept as it is


def test_an_exposed_key_or_identity_logs_how_to_close_it(tmp_path, caplog):
    key_file, id_file = tmp_path / "swarm.key", tmp_path / "peer.id"
    key = SigningKey.load_or_create(key_file)
    identity = Identity.load_or_create(id_file)
    with caplog.at_level(logging.WARNING):
        SigningKey.load_or_create(key_file)
        Identity.load_or_create(id_file)
    assert not [r for r in caplog.records if "chmod" in r.getMessage()]  # 0600: nothing to say
    for path in (key_file, id_file):
        os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING):
        assert SigningKey.load_or_create(key_file).public_bytes() == key.public_bytes()  # still used
        assert Identity.load_or_create(id_file).peer_id == identity.peer_id
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"chmod 600 {key_file}" in w for w in warnings), warnings
    assert any(f"chmod 600 {id_file}" in w for w in warnings), warnings


def test_swarm_identity_defaults_to_the_state_folder_and_takes_state_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env-state"))
    monkeypatch.chdir(tmp_path)
    assert main(["identity"]) == 0
    peer_id = capsys.readouterr().out.strip()
    assert Identity.load_or_create(tmp_path / "env-state" / "peer.id").peer_id == peer_id
    assert main(["identity", "--state-dir", str(tmp_path / "flag-state")]) == 0
    out = capsys.readouterr()
    created = tmp_path / "flag-state" / "peer.id"
    assert mode(created.parent) == 0o700 and mode(created) == 0o600
    assert out.out.strip() == Identity.load_or_create(created).peer_id != peer_id
    assert f"--identity {created}" in out.err
    assert main(["identity", "mine.id"]) == 0  # a path the user names is used as given
    assert (tmp_path / "mine.id").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env-state", "flag-state", "mine.id"]


def test_coordinator_keeps_its_key_and_identity_in_the_state_dir(tmp_path, capsys):
    args = build_parser().parse_args(["coordinator", "--state-dir", str(tmp_path / "coord")])
    opts = from_args(CoordinatorOptions, args, spec=preset("tiny"))
    assert opts.state_dir == str(tmp_path / "coord") and opts.key is None and opts.identity is None
    # another coordinator holds that identity: this one creates the defaults, then refuses before any DHT starts
    id_file = tmp_path / "coord" / "coordinator.id"
    id_file.parent.mkdir(mode=0o700)
    held = Identity.lock(id_file)
    try:
        with pytest.raises(IdentityError, match="another running coordinator uses the identity"):
            asyncio.run(run_coordinator(opts))
    finally:
        os.close(held)
    assert mode(tmp_path / "coord" / "swarm.key") == 0o600 and mode(id_file) == 0o600
    with pytest.raises(SystemExit):
        main(["coordinator", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "swarm.key in the state folder" in text and "a FILE you name is used as given" in text


def test_gitignore_covers_key_and_identity_files_anyway():
    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().splitlines()
    assert {"*.key", "*.id", "*.stages.json"} <= set(ignored)
