-- madlib_mop 0.21.1 -> 0.22.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.22.0'" to load this file. \quit

-- No routine's signature changed: this version's routines replaced 0.21.1's (a job started
-- now trains its small fused groups in XLA-compiled loops; a coordinator asks a segment
-- server's extension version before its fused groups train there).
