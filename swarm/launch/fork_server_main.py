"""The fork server's own process (`python -m swarm.launch.fork_server_main PADDING`), started by
`swarm.launch.fork_server.ForkServer`, which explains the design: it imports what swarm processes
import, then forks one child per request on its stdin (a SOCK_SEQPACKET socket) and reports
each child's pid (with a pidfd) and, once reaped, its wait status. It starts no thread: forking
a threaded process is unsafe, so it refuses to serve if an import started one. Multiprocessing
locks that imports made (hivemind keeps four as class attributes: MPFuture's two, SharedBytes' and
its asyncio wrapper's) would be one lock for every child, where plain processes have one each: a
child killed while it held one, or stuck holding it, would stall every later child (a coordinator
that never came up, seen in CI). Each child gets fresh ones; the server refuses to serve if an
import made a lock it cannot renew.
"""
from __future__ import annotations

import gc
import importlib
import json
import multiprocessing
import multiprocessing.synchronize
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence

# torch._dynamo: torch.optim.Optimizer's methods import it on their first call (torch._disable_dynamo), ~800
# modules (sympy, torch.fx, ...) that cost a peer 1.5-3 CPU-s at its first StageRunner; imported here once
PRELOAD = ("swarm.node", "swarm.coordinator", "swarm.dashboard.server", "swarm.monitor.status",
           "swarm.net.reachability", "peer.daemon.interfaces", "peer.state.state_transfer", "torch._dynamo", "uvloop")
# what the children run (`python -m swarm.cli`), named as a process command line names it, not imported: the
# launcher sits below the CLI that starts it. Building its parser imports every subcommand's options, hence
# torch and hivemind
CLI_MODULE, CLI_PARSER = "swarm.cli", "build_parser"
MAX_REQUEST = 1 << 20
OWNER_POLL_S = 1.0  # how often the server checks that its owner (parent) is alive


def process_wide_locks() -> list[tuple[object, str]]:
    """(owner, attribute) of every multiprocessing Lock or RLock that the imports keep as a module's or
    a class's attribute; RuntimeError for any other one (its holder could not be renewed in a child)."""
    found: list[tuple[object, str]] = []
    for lock in [o for o in gc.get_objects() if isinstance(o, multiprocessing.synchronize.SemLock)]:
        owners = [(owner, name) for space in gc.get_referrers(lock) if isinstance(space, dict)
                  for name, value in list(space.items()) if value is lock
                  for owner in gc.get_referrers(space) if isinstance(owner, (type, type(sys)))
                  and vars(owner).get(name) is lock]
        if not owners or type(lock) not in (multiprocessing.synchronize.Lock, multiprocessing.synchronize.RLock):
            raise RuntimeError(f"importing made a multiprocessing {type(lock).__name__} ({lock!r}) that a child "
                               "cannot renew; forking would share it between processes")
        found += owners
    return found


def _renew_locks(locks: list[tuple[object, str]]) -> None:
    """In the child: a fresh lock of the same kind under each name, as a process that imported them has."""
    ctx = multiprocessing.get_context()
    for owner, name in locks:
        setattr(owner, name, type(getattr(owner, name))(ctx=ctx))


def _exit_code(e: SystemExit) -> int:
    """What the interpreter makes of sys.exit(code): None -> 0, int -> itself, else print it and 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def _run_main(main: Callable[[list[str]], object], argv: list[str]) -> int:
    import atexit
    import traceback
    try:
        code = main(argv)
        code = _exit_code(SystemExit(code))
    except SystemExit as e:
        code = _exit_code(e)
    except KeyboardInterrupt:  # as the interpreter does: traceback, then die by SIGINT
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # what the interpreter does at exit: join non-daemon threads, then atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _set_cmdline(words: Sequence[str]) -> None:
    """Show `words` as this process's command line (ps, pgrep -f, /proc/PID/cmdline) by writing
    them over the argv area (the server's padded one; longer ones are cut), NUL-padded."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (proc(5))
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write("\0".join(words).encode()[: end - start - 1].ljust(end - start, b"\0"))
    except (OSError, IndexError, ValueError):
        pass  # only what ps shows differs: the process is the same


def _become_child(request: dict, out: int, err: int, keep_closed: list[int], dispositions: dict,
                  locks: list[tuple[object, str]]) -> None:
    """In the forked child: turn into `python -m swarm.cli ARGV`, run it, and exit with its code."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        _renew_locks(locks)
        for fd in keep_closed:
            os.close(fd)
        for sig, handler in dispositions.items():
            signal.signal(sig, handler)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in {devnull, out, err} - {0, 1, 2}:
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        import random
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        if "torch" in sys.modules:
            sys.modules["torch"].default_generator.seed()
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=stream.isatty() or stream.line_buffering)
        _set_cmdline([sys.executable, "-m", request["module"], *request["argv"]])
        module = importlib.import_module(request["module"])
        sys.argv = [module.__file__, *request["argv"]]
        code = _run_main(module.main, request["argv"])
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        os._exit(code)


def serve(control: socket.socket, owner: int, locks: list[tuple[object, str]]) -> None:
    """Fork a child per request on `control` and report its exit status, until `control` closes
    or `owner` (the parent pid at start) is gone; each child renews `locks` (process_wide_locks)."""
    dispositions = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)}
    # a Ctrl+C or SIGTERM meant for the owner's group must not end the server before the owner
    # has stopped (and collected) its children
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes to the wakeup fd
    children: dict[int, socket.socket] = {}
    while True:
        # the owner's end may live on in a process the owner forked: its death must end us too
        ready = select.select([control, wake_r], [], [], OWNER_POLL_S)[0]
        if os.getppid() != owner:
            return
        if wake_r in ready:
            while True:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    break
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                if (reply := children.pop(pid, None)) is not None:
                    try:
                        reply.send(json.dumps({"status": status}).encode())
                    except OSError:
                        pass  # the owner dropped the handle
                    reply.close()
        if control in ready:
            msg, fds, _, _ = socket.recv_fds(control, MAX_REQUEST, 3)
            if not msg:
                return  # the owner closed it or died
            out, err, reply_fd = fds
            reply = socket.socket(fileno=reply_fd)
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError:  # e.g. out of processes: the owner sees the reply socket close, and starts it plainly
                for fd in {out, err}:
                    os.close(fd)
                reply.close()
                continue
            if pid == 0:
                closed = [control.fileno(), wake_r, wake_w, reply_fd, *(s.fileno() for s in children.values())]
                _become_child(json.loads(msg), out, err, closed, dispositions, locks)
            os.close(out)
            if err != out:
                os.close(err)
            pidfd = os.pidfd_open(pid)  # before any waitpid: the pid cannot have been reused yet
            try:
                socket.send_fds(reply, [json.dumps({"pid": pid}).encode()], [pidfd])
            except OSError:
                pass
            os.close(pidfd)
            children[pid] = reply


def main() -> None:
    owner = os.getppid()  # before the imports: the owner may die while they run
    import warnings
    warnings.filterwarnings("ignore", message=".*torch.jit.script.*")
    _set_cmdline([sys.executable, "-m", "swarm.launch.fork_server_main"])
    control = socket.socket(fileno=os.dup(0))
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    getattr(importlib.import_module(CLI_MODULE), CLI_PARSER)()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # optional (uvloop): the child imports it, or not, as a plain process would
    if threading.active_count() != 1:
        raise RuntimeError(f"importing started threads {threading.enumerate()}; forking is unsafe")
    serve(control, owner, process_wide_locks())


if __name__ == "__main__":
    main()
