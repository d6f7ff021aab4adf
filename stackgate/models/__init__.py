"""The bottom layer: pure data and pure functions over it (the stack spec, results, findings,
exit codes, the knowledge base's model). Nothing here runs a process or opens a connection."""
