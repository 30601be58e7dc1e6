# Sourced by the example scripts (not run on its own). Sets
#   swarm  this project's `swarm` command: the one on PATH, else this clone's .venv/bin/swarm
#          (what the README's install makes), else the script stops and says how to install it;
#   swarm_state  the per-user state folder where swarm keeps keys and identities by default:
#          $SWARM_STATE_DIR, else $XDG_DATA_HOME/subspace-swarm, else ~/.local/share/subspace-swarm
#          (the same rule as swarm/trust/state_dir.py).
# Nothing here writes into the clone: keys, identities and checkpoints belong in the state folder.
swarm_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if command -v swarm >/dev/null 2>&1; then
    swarm="$(command -v swarm)"
elif [ -x "$swarm_root/.venv/bin/swarm" ]; then
    swarm="$swarm_root/.venv/bin/swarm"
else
    echo "error: no swarm command found; install it with \`cd $swarm_root && python3 -m venv .venv && .venv/bin/pip install -e .\` (the README's quick start), or put its folder on PATH." >&2
    exit 127
fi
case "${XDG_DATA_HOME:-}" in
    /*) swarm_state="${SWARM_STATE_DIR:-$XDG_DATA_HOME/subspace-swarm}" ;;
    *) swarm_state="${SWARM_STATE_DIR:-$HOME/.local/share/subspace-swarm}" ;;  # XDG: a relative value is ignored
esac
