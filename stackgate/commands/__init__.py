"""The commands: one module each (verify, provision, smoke, gate, diagnose, report), a request
dataclass in, an ExitCode out; the tasks call them."""
