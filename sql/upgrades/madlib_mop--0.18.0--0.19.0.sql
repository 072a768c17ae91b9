-- madlib_mop 0.18.0 -> 0.19.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.19.0'" to load this file. \quit

-- States of any size on segment servers, and materialize_features where the rows are
-- (_mop_segment_receive, _mop_initial_state_piece, _mop_worker_limits and
-- _mop_segment_materialize are new): they come with the latest version's routines.
