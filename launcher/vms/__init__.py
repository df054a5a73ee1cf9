"""Cloud VMs that launcher creates, reaches by name and deletes (Azure first): `spec` (what is asked
and the plan), `cloudinit` (the host key and first boot), `aliases` (launcher's SSH config and
known_hosts), `azure` (the SDK calls), `lifecycle` (up, ls, down)."""
