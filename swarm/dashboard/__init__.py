"""`swarm dashboard`: a swarm's health in the browser, as JSON (`/api/v1/state`) and for Prometheus.

`book.py` verifies health records, `state.py` samples the DHT into snapshots and time series,
`metrics.py` renders them for Prometheus, `server.py` serves it all, `static/` is the page.
"""
