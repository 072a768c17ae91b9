#!/usr/bin/env bash
# First start of a container: authentication as on a Debian server (README: Deploying on
# your server).  The image's own pg_hba.conf trusts every socket connection; here the socket
# is peer, with the madlib_mop user name map that lets the server open worker sessions as
# the calling role.  Allow an analyst role later with
#   /opt/madlib_mop/.venv/bin/python -m madlib_mop.server_auth allow "$PGDATA/pg_ident.conf" ROLE
# and SELECT pg_reload_conf();
set -euo pipefail
sed -ri 's/^(local[[:space:]]+all[[:space:]]+all[[:space:]]+)trust[[:space:]]*$/\1peer/' "$PGDATA/pg_hba.conf"
/opt/madlib_mop/.venv/bin/python -m madlib_mop.server_auth configure \
    "$PGDATA/pg_hba.conf" "$PGDATA/pg_ident.conf" --server-user postgres
