# Verification targets (issue 5): fuzz, chaos and end-to-end suites beyond their CI size.
# CI runs every suite at a bounded size through scripts/test.sh; these targets run more.
#   DPONE_SLOW=1            selects the @pytest.mark.slow variants (deselected otherwise)
#   DPONE_FUZZ_EXAMPLES=N   total fuzz cases (CI: 10,400)
#   DPONE_CHAOS_KILLS=N     crashes per chaos variant in `make chaos` (CI: 26)
.PHONY: fuzz fuzz-long chaos chaos-ci e2e negative verify scheduler image

PYTEST = .venv/bin/python -m pytest -p no:cacheprovider

fuzz:
	$(PYTEST) tests/fuzz -q

fuzz-long:
	DPONE_SLOW=1 DPONE_FUZZ_EXAMPLES=$${DPONE_FUZZ_EXAMPLES:-200000} $(PYTEST) tests/fuzz -q

chaos-ci:
	bash scripts/ensure_postgres.sh
	$(PYTEST) tests/chaos -q

chaos:
	bash scripts/ensure_postgres.sh
	DPONE_SLOW=1 DPONE_CHAOS_KILLS=$${DPONE_CHAOS_KILLS:-500} $(PYTEST) tests/chaos -q -s

e2e:
	bash scripts/ensure_postgres.sh
	$(PYTEST) tests/e2e -q -s

negative:
	bash scripts/ensure_postgres.sh
	$(PYTEST) tests/negative -q

verify: negative fuzz chaos-ci e2e

# The generated DAG under a real scheduler (LocalExecutor, Postgres metadata DB); in CI too.
scheduler:
	bash scripts/ensure_postgres.sh
	$(PYTEST) tests/scheduler -q

# The runtime image (deploy/Containerfile) built with podman and run; needs root, podman and
# debootstrap (apt-get install podman debootstrap); not in CI (building takes about a minute).
image:
	bash scripts/ensure_postgres.sh
	DPONE_SLOW=1 $(PYTEST) tests/image -q
