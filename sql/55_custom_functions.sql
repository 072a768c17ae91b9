-- Custom losses and metrics (MADlib's custom function catalog), under PostgreSQL's trust
-- rule: only a role that may run programs on the server (superuser, pg_execute_server_program)
-- loads one, and a worker runs an object only from a table such a role owns, from a row
-- such a role wrote (madlib_mop/db/custom_functions.py).

-- The trigger of every object table: the role that inserts or updates a row is recorded
-- in written_by, whatever the statement says.  SECURITY INVOKER: current_user is the writer.
CREATE FUNCTION @extschema@._custom_function_written_by()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NEW.written_by := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)::regrole;
    RETURN NEW;
END
$$;

CREATE FUNCTION @extschema@.load_custom_function(
    object_table varchar,
    object       bytea,
    name         text,
    description  text DEFAULT NULL
)
RETURNS void
#plpython "load_custom_function.py"

CREATE FUNCTION @extschema@.delete_custom_function(
    object_table varchar,
    id           integer
)
RETURNS void
#plpython "delete_custom_function.py"

CREATE FUNCTION @extschema@.delete_custom_function(
    object_table varchar,
    name         text
)
RETURNS void
#plpython "delete_custom_function_by_name.py"

CREATE FUNCTION @extschema@.load_top_k_accuracy_function(
    object_table varchar,
    k            integer
)
RETURNS void
#plpython "load_top_k_accuracy_function.py"
