"""Search: which configurations a job trains (searchers) and which models stop early (pruners)."""
