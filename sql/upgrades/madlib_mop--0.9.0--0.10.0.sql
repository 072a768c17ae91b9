-- madlib_mop 0.9.0 -> 0.10.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.10.0'" to load this file. \quit

-- Transfer learning from SQL (sql/67_transfer.sql) is new: load_transfer_model,
-- materialize_features and materialize_features_byom come with this version's routines.
-- @routines
