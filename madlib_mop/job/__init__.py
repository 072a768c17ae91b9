"""A model selection job: plan, schedule, coordinator loop, store, outputs, metrics."""
