"""Where segments live and how their workers are reached."""
