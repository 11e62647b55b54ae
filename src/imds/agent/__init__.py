"""The host agent: Meta addresses, OVS flows and one haproxy for the distributed metadata datapath."""
