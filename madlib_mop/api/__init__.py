"""The SQL functions' implementations (MADlib's deep-learning API)."""
