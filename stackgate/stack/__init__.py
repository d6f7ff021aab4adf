"""Everything that changes the machine, and the lock model it works from."""
