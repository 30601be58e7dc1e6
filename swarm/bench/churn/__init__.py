"""`swarm bench churn`: peers in network namespaces killed and replaced all the time (no module imported here: the
bench is imported when it runs).

- `bench.py`: runs the swarm, kills and replaces its peers, and collects their records.
- `report.py`: the figures from those records: goodput, gaps, lost/doubled steps, resets, rollbacks, replica
  agreement, failover.
- `cli.py`: the subcommand and what runs it.
"""
