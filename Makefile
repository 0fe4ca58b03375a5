.PHONY: setup demo test test-fast test-unit test-integration test-e2e test-ray test-timing schemas
setup:
	scripts/setup.sh
demo:
	scripts/demo.sh
# Everything (the README's command and CI's): lint, types, import contracts, then the lanes:
# unit, integration and e2e side by side, timing alone. Budget: 10 minutes on 2 idle cores.
test:
	scripts/test.sh
# The edit-test loop: the same checks, then the unit lane (pure: no runs, no clock, no
# database). Budget: 60 s.
test-fast:
	scripts/test.sh fast
# One lane alone (PostgreSQL started for integration and e2e when its binaries are here).
test-unit:
	scripts/test.sh unit
test-integration:
	scripts/test.sh integration
test-e2e:
	scripts/test.sh e2e
test-ray:
	scripts/test.sh ray
test-timing:
	scripts/test.sh timing
# docs/schemas/ from the models (tests/unit/test_docs.py fails when they are stale).
schemas: setup
	.venv/bin/python scripts/schemas.py
