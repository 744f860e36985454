"""The fabric and the nodes' health: RDMA/RoCE selection, NCCL's own account of the fabric, the
doctor's checks per node and across the fabric, the line rate, the health gate, the smoke
verdict.

Pure decisions (docs/architecture.md): no I/O, unit-tested without it."""
