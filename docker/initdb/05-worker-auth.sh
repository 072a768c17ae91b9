#!/usr/bin/env bash
# First start of a container: authentication as on a Debian server (README: Deploying on
# your server).  The image's own pg_hba.conf trusts every socket connection; here the socket
# is peer, with the madlib_mop user name map that lets the server open worker sessions as
# the calling role.  Allow an analyst role later with
#   /opt/madlib_mop/.venv/bin/python -m madlib_mop.tools.server_auth allow "$PGDATA/pg_ident.conf" ROLE
# and SELECT pg_reload_conf();
set -euo pipefail
# No trust anywhere: sockets peer, TCP scram-sha-256 (the image's initdb trusts both).
sed -ri -e 's/^(local([[:space:]]+[^[:space:]]+){2}[[:space:]]+)trust[[:space:]]*$/\1peer/' \
        -e 's/^(host[a-z]*([[:space:]]+[^[:space:]]+){3}[[:space:]]+)trust[[:space:]]*$/\1scram-sha-256/' \
        "$PGDATA/pg_hba.conf"
/opt/madlib_mop/.venv/bin/python -m madlib_mop.tools.server_auth configure \
    "$PGDATA/pg_hba.conf" "$PGDATA/pg_ident.conf" --server-user postgres
