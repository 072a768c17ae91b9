-- madlib_mop 0.20.0 -> 0.21.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.21.0'" to load this file. \quit

-- Fused groups train and validate on segment servers: _mop_segment_train_fused,
-- _mop_segment_validate_fused and _mop_segment_states (a fused call's states from one
-- server in one request) come with this version's routines.
