"""Where this user's keys and identities live when no path is given: the per-user state folder.

A swarm key decides a run and an identity is a peer's name: neither belongs in a working tree,
where `git add -A` would publish it. Files a command keeps by default go to

    --state-dir DIR, else $SWARM_STATE_DIR, else $XDG_DATA_HOME/subspace-swarm,
    else ~/.local/share/subspace-swarm

created with mode 0700 (files inside are written 0600 by `SigningKey` and `Identity`). A path
the user names (`--key FILE`, `--identity FILE`) is used as given, relative to the current
folder. A key or identity file that others can read still works, with a warning that says how
to close it.
"""
from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

ENV_VAR = "SWARM_STATE_DIR"
APP_DIR = "subspace-swarm"
# help text of every --state-dir flag, and of the flags whose default lives there
WHERE = f"${ENV_VAR}, else $XDG_DATA_HOME/{APP_DIR}, else ~/.local/share/{APP_DIR}"


def state_dir_path(override: str | os.PathLike[str] | None = None) -> Path:
    """The state folder (see the module docstring), without creating it."""
    if override:
        return Path(override).expanduser()
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "share"  # XDG: a relative value is ignored
    return base / APP_DIR


def state_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The state folder, created (mode 0700) if it does not exist yet."""
    path = state_dir_path(override)
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass  # another process made it meanwhile
        else:
            os.chmod(path, 0o700)  # the umask may have narrowed it further; never widened
            log.info("created %s for this user's swarm keys and identities", path)
    return path


def default_file(name: str, override: str | os.PathLike[str] | None = None) -> str:
    """`name` inside the state folder (created if needed)."""
    return str(state_dir(override) / name)


def warn_if_exposed(path: str | os.PathLike[str]) -> bool:
    """Log a warning if the private-key file at `path` is readable by group or others; True if it is."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return False
    if mode & 0o077:
        log.warning("the private key file %s is readable by other users of this machine (mode %03o); run "
                    "`chmod 600 %s`", path, mode, path)
        return True
    return False


def read_json_map(path: Path) -> dict:
    """The JSON object kept in `path` (a file beside an identity), or {} if it is missing or not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
