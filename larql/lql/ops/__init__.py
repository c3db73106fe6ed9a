"""Statement handlers, grouped by family; each takes (statement, session) and returns a Result."""
