"""`swarm bench churn`: peers in network namespaces killed and replaced all the time (no module imported here: the
bench is imported when it runs).

- `bench.py`: runs the swarm, kills and replaces its peers, and collects their records.
- `hosts.py`: what it reads from its hosts meanwhile: the peers' reports, the processes left on a host.
- `report.py`: the figures from those records: goodput, gaps, lost/doubled steps, resets, rollbacks, replica
  agreement, failover.
- `coordinators.py`: with --coordinator-kills, a standby coordinator beside the run's, the active one (as their logs
  say) killed and the killed one started again as a standby.
- `seat_report.py`: the figures of those kills: failover, steps during the outage, basis versions of the new holder.
- `cli.py`: the subcommand and what runs it.
"""
