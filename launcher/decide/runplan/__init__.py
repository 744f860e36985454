"""How a run is laid out before it starts: the plan from the request and the nodes' facts, the
network environment, rank placement, the container command, DeepSpeed-style device selection,
the run options' groups, another user's runs on a node.

Pure decisions (docs/architecture.md): no I/O, unit-tested without it."""
