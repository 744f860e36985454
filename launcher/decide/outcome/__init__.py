"""What a run's end means and what follows it: the verdict over the nodes' outcomes, why a rank
died, stacks, hangs and the flight recorder, when a node is lost, stragglers and step rate, the
restart policy and the lemon list, the goodput ledger and its start-up split, failure
fingerprints and the incident memory.

Pure decisions (docs/architecture.md): no I/O, unit-tested without it."""
