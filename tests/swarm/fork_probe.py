"""A program the fork-server tests start (as `python -m fork_probe`, or forked by the server):
it prints what a process can tell about itself as one JSON line, then (argv "wait") waits
for a signal, or exits with the code in argv[0]. argv "hold": take hivemind's process-wide locks
first (and keep them); "grab": report whether each can be taken within a second."""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
from pathlib import Path


def hivemind_locks() -> dict[str, object]:
    """The multiprocessing locks hivemind makes at import, as a module or class attribute."""
    from hivemind.utils.asyncio import _AsyncContextWrapper
    from hivemind.utils.mpfuture import MPFuture, SharedBytes
    return {"initialization": MPFuture._initialization_lock, "update": MPFuture._update_lock,
            "shared_bytes": SharedBytes._lock, "executor": _AsyncContextWrapper.EXECUTOR_LOCK}


def main(argv: list[str]) -> int:
    import numpy as np
    import torch
    mode = argv[0] if argv else ""
    locks = {}
    if mode in ("hold", "grab"):
        locks = {name: lock.acquire(timeout=0 if mode == "hold" else 1.0) for name, lock in hivemind_locks().items()}
    print(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgid(0), "cwd": os.getcwd(),
        "argv0": sys.argv[0], "cmdline": Path("/proc/self/cmdline").read_text().rstrip("\0").split("\0"),
        "probe_env": os.environ.get("PROBE"), "random": random.random(),
        "numpy": float(np.random.rand()), "torch_seed": torch.initial_seed(), "torch": float(torch.rand(1)),
        "sigint": repr(signal.getsignal(signal.SIGINT)), "sigterm": repr(signal.getsignal(signal.SIGTERM)),
        "stdin": os.path.realpath(f"/proc/self/fd/{sys.stdin.fileno()}"), "threads": threading.active_count(),
        "dynamo": "torch._dynamo" in sys.modules,  # what a peer's first optimizer would import (preloaded)
        "locks": locks,
    }), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if mode in ("wait", "hold"):
        threading.Event().wait()  # until a signal ends the process (SIGINT: KeyboardInterrupt)
    return int(mode) if mode.isdigit() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
