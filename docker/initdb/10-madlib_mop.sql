-- First start of a container: JIT off (its LLVM and TensorFlow's cannot share a process),
-- and the extension in its default schema.
ALTER SYSTEM SET jit = off;
SELECT pg_reload_conf();
CREATE SCHEMA IF NOT EXISTS madlib_mop;
CREATE EXTENSION IF NOT EXISTS madlib_mop SCHEMA madlib_mop CASCADE;
