"""The workflows behind the commands: verify, provision, smoke, the gate, upgrade and fleet rollouts,
each a tuple of named stages. A command turns its request into a flow call and renders the result."""
