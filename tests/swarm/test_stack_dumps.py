"""A local swarm that stops stepping has each of its live processes write its threads' stacks to its
log (SIGUSR1, `swarm.cli.enable_stack_dumps`; `RunReports.dump_stacks`), and the process goes on."""
from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from swarm.local_reports import RunReports

# 'ready' is printed from inside the function: printed before it, the signal could land while the
# process is still at module level, and its stack would rightly not name the function (ci failed so).
SCRIPT = ("from swarm.cli import enable_stack_dumps; enable_stack_dumps()\n"
          "import time\n"
          "def waiting_for_a_step():\n"
          "    print('ready', flush=True)\n"
          "    time.sleep(60)\n"
          "waiting_for_a_step()\n")


@pytest.mark.e2e  # a real process and a real signal
def test_a_stuck_process_writes_its_stacks_to_its_log_and_lives_on(tmp_path):
    log = tmp_path / "stage1.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "ready" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.05)  # poll: the child has registered its handler once it says so
        reports = SimpleNamespace(procs=[("stage1", proc)], dir=tmp_path)
        RunReports.dump_stacks(reports, wait=30.0)
        text = log.read_text()
        assert "waiting_for_a_step" in text and "Current thread" in text, text
        assert proc.poll() is None  # the signal did not stop it
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.e2e  # a real coordinator, forked by the session's server
def test_a_process_that_does_not_come_up_in_time_fails_with_its_stacks(tmp_path):
    """What a CI report then says: not only "did not come up within N s", but where the process was."""
    from protocol.spec import preset
    from swarm.local import LocalOptions, LocalSwarm
    from swarm.local_reports import LocalSwarmError

    swarm = LocalSwarm(LocalOptions(preset("tiny"), workdir=str(tmp_path), threads=1, quiet=True))
    try:
        spec = tmp_path / "run.json"
        swarm.opts.spec.save(spec)
        swarm.spawn("coordinator", ["coordinator", "--run-spec", str(spec), "--host-maddrs", "/ip4/127.0.0.1/tcp/0",
                                    "--maddrs-file", str(tmp_path / "served.json"), "--state-dir", str(tmp_path)])
        swarm.wait_for_file(tmp_path / "served.json", "the coordinator", 90, "coordinator")  # up, with its handler
        with pytest.raises(LocalSwarmError) as err:
            swarm.wait_for_file(tmp_path / "never.json", "the coordinator", 0.5, "coordinator")
        message = str(err.value)
        assert message.startswith("the coordinator did not come up within 0.5 s")
        assert "(most recent call first)" in message
        assert swarm.procs[0][1].poll() is None  # still running: the dump does not stop it
    finally:
        swarm.stop(grace=5.0)
