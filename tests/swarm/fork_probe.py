"""A program the fork-server tests start (as `python -m fork_probe`, or forked by the server):
it prints what a process can tell about itself as one JSON line, then (argv "wait") waits
for a signal, or exits with the code in argv[0]."""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
from pathlib import Path


def main(argv: list[str]) -> int:
    import numpy as np
    import torch
    print(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgid(0), "cwd": os.getcwd(),
        "argv0": sys.argv[0], "cmdline": Path("/proc/self/cmdline").read_text().rstrip("\0").split("\0"),
        "probe_env": os.environ.get("PROBE"), "random": random.random(),
        "numpy": float(np.random.rand()), "torch_seed": torch.initial_seed(), "torch": float(torch.rand(1)),
        "sigint": repr(signal.getsignal(signal.SIGINT)), "sigterm": repr(signal.getsignal(signal.SIGTERM)),
        "stdin": os.path.realpath(f"/proc/self/fd/{sys.stdin.fileno()}"), "threads": threading.active_count(),
        "dynamo": "torch._dynamo" in sys.modules,  # what a peer's first optimizer would import (preloaded)
    }), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if argv and argv[0] == "wait":
        threading.Event().wait()  # until a signal ends the process (SIGINT: KeyboardInterrupt)
    return int(argv[0]) if argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
