"""The instance-facing flavors: EC2, OpenStack, Ganeti, NoCloud, Equinix JSON and the channel."""
