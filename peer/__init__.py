"""One volunteer's process: hosts one pipeline stage, trains it, and serves its neighbours."""
