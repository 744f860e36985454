"""What cp sends, skips and deletes, which large files it broadcasts down which chain, and the
console filters and value checks the commands share.

Pure decisions (docs/architecture.md): no I/O, unit-tested without it."""
