"""Everything that only looks: facts, checks, reports."""
