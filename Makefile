# madlib_mop: set-up, extension build and install, the embedded server, demo and tests.
#
#   make demo     install what is missing, start the embedded PostgreSQL, run the demo
#   make test     the same set-up, the linter (make lint), then the whole test suite
#   make dsn      print the connection string in use:  psql "$(make -s dsn)"
#   make cluster  a coordinator and two segment servers on this machine (.cluster/):
#                 psql "$(make -s cluster-dsn)"; make cluster-stop; make cluster-kill-segment
#                 CLUSTER_NET=lan|wan: each segment server in a network namespace of its own
#                 behind a shaped link (madlib_mop.tools.cluster_net; root, iproute2)
#   make images   the Docker images (base from Debian's packages, then docker/Dockerfile)
#   make compose-up   the same topology as containers: psql "$(make -s compose-dsn)"
#   make test-containers   the tests on the compose cluster and on a testcontainers server
#   make docs     the documentation site in build/site/ (make docs-serve: on http://127.0.0.1:8000/)
#   make deb      the server side as a Debian package: build/deb/postgresql-15-madlib-mop_<version>-1_amd64.deb
#
# Every step is a stamp or an idempotent command, so a second `make demo` reinstalls nothing.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PG_MAJOR      := 15
PG_BINDIR     := /usr/lib/postgresql/$(PG_MAJOR)/bin
PG_CONFIG     ?= $(PG_BINDIR)/pg_config
# Debian packages the server needs (docker/Dockerfile's build stage installs them with `make install`).
APT_PACKAGES  := postgresql-$(PG_MAJOR) postgresql-plpython3-$(PG_MAJOR) postgresql-contrib postgresql-$(PG_MAJOR)-cron \
                 postgresql-server-dev-$(PG_MAJOR) gcc python3-venv make
