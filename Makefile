# The two entry points of the README. Each creates .venv when missing.
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-e2e test-docker test-faults lint proto dashboards docs

$(STAMP): pyproject.toml scripts/install.sh
	bash scripts/install.sh

demo: $(STAMP)
	bash scripts/main-job.sh

# Three worker processes of one CPU thread each on two cores (tests/conftest.py says why one thread): a worker
# spends part of its time waiting (a server starting, a timeout a test waits out), and a third keeps both cores
# busy meanwhile. Whole modules per worker, modules that share costly session fixtures on one worker, the longest
# first so that none starts last beside an idle worker (tests/common/scheduling.py).
# `$(VENV)/bin/python -m pytest -q -m "not e2e"` runs the same tests in one process.
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not e2e" -n 3 --dist loadfile --no-loadscope-reorder

# The whole commands end to end with every service and a vLLM engine (tests/e2e: `ragr1 demo --preset quick`
# through SFT and RL; `ragr1 up` + `ragr1 eval`, then `ragr1 up` SIGKILLed). Minutes each, so not part of
# `make test`; run before every stop.
test-e2e: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m e2e tests/e2e

# The CPU images (one per role) built and the compose stack run under a real Docker engine, checked as a user
# would (tests/docker/harness.py; long: the image builds, then PPO updates on CPUs). Not part of
# `make test`: it needs Docker (`apt-get install docker.io` as root) and minutes.
test-docker: $(STAMP)
	$(VENV)/bin/python -m tests.docker.harness

# A real PPO run on the local stack while the trainer, a rollout worker, a shard and Redis are killed and a
# worker paused; then every prompt accounted for from Redis and the checkpoints (tests/faults/harness.py).
# Not part of `make test`: two vLLM engines and minutes of training.
test-faults: $(STAMP)
	$(VENV)/bin/python -m tests.faults.harness

lint: $(STAMP)
	$(VENV)/bin/ruff check ragr1 tests bench deploy
	$(VENV)/bin/mypy

# Regenerates the Python stubs in ragr1/v1/ from proto/ (checked in; a test fails when stale).
proto: $(STAMP)
	$(VENV)/bin/python -m ragr1.protogen

# Rewrites deploy/grafana/dashboards/*.json from deploy/grafana/generate.py (a test fails when stale).
dashboards: $(STAMP)
	$(VENV)/bin/python deploy/grafana/generate.py

# Rewrites the generated pages under docs/reference/ (settings, Helm values, metrics, gRPC API) from their
# sources (a test fails when one is stale), then builds the site into site/ as `make test` does (--strict).
docs: $(STAMP)
	$(VENV)/bin/python -m ragr1.docgen
	$(VENV)/bin/mkdocs build --strict
