"""Names and sessions: resolving users' table names, opening sessions as the caller."""
