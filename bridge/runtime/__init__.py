"""The running bridge: the process, its worker pool, heartbeats, sweeper and health
endpoint. Its audience is whoever maintains how the bridge runs."""
