"""Starting the swarm's processes: `fork_server.py` (`ForkServer`, the caller's side: a swarm process
forked from one that imported torch and hivemind once) and `fork_server_main.py` (the server's own
process)."""
