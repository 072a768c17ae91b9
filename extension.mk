# PGXS: the extension as PostgreSQL builds, installs and tests extensions.
# Called by the Makefile (`make build`, `make install`, `make installcheck`), which first
# generates the SQL scripts into build/ (madlib_mop.tools.extension_build).
#
#   make -f extension.mk PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config [install|installcheck]

EXTENSION   = madlib_mop
MODULE_big  = madlib_mop
OBJS        = src/float4_pack.o src/written_here.o src/worker_pool.o src/server_slots.o src/prewarm.o
DATA_built  = $(wildcard build/madlib_mop--*.sql)
PG_CPPFLAGS = -Wall

# pg_regress tests of the SQL surface: usage texts, errors, a tiny end-to-end.
REGRESS      = usage errors catalogs end_to_end training
REGRESS_OPTS = --inputdir=tests/regress --outputdir=build/regress \
               --load-extension=plpython3u

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
