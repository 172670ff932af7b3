"""Release pins: what each upstream release pins (the table, read from its Dockerfile), resolving a cell's pins,
proposing new cells, and the simple-index client."""