# PL/Python embeds Debian's Python (3.11); the in-database runtime must be built for it.
SERVER_PYTHON := /usr/bin/python3
VENV          := $(CURDIR)/.venv
PY            := $(VENV)/bin/python
VERSION       := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
STAMPS        := .make
SQL_SOURCES   := $(sort $(wildcard sql/*.sql sql/upgrades/*.sql udf/*.py)) madlib_mop/tools/extension_build.py
PYTEST_ARGS   ?=
# `make test` runs the test modules in TEST_PROCESSES processes (pytest-xdist; a module's
# tests in one), each on an embedded server of its own; on a server MADLIB_MOP_DSN names,
# in one process (the tests count that server's sessions).  TEST_PROCESSES=0: one process.
TEST_PROCESSES ?= $(if $(MADLIB_MOP_DSN),0,2)
# The browser the dashboard's tests drive (headless); `make test` installs it.
BROWSER_PACKAGES := chromium chromium-driver
# Dependency groups installed into the runtime: the server's (TensorFlow, ...) always, the
# others for development (the Docker image installs the server's alone).
PIP_EXTRAS    ?= test,bench,client,docs
comma         := ,

.PHONY: help deps browser venv build install installcheck demo test lint docs docs-serve bench bench-cluster db-start db-stop db-status db-destroy dsn \
        cluster cluster-dsn cluster-stop cluster-status cluster-kill-segment cluster-destroy clean \
        docker-engine images compose-up compose-dsn compose-kill-segment compose-down test-containers deb

help:
	@echo "make demo | make test | make docs | make docs-serve | make lint | make installcheck | make bench | make dsn | make install | make db-start | make db-stop | make db-status | make db-destroy | make cluster | make cluster-dsn | make cluster-stop | make cluster-status | make cluster-kill-segment | make cluster-destroy | make images | make compose-up | make compose-dsn | make compose-kill-segment | make compose-down | make test-containers | make deb | make clean"

# ---- Debian packages (as root) ------------------------------------------------
# $(call install_debs,PACKAGES,TARGET,APT OPTIONS): install those of PACKAGES that are missing.
define install_debs
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" -ne 0 ]; then echo "missing Debian packages: $$missing; run 'sudo make $(2)'" >&2; exit 1; fi; \
	  echo "installing Debian packages: $$missing"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(3) $$missing; \
	fi
	@mkdir -p $(STAMPS) && touch $@
endef

deps: $(STAMPS)/apt
$(STAMPS)/apt: Makefile
	$(call install_debs,$(APT_PACKAGES),deps,)

# The dashboard's tests only: a browser without its recommended extras.
browser: $(STAMPS)/browser
$(STAMPS)/browser: Makefile
	$(call install_debs,$(BROWSER_PACKAGES),browser,--no-install-recommends)

# ---- the Python runtime: a virtual environment made from the server's Python ----
venv: $(STAMPS)/venv
$(STAMPS)/venv: pyproject.toml | $(STAMPS)/apt
	@test -x $(PY) || $(SERVER_PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[server$(if $(PIP_EXTRAS),$(comma)$(PIP_EXTRAS))]'
	@touch $@

# ---- the extension (PGXS: extension.mk) -------------------------------------------------
# build/ gets the SQL scripts generated from sql/ and udf/; PGXS compiles src/ against the
# server's headers (postgresql-server-dev) and installs the control file, the scripts and the
# library where the server looks for them.
PGXS_MAKE     := $(MAKE) --no-print-directory -f extension.mk PG_CONFIG=$(PG_CONFIG)
EXT_SCRIPTS   := build/madlib_mop--$(VERSION).sql

build: $(EXT_SCRIPTS) | $(STAMPS)/apt
	@$(PGXS_MAKE)

$(EXT_SCRIPTS) &: $(SQL_SOURCES) madlib_mop.control pyproject.toml | $(STAMPS)/venv
	$(PY) -m madlib_mop.tools.extension_build --version $(VERSION) --out build

# The extension folder is shared by every checkout on the machine, and the install script
# names this checkout's runtime: install whenever what is built differs from what is there.
# The package's bytecode is written for the server's Python too: a backend cannot write it
# (the checkout is not the server's user's), and compiling the modules a call imports took
# about 0.1 s of every new session's first call.
install: build
	@extdir=$$($(PG_CONFIG) --sharedir)/extension; libdir=$$($(PG_CONFIG) --pkglibdir); \
	for f in madlib_mop.control build/madlib_mop--*.sql madlib_mop.so; do \
	  case $$f in *.so) dir=$$libdir;; *) dir=$$extdir;; esac; \
	  cmp -s "$$f" "$$dir/$$(basename $$f)" || { \
	    if [ ! -w "$$dir" ]; then echo "cannot write $$dir: run 'sudo make install'" >&2; exit 1; fi; \
	    $(PGXS_MAKE) install >/dev/null && echo "installed madlib_mop $(VERSION) (PGXS)"; break; }; \
	done
	@$(SERVER_PYTHON) -m compileall -q madlib_mop

# pg_regress tests of the SQL surface (tests/regress), on the embedded server or the one
# MADLIB_MOP_DSN names, in a database of their own (contrib_regression).  pg_regress drops
# that database first: the idle worker sessions an earlier run left in it (kept for their
# role) are ended, as DROP DATABASE ... WITH (FORCE) would.
installcheck: install db-start
	@mkdir -p build/regress
	@eval "$$(PYTHONPATH=$(CURDIR) $(SERVER_PYTHON) -m madlib_mop.tools.embedded env)" && \
	  $(PG_BINDIR)/psql -X -q -d postgres -o /dev/null -c "SELECT pg_terminate_backend(pid) \
	    FROM pg_stat_activity WHERE datname = 'contrib_regression'" && \
	  $(PGXS_MAKE) installcheck || { cat build/regress/regression.diffs 2>/dev/null | head -100; exit 1; }

# ---- the embedded PostgreSQL (skipped when MADLIB_MOP_DSN names a server) --------
db-start: $(STAMPS)/apt
	@if [ -n "$$MADLIB_MOP_DSN" ]; then echo "using MADLIB_MOP_DSN; embedded server not started"; \
	else PYTHONPATH=$(CURDIR) $(SERVER_PYTHON) -m madlib_mop.tools.embedded start; fi

db-stop:
	@PYTHONPATH=$(CURDIR) $(SERVER_PYTHON) -m madlib_mop.tools.embedded stop

db-status:
	@PYTHONPATH=$(CURDIR) $(SERVER_PYTHON) -m madlib_mop.tools.embedded status

db-destroy:
	@PYTHONPATH=$(CURDIR) $(SERVER_PYTHON) -m madlib_mop.tools.embedded destroy

dsn:
	@PYTHONPATH=$(CURDIR) $(SERVER_PYTHON) -m madlib_mop.tools.embedded dsn

# ---- several servers on this machine (madlib_mop.tools.local_cluster) ---------------------
# off (the loopback), lan or wan: see madlib_mop/tools/cluster_net.py
CLUSTER_NET ?= off
cluster: $(STAMPS)/venv install
	@MADLIB_MOP_CLUSTER_NET=$(CLUSTER_NET) $(PY) -m madlib_mop.tools.local_cluster start

cluster-dsn:
	@PYTHONPATH=$(CURDIR) $(SERVER_PYTHON) -m madlib_mop.tools.local_cluster dsn

cluster-stop:
	@PYTHONPATH=$(CURDIR) $(SERVER_PYTHON) -m madlib_mop.tools.local_cluster stop

cluster-status:
	@MADLIB_MOP_CLUSTER_NET=$(CLUSTER_NET) PYTHONPATH=$(CURDIR) $(SERVER_PYTHON) -m madlib_mop.tools.local_cluster status

cluster-kill-segment:
	@PYTHONPATH=$(CURDIR) $(SERVER_PYTHON) -m madlib_mop.tools.local_cluster kill-segment

cluster-destroy:
	@PYTHONPATH=$(CURDIR) $(SERVER_PYTHON) -m madlib_mop.tools.local_cluster destroy

# ---- Docker: the engine, the images, the compose cluster (madlib_mop.tools.containers) ----
# Debian's engine (docker.io, started as root when none answers), compose (Debian's
# docker-compose where Docker's plugin is missing) and debootstrap for the base image: each
# installed only when missing and needed.
CONTAINERS      := PYTHONPATH=$(CURDIR) $(SERVER_PYTHON) -m madlib_mop.tools.containers
SEGMENT         ?= seg0

docker-engine:
	@$(CONTAINERS) engine

images: docker-engine
	@$(CONTAINERS) images

compose-up: images
	@$(CONTAINERS) compose-up

compose-dsn:
	@$(CONTAINERS) compose-dsn

compose-kill-segment:
	@$(CONTAINERS) compose-kill-segment $(SEGMENT)

compose-down:
	@$(CONTAINERS) compose-down

# The container tests (docs/docker.md): the several-servers tests on the compose cluster,
# then the server-side tests (security, upgrade, pg_cron, worker pool, MADlib's walkthroughs,
# the image's settings) on a testcontainers container of the project's image, and the Debian
# package in a fresh Debian 12 container.  Not part of `make test`.
CONTAINER_TESTS ?= tests/test_cluster.py tests/test_security.py tests/test_upgrade.py tests/test_scheduled.py \
                   tests/test_worker_pool.py tests/test_madlib_examples.py tests/test_image.py \
                   tests/test_debian_package.py
test-containers: $(STAMPS)/venv install images
	MADLIB_MOP_TEST_SERVER=container $(PY) -m pytest $(CONTAINER_TESTS) $(PYTEST_ARGS)

# ---- the Debian package (madlib_mop.tools.debian_package, debian/) -----------------
# Debian's tools for PostgreSQL extensions, as root when missing: debhelper, pg_buildext
# (postgresql-server-dev-all), dpkg-buildpackage.  DEB_REF: a git commit to package instead
# of the checkout (an earlier version's package).
DEB_PACKAGES  := debhelper postgresql-server-dev-all dpkg-dev
DEB_REF       ?=
$(STAMPS)/deb-tools: Makefile
	$(call install_debs,$(DEB_PACKAGES),deb,--no-install-recommends)

deb: $(STAMPS)/deb-tools
	@PYTHONPATH=$(CURDIR) $(SERVER_PYTHON) -m madlib_mop.tools.debian_package build $(if $(DEB_REF),--ref $(DEB_REF))

# ---- the two commands -------------------------------------------------------------
demo: $(STAMPS)/venv install db-start
	$(PY) -m madlib_mop.tools.demo

test: $(STAMPS)/venv $(STAMPS)/browser lint installcheck
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder --durations=15 $(PYTEST_ARGS)

# The linter ([tool.ruff] in pyproject.toml): mistakes pyflakes, pycodestyle and bugbear find.
lint: $(STAMPS)/venv
	$(PY) -m ruff check .

# Benchmarks: not part of the tests; each prints a markdown table.
# bench-cluster: W1 and packing on `make cluster` against the embedded server (about 25 min);
# BENCH_CLUSTER_ARGS="--workload W4 --rows 12500 --big-state-mb 1100" for W4 and a 1 GB state.
BENCH_CLUSTER_ARGS ?=
bench-cluster: install db-start
	MADLIB_MOP_CLUSTER_NET=$(CLUSTER_NET) $(PY) bench/bench_cluster.py $(BENCH_CLUSTER_ARGS)

# The documentation site (MkDocs): the pages of docs/, and the SQL reference and settings
# generated from sql/ and src/ as it is built; --strict fails on a broken link or anchor.
docs: $(STAMPS)/venv
	$(PY) -m mkdocs build --strict --quiet -f mkdocs.yml
	@echo "the documentation site: $(CURDIR)/build/site/index.html"

docs-serve: $(STAMPS)/venv
	$(PY) -m mkdocs serve --strict -f mkdocs.yml -a 127.0.0.1:8000

bench: install db-start
	$(PY) bench/bench_preprocessor.py
	$(PY) bench/bench_predict.py
	$(PY) bench/bench_mop.py
	$(PY) bench/bench_automl.py
	$(PY) bench/bench_worker_auth.py
	$(PY) bench/bench_caching.py
	$(PY) bench/bench_hop.py
	$(PY) bench/bench_coordinator.py
	$(PY) bench/bench_big_table.py
	$(PY) bench/bench_transfer.py
	$(PY) bench/bench_cycles.py
	$(PY) bench/bench_fusion.py
	$(PY) bench/bench_fused_jobs.py
	$(PY) bench/bench_prewarm.py

clean:
	-@$(PGXS_MAKE) clean
	rm -rf build $(STAMPS) .pytest_cache
