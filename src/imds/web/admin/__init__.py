"""The admin API and its pages: writes, reads, audit, channel, explain, refresh, the UI and /docs."""
