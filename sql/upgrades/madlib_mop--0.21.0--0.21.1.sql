-- madlib_mop 0.21.0 -> 0.21.1
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.21.1'" to load this file. \quit

-- No routine's signature changed: this version's routines replaced 0.21.0's (a fused loop
-- that gathers each model's minibatch inside the traced loop; `auto` fusing more classes).
