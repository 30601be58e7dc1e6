"""What a user sees when a command fails: one sentence and an exit code, never a traceback.

Every `swarm` subcommand runs inside `explained` (`swarm/cli.py` `main`). An error a user can
meet becomes `error: SENTENCE` on stderr and exit code 2 (bad usage: the flags or the files
given are wrong) or 1 (the world refused: a port taken, a peer that does not answer, a folder
that cannot be written, memory that cannot be had). `--debug` (anywhere on the command line) or
`SWARM_DEBUG=1` shows the traceback instead, for a bug report.

Exceptions raised on purpose with a sentence for the user are `ValueError`/`SpecError` (usage)
and `Refused` (the world). The rest are translated here from what the libraries raise
(hivemind's `P2PDaemonError`, `OSError`, `MemoryError`, torch's allocator and CUDA errors), so
that no command needs its own copy of these rules.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

USAGE, WORLD = 2, 1  # exit codes: bad usage; the world refused
_OURS = ("swarm", "peer", "protocol")  # packages whose exceptions carry a sentence for the user


class Refused(RuntimeError):
    """The world refused what the user asked (exit 1); the message is one sentence that says what to do."""


@dataclass(frozen=True)
class Explained:
    """An exception as the user reads it."""

    code: int
    sentence: str


def debug_wanted(argv: list[str]) -> tuple[bool, list[str]]:
    """Whether `--debug` is on the command line (anywhere) or SWARM_DEBUG=1 is set; argv without `--debug`."""
    rest = [a for a in argv if a != "--debug"]
    return len(rest) != len(argv) or os.environ.get("SWARM_DEBUG", "") not in ("", "0"), rest


def _daemon(message: str) -> Explained:
    """hivemind's P2PDaemonError, whose text is p2pd's last log line."""
    if "address already in use" in message:
        port = re.search(r":(\d+): bind", message)
        where = f"port {port.group(1)}" if port else "the port of --host-maddrs"
        return Explained(WORLD, f"{where} is taken; pass another with --host-maddrs (/ip4/0.0.0.0/tcp/0 takes any "
                                f"free port).")
    if "bootstrap peers" in message:
        return Explained(WORLD, "no peer answered at --initial-peers; check the address (the coordinator prints it "
                                "as it starts) and that the coordinator is running and reachable from here.")
    if "cannot assign requested address" in message:
        return Explained(WORLD, "this machine has no such address to listen on; pass an address of this machine "
                                "in --host-maddrs (/ip4/0.0.0.0/tcp/0 listens on all of them).")
    last = message.strip().splitlines()[-1] if message.strip() else "no reason given"
    return Explained(WORLD, f"the libp2p daemon (p2pd) failed to start: {last}")


def _os_error(e: OSError) -> Explained:
    if not e.filename and not e.strerror:  # raised by our code with the sentence as its only argument
        return Explained(WORLD, str(e))
    where = f" {e.filename}" if e.filename else ""
    if isinstance(e, PermissionError):
        return Explained(WORLD, f"permission denied on{where}; give this user access to it or pass another path.")
    if isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        return Explained(WORLD, f"{e.strerror or e}:{where}; check the path.")
    return Explained(WORLD, f"{e.strerror or e}{':' + where if where else ''}.")


def _out_of_memory(text: str) -> Explained:
    return Explained(WORLD, "this machine could not allocate the memory asked for; a stage too large for it "
                            "needs more --stages, a smaller --preset or --activation-checkpointing (`swarm memory "
                            f"--preset P` prints what each stage needs) ({text.strip().splitlines()[0][:160]})")


def explain(e: BaseException) -> Explained:
    """The sentence and exit code of any exception a command raised."""
    from protocol.spec import SpecError
    if isinstance(e, Refused):
        return Explained(WORLD, str(e))
    if isinstance(e, (SpecError, ValueError)):  # bad input a user can fix: DataError, a bad --bandwidth, ...
        return Explained(USAGE, str(e))
    if type(e).__name__ == "P2PDaemonError":  # hivemind's, named so that this module imports no hivemind
        return _daemon(str(e))
    if isinstance(e, MemoryError):
        return _out_of_memory("MemoryError: a file or tensor larger than this machine's memory")
    if isinstance(e, OSError):
        return _os_error(e)
    text = str(e)
    if isinstance(e, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower()):
        return _out_of_memory(text)
    if isinstance(e, ImportError):  # an optional package the install left out (swarm/optional.py says which)
        return Explained(WORLD, text)
    if type(e).__module__.split(".")[0] in _OURS and text:  # our own errors are written as the sentence to show
        return Explained(WORLD, text)
    if isinstance(e, (AssertionError, RuntimeError)) and ("CUDA" in text or "NVIDIA driver" in text):
        return Explained(WORLD, f"this machine cannot run the CUDA device asked for ({text.strip()}); pass "
                                f"--device cpu, or install a CUDA build of torch on a machine with an NVIDIA GPU.")
    return Explained(WORLD, f"{type(e).__name__}: {text or 'no message'} (a bug, most likely: rerun with --debug "
                            f"and report the traceback).")


def explained(run: Callable[[], int], debug: bool) -> int:
    """`run()`'s exit code; an exception it raises becomes one sentence on stderr (the traceback with `debug`)."""
    try:
        return run()
    except KeyboardInterrupt:
        print("interrupted.", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except Exception as e:
        if debug:
            raise
        told = explain(e)
        print(f"error: {told.sentence}", file=sys.stderr)
        return told.code
