-- First start of a container: the extension in its default schema.
CREATE SCHEMA IF NOT EXISTS madlib_mop;
CREATE EXTENSION IF NOT EXISTS madlib_mop SCHEMA madlib_mop CASCADE;
