-- madlib_mop 0.16.0 -> 0.17.0
\echo Use "ALTER EXTENSION madlib_mop UPDATE TO '0.17.0'" to load this file. \quit

-- A coordinator's job takes up the idle worker sessions of a segment server through a
-- relaying session there (_mop_relay_adopt, _mop_relay_call, _mop_relay_release are new):
-- they come with the routines of the latest update script.
