-- madlib_mop 0.17.0 -> 0.18.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.18.0'" to load this file. \quit

-- States travel between segment servers (_mop_segment_train, _mop_segment_validate,
-- _mop_segment_peers, _mop_segment_state, _mop_segment_prefix, _mop_segment_states_held
-- and _mop_segment_forget are new): they come with the latest version's routines.
